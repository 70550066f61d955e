"""Every Triton kernel compiled ahead of time for real NVIDIA GPUs (sm_80, sm_89, sm_90) on this CPU
machine, with Triton's own ptxas: what fails to compile must be what the engine refuses on that GPU,
and everything else must compile. The interpreter the other kernel tests run under accepts what a
GPU refuses (a tl.dot under 16, fp8 on Ampere); this does not. The compiler runs in its own process,
where TRITON_INTERPRET is unset (Triton reads it once, at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llmctl.kernels.attention import MAX_SEGMENTS, SEGMENT_COUNTS, SEGMENTS
from llmctl.kernels.compile_check import ARCHES, all_cases
from llmctl.kernels.limits import SUPPORTED_BLOCK_SIZES, kernel_refusal

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


def compiling_python(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_every_kernel_compiles_where_the_engine_runs_it(tmp_path):
    result = compiling_python("-m", "llmctl.kernels.compile_check", "--ci", "--json", str(tmp_path / "out.json"))
    outcomes = json.loads((tmp_path / "out.json").read_text())
    assert {o["arch"] for o in outcomes} == set(ARCHES)
    assert {o["kernel"] for o in outcomes} == {"attention", "merge", "store", "w4a16", "dequantize", "gemv_gptq",
                                                 "gemv_awq", "fused_moe", "rms_norm", "gated_activation", "rotary_store",
                                                 "fp8", "fp8_dequantize", "ssd_decode", "delta_rule_decode",
                                                 "selective_scan_decode", "ssd_chunk", "selective_scan_prompt",
                                                 "conv_decode", "delta_rule_prompt"}
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]  # no case the engine gets wrong
    failed = [o for o in outcomes if o["error"]]
    assert failed and all(o["refusal"] for o in failed)
    fp8 = {(o["arch"], o["kv_dtype"]) for o in failed if "8.9 or newer" in o["refusal"]}
    assert fp8 == {(80, "fp8e4nv")}  # e4m3 needs sm_89
    too_large = {(o["arch"], o["dtype"], o["constexprs"]["PADDED_DIM"]) for o in failed if "shared memory" in o["refusal"]}
    assert too_large == {(80, "fp32", 256), (89, "fp32", 256)}  # sm_90 holds even these
    print(f"compiled {len(outcomes) - len(failed)} kernel cases for sm_{', sm_'.join(map(str, ARCHES))}; "
          f"{len(failed)} fail where the engine refuses them (fp8 on sm_80, float32 head dim 256 on sm_80/89)")


def test_the_cases_are_what_the_launchers_build():
    cases = all_cases()
    attention = [dict(c.constexprs) for c in cases if c.kernel == "attention"]
    assert {c["BLOCK_SIZE"] for c in attention} == set(SUPPORTED_BLOCK_SIZES)
    assert {c["SEGMENTS"] for c in attention} == {1, SEGMENTS, MAX_SEGMENTS}
    assert {c["KV_FP8"] for c in attention} == {True, False}
    merge = [dict(c.constexprs) for c in cases if c.kernel == "merge"]
    assert {c["SEGMENTS"] for c in merge} == {SEGMENTS, *SEGMENT_COUNTS}  # every split choose_segments returns
    assert all(c["KEY_TILE"] >= 16 and c["PADDED_DIM"] >= 16 and c["ROWS"] >= 16 for c in attention)
    assert {(c["ALIBI"], c["WINDOW"], c["SOFTCAP"]) for c in attention} == {(False,) * 3, (True,) * 3}
    w4a16 = [dict(c.constexprs) for c in cases if c.kernel == "w4a16"]
    assert {c["AWQ"] for c in w4a16} == {True, False} and {c["SPLIT"] for c in w4a16} == {True, False}
    assert {c["UNIFORM_GROUPS"] for c in w4a16} == {True, False}  # act-order GPTQ reads g_idx per row
    assert {(c["AWQ"], c["BITS"]) for c in w4a16} == {(False, 4), (True, 4), (False, 8)}
    gemv = [(c.kernel, dict(c.constexprs)) for c in cases if c.kernel.startswith("gemv_")]
    assert {(kernel, c["BITS"]) for kernel, c in gemv} == {("gemv_gptq", 4), ("gemv_awq", 4), ("gemv_gptq", 8)}
    assert {c["SPLIT"] for _, c in gemv} == {True, False} and {c["GROUP_SIZE"] for _, c in gemv} == {32, 64, 128}


CHECK_EIGHT_KEY_TILE = """
import dataclasses, json
from llmctl.kernels.compile_check import all_cases, compile_case
case = next(c for c in all_cases() if c.kernel == "attention" and c.dtype == "bf16" and c.kv_dtype == "bf16"
            and dict(c.constexprs)["BLOCK_SIZE"] == 8)
eight = dataclasses.replace(case, constexprs=tuple((k, 8 if k == "KEY_TILE" else v) for k, v in case.constexprs))
print(json.dumps([compile_case(case, 90).error, compile_case(eight, 90).error]))
"""


def test_a_dot_under_sixteen_fails_to_compile_for_a_gpu():
    """The class of error this check exists for: block size 8 used to give the PV tl.dot K = 8, which the
    interpreter runs and ptxas refuses. Forcing an 8-key tile shows the check sees it."""
    result = compiling_python("-c", CHECK_EIGHT_KEY_TILE, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    as_chosen, eight_keys = json.loads(result.stdout.strip().splitlines()[-1])
    assert as_chosen is None and eight_keys is not None


def test_the_engine_refusals_in_one_line():
    assert "compute capability 8.9 or newer" in kernel_refusal(80, "bf16", "fp8e4nv")
    assert kernel_refusal(89, "bf16", "fp8e4nv") is None and kernel_refusal(90, "fp16", "fp8e4nv") is None
    assert "use --dtype bfloat16" in kernel_refusal(80, "fp32", "fp32", padded_dim=256, rows=128)
    assert kernel_refusal(90, "fp32", "fp32", padded_dim=256, rows=128) is None


@pytest.mark.parametrize("arch", [75, 120])
def test_gpus_outside_the_compiled_targets_get_the_closest_limits(arch):
    assert kernel_refusal(arch, "bf16", "bf16", padded_dim=128, rows=64) is None



CHECK_W4A16_LOADS = """
import json, re, torch
from llmctl.kernels.compile_check import _case, compiled_kernel
from llmctl.kernels.w4a16 import choose_tiles, w4a16_constexprs
from llmctl.kernels.w4a16_gemv import GemvTiles, gemv_constexprs
ptx = lambda case, **options: compiled_kernel(case, 90, aligned=True, **options).asm["ptx"]
count = lambda pattern, text: len(re.findall(pattern, text))
found = {}
for method in ("gptq", "awq"):
    for stages in (1, 3):
        gemv = ptx(_case(f"gemv_{method}", "bf16", "", gemv_constexprs(GemvTiles(128, 128, 8, 4, stages), method, 128)))
        found[f"gemv {method} {stages}"] = dict(copies=count(r"cp[.]async[.]c", gemv),
                                                 vector_loads=count(r"ld[.]global[.\\w]*[.]v4", gemv))
for method in ("gptq", "awq"):
    last = GemvTiles(128, 128, 8, split_sum="last")
    summing = ptx(_case(f"gemv_{method}", "bf16", "", gemv_constexprs(last, method, 128)))
    found[f"gemv {method} last"] = sorted(set(re.findall(r"atom[.][.\\w]*", summing)))
tiles = choose_tiles(16, 4096, 128, False, True, 2)
cores = ptx(_case("w4a16", "bf16", "", w4a16_constexprs(tiles, "awq", 128, torch.bfloat16, 4)), num_warps=tiles.num_warps)
found["tensor-core awq"] = dict(wide_copies=count(r"cp[.]async[.]cg", cores), narrow_copies=count(r"cp[.]async[.]ca", cores))
print(json.dumps(found))
"""


def test_w4a16_kernels_load_their_packed_words_as_a_gpu_wants():
    """Read from the sm_90 code, as the launcher's JIT specializes Llama's shapes (every size a multiple of 16):
    `GemvTiles.num_stages` > 1 really pipelines the GEMV's K loop (asynchronous copies into shared memory,
    what the GPU sweep times) and 1 does not (the engine's measured kernel); `split_sum="last"` counts
    finished splits with a device-wide acquire-release atomic; AWQ's packed words load 16
    bytes at a time in the GEMV and are copied 16 bytes at a time in the tensor-core kernel (a mask bound of
    cdiv(N, 8) hid N's alignment: 4-byte loads, and 51 narrow copies against 6 wide ones)."""
    result = compiling_python("-c", CHECK_W4A16_LOADS, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["gemv gptq 1"]["copies"] == found["gemv awq 1"]["copies"] == 0
    assert found["gemv gptq 3"]["copies"] > 0 and found["gemv awq 3"]["copies"] > 0
    assert found["gemv gptq 1"]["vector_loads"] > 0 and found["gemv awq 1"]["vector_loads"] > 0
    assert found["tensor-core awq"]["wide_copies"] > found["tensor-core awq"]["narrow_copies"]
    for method in ("gptq", "awq"):  # the last split program's count: device-wide, releasing the partials
        assert "atom.global.gpu.acq_rel.add.u32" in found[f"gemv {method} last"]
