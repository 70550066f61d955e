"""Compile every Triton kernel ahead of time for real NVIDIA GPUs, on any machine.

Triton's wheel ships `ptxas`, so `triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`
makes a cubin without a GPU. That catches what the interpreter (TRITON_INTERPRET=1, which the CPU
tests use) accepts and a GPU refuses: a `tl.dot` dimension under 16, fp8 before sm_89, a tile that
needs more shared memory than the GPU has.

The cases come from the code that chooses them at run time: the engine's options
(`EngineConfig`'s dtypes and block sizes, `--kv-cache-dtype`), the launchers' own constexpr
builders (`attention.kernel_constexprs`, `kv_store.store_constexprs`, `w4a16.w4a16_constexprs`,
`w4a16_gemv.gemv_constexprs`, `fused_moe.moe_constexprs`, `fused_layers.norm_constexprs`) and
their tile choosers. A case the engine refuses on some GPU (`llmctl.kernels.limits`) must fail to
compile there, and every other case must compile: `tests/kernels/test_compile_check.py` holds both.

    python -m llmctl.kernels.compile_check --arch 80,89,90          # the table
    python -m llmctl.kernels.compile_check --arch 90 --full         # every head dim × group, not a cover
    python -m llmctl.kernels.compile_check --ci --json out.json     # what the test suite compiles
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmctl.kernels.fp8 import E4M3, E5M2, Fp8Format
from llmctl.kernels.limits import SUPPORTED_BLOCK_SIZES, attention_shared_bytes, kernel_refusal, shared_memory_limit

ARCHES = (80, 89, 90)
FLOAT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# head dims of the families served (64: Llama-2 7B, SmolLM; 80: Phi-2; 96: Phi-3; 128: Llama-3;
# 256: Gemma) and two under 16 (tests' tiny models); groups (query heads per KV head) from MHA to MQA
FP8_CACHES = ("fp8e4nv", "fp8e5")  # --kv-cache-dtype fp8 and fp8_e5m2, as Triton names their types
HEAD_DIMS = (8, 64, 80, 96, 128, 256)
GROUPS = (1, 3, 8, 16, 32, 71)


@dataclass(frozen=True)
class KernelCase:
    # attention | merge | store | rotary_store | w4a16 | dequantize | gemv_gptq | gemv_awq | fused_moe | rms_norm |
    # gated_activation | fp8 | fp8_dequantize | ssd_decode | delta_rule_decode | selective_scan_decode | conv_decode |
    # ssd_chunk | selective_scan_prompt | delta_rule_prompt
    kernel: str
    dtype: str  # the activations' (query's) dtype
    kv_dtype: str  # the cache's dtype (fp8e4nv for --kv-cache-dtype fp8, fp8e5 for fp8_e5m2); "" where there is none
    constexprs: tuple[tuple[str, object], ...]

    @property
    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.constexprs
                          if k not in ("DOT_PRECISION", "LIMIT", "MANTISSA", "MIN_EXPONENT"))
        kv = f" kv {self.kv_dtype}" if self.kv_dtype and self.kv_dtype != self.dtype else ""
        return f"{self.kernel} {self.dtype}{kv} {shown}"


@dataclass
class Outcome:
    case: KernelCase
    arch: int
    error: str | None  # None: compiled, and fits the GPU
    shared_bytes: int = 0
    seconds: float = 0.0
    refusal: str | None = field(default=None)  # what the engine says on this GPU instead of running it


def _fp8(kv_dtype: str) -> Fp8Format | None:
    """The fp8 cache format a Triton cache type names (None: a float cache)."""
    return {"fp8e4nv": E4M3, "fp8e5": E5M2}.get(kv_dtype)


def _case(kernel: str, dtype: str, kv_dtype: str, constexprs: dict) -> KernelCase:
    return KernelCase(kernel, dtype, kv_dtype, tuple(sorted(constexprs.items())))


def attention_cases(full: bool = False) -> list[KernelCase]:
    """Every dtype × KV dtype × block size × step kind (prefill, decode, split decode); the features
    (ALiBi, sliding window, soft-cap) on and off; head dims × groups. Without `full` the shapes are a
    cover (every head dim with groups 1, 16 and 71 — 16, 32 and 128 rows — for bf16 and fp32, at block
    size 16), since a program's tiles depend on element size, padded head dim and rows only."""
    from llmctl.kernels.attention import (
        MAX_SEGMENTS,
        SEGMENT_COUNTS,
        SEGMENTS,
        kernel_constexprs,
        padded_head_dim,
        program_rows,
    )

    kinds = [(d, d) for d in FLOAT_DTYPES] + [(d, "fp8e4nv") for d in FLOAT_DTYPES]
    steps = ((False, 1), (True, 1), (True, SEGMENTS))  # (decode only, segments)

    def case(dtype, kv, block_size, step, dim=64, group=4, features=False):
        decode_only, segments = step
        return _case("attention", dtype, kv, kernel_constexprs(
            dim=dim, block_size=block_size, group=group, rows=program_rows(group, decode_only), segments=segments,
            decode_only=decode_only, dtype=FLOAT_DTYPES[dtype], kv_fp8=_fp8(kv) is not None,
            window=features, alibi=features, softcap=features, key_limits=features, sinks=features,
            chunked=features))

    cases = [case(dtype, kv, block_size, step)
             for (dtype, kv), block_size, step in itertools.product(kinds, SUPPORTED_BLOCK_SIZES, steps)]
    cases += [case(dtype, kv, 16, step, features=True) for (dtype, kv), step in itertools.product(kinds, steps)]
    # e5m2 differs from e4m3 in the pointer's type only: each step kind at the default block size
    cases += [case(dtype, "fp8e5", 16, step) for dtype, step in itertools.product(FLOAT_DTYPES, steps)]
    shape_kinds = kinds if full else [("bf16", "bf16"), ("fp32", "fp32")]  # element sizes 2 and 4
    block_sizes = SUPPORTED_BLOCK_SIZES if full else (16,)
    for (dtype, kv), block_size, step, dim, group in itertools.product(
            shape_kinds, block_sizes, steps[:2], HEAD_DIMS, GROUPS if full else (1, 16, 71)):
        cases.append(case(dtype, kv, block_size, step, dim=dim, group=group))
    cases += [_case("merge", dtype, "", dict(HEAD_DIM=dim, PADDED_DIM=padded_head_dim(dim), SEGMENTS=SEGMENTS,
                                             SINKS=sinks))
              for dtype, dim, sinks in itertools.product(FLOAT_DTYPES, HEAD_DIMS, (False, True))]
    # the split counts choose_segments sizes by SM count: each one's merge, and the largest split's attention
    cases += [_case("merge", dtype, "", dict(HEAD_DIM=128, PADDED_DIM=128, SEGMENTS=segments, SINKS=False))
              for dtype, segments in itertools.product(FLOAT_DTYPES, SEGMENT_COUNTS)]
    cases += [case(dtype, dtype, 16, (True, MAX_SEGMENTS), dim=128) for dtype in FLOAT_DTYPES]
    return list(dict.fromkeys(cases))


def store_cases() -> list[KernelCase]:
    from llmctl.kernels.kv_store import store_constexprs

    return [_case("store", dtype, kv, store_constexprs(kv_heads * dim, _fp8(kv)))
            for dtype in FLOAT_DTYPES for kv in (dtype, *FP8_CACHES) for kv_heads, dim in ((1, 8), (8, 128), (2, 80))]


def w4a16_cases() -> list[KernelCase]:
    """Decode and prefill row counts, group sizes 32/64/128 and act-order, 4-bit GPTQ and AWQ and 8-bit GPTQ,
    as `choose_tiles` picks."""
    from llmctl.kernels.w4a16 import DEQUANTIZE_ABOVE_ROWS, choose_tiles, dequantize_constexprs, w4a16_constexprs

    cases = []
    for dtype, (method, bits), group_size, act_order in itertools.product(
            FLOAT_DTYPES, (("gptq", 4), ("awq", 4), ("gptq", 8)), (32, 64, 128), (False, True)):
        if act_order and method == "awq":
            continue
        element_bytes = FLOAT_DTYPES[dtype].itemsize
        for rows in (1, 16, 64, DEQUANTIZE_ABOVE_ROWS):
            tiles = choose_tiles(rows, 4096, group_size, act_order, method == "awq", element_bytes)
            cases.append(_case("w4a16", dtype, "", w4a16_constexprs(tiles, method, group_size, FLOAT_DTYPES[dtype],
                                                                    bits)))
        tiles = choose_tiles(DEQUANTIZE_ABOVE_ROWS + 1, 4096, group_size, act_order, method == "awq", element_bytes)
        cases.append(_case("dequantize", dtype, "", dequantize_constexprs(tiles, method, group_size, bits)))
    return list(dict.fromkeys(cases))


def gemv_cases() -> list[KernelCase]:
    """The one-row GEMV, split and not, as `choose_gemv_tiles` picks for an H100's 132 multiprocessors."""
    from llmctl.kernels.w4a16_gemv import GEMV_MAX_ROWS, choose_gemv_tiles, gemv_applies, gemv_constexprs

    cases = []
    for dtype, (method, bits), group_size, rows, (inner, cols) in itertools.product(
            FLOAT_DTYPES, (("gptq", 4), ("awq", 4), ("gptq", 8)), (32, 64, 128), range(1, GEMV_MAX_ROWS + 1),
            ((4096, 14336), (14336, 4096), (4096, 151936))):  # the last: enough programs not to split
        if gemv_applies(rows, group_size, act_order=False):
            tiles = choose_gemv_tiles(rows, inner, cols, group_size, method == "awq", multiprocessors=132)
            cases.append(_case(f"gemv_{method}", dtype, "", gemv_constexprs(tiles, method, group_size, bits)))
    return list(dict.fromkeys(cases))


def moe_cases() -> list[KernelCase]:
    """The fused-MoE grouped GEMM at decode, mid and prefill pair counts (16/32/64-row blocks), both launches; with
    experts' biases (gpt-oss) at the mid count (the bias adds one load per tile, whatever the block), and so its
    MXFP4 experts (kv dtype u8: the weights' bytes)."""
    from llmctl.kernels.fused_moe import choose_moe_tiles, moe_constexprs

    cases = []
    for dtype, pairs, weighted, biased in itertools.product(FLOAT_DTYPES, (16, 512, 8192), (False, True),
                                                            (False, True)):
        if biased and pairs != 512:
            continue
        tiles = choose_moe_tiles(pairs, 8, FLOAT_DTYPES[dtype].itemsize)
        cases.append(_case("fused_moe", dtype, "", moe_constexprs(tiles, weighted, FLOAT_DTYPES[dtype], biased)))
        if biased:  # gpt-oss's MXFP4 experts, decoded in registers
            cases.append(_case("fused_moe", dtype, "u8", moe_constexprs(tiles, weighted, FLOAT_DTYPES[dtype], True,
                                                                        mxfp4=True)))
    return list(dict.fromkeys(cases))


def fused_layer_cases() -> list[KernelCase]:
    """RMSNorm as the layers call it (hidden size with the residual, Llama's and Gemma's forms; a head's QK-norm)
    and the gated activations at an 8B model's intermediate size."""
    from llmctl.kernels.fused_layers import activation_constexprs, norm_constexprs

    norms = [norm_constexprs(4096, False, True), norm_constexprs(4096, True, True), norm_constexprs(128, False, False)]
    activations = [activation_constexprs(14336, False), activation_constexprs(14336, True)]
    return [_case(kernel, dtype, "", constexprs) for dtype in FLOAT_DTYPES
            for kernel, cases in (("rms_norm", norms), ("gated_activation", activations)) for constexprs in cases]


def rotary_store_cases() -> list[KernelCase]:
    """RoPE + KV store at an 8B model's heads (and fp8 caches), a partial rotary, odd head counts."""
    from llmctl.kernels.rotary_store import rotary_constexprs

    shapes = ((32, 8, 128, 128), (14, 2, 64, 64), (32, 32, 96, 32))  # heads, KV heads, head dim, rotary
    return [_case("rotary_store", dtype, kv, rotary_constexprs(*shape, _fp8(kv)))
            for dtype in FLOAT_DTYPES for kv in (dtype, *FP8_CACHES) for shape in shapes]


def fp8_cases() -> list[KernelCase]:
    """The FP8 W8A16 GEMM at decode and mid row counts with 128-wide scale blocks and per-channel scales (a K that
    the 64-deep tiles do not divide: scales per element), and its dequantize kernel for prefill."""
    from llmctl.kernels.fp8_w8a16 import fp8_constexprs, fp8_dequantize_constexprs

    cases = [_case("fp8", dtype, "", fp8_constexprs(rows, scale_k, FLOAT_DTYPES[dtype]))
             for dtype, rows, scale_k in itertools.product(FLOAT_DTYPES, (1, 16, 128), (128, 4000))]
    cases += [_case("fp8_dequantize", dtype, "", fp8_dequantize_constexprs(scale_k))
              for dtype, scale_k in itertools.product(FLOAT_DTYPES, (128, 4000))]
    return list(dict.fromkeys(cases))


def recurrent_cases() -> list[KernelCase]:
    """The recurrent layers' decode kernels at the published shapes (Mamba2: Codestral's and Nemotron-H's heads and
    groups; the gated DeltaNet's 128 × 128 heads; Mamba (1): Falcon-Mamba-7B's 8192 channels), their states in
    float32 (mamba_ssm_cache_dtype) and in the model's dtype; the convolution's step (Codestral's 10,240 channels
    with a bias, Qwen3-Next's 8,192 without); Mamba2's prompt scan within chunks (head dims 64, 80), Mamba (1)'s
    (Falcon-Mamba-7B's channels) and the delta rule's (128 × 128 heads)."""
    from llmctl.kernels import recurrent_decode as decode
    from llmctl.kernels import recurrent_prefill as prompt

    states = ("fp32", "bf16")
    cases = [_case("ssd_decode", dtype, state, decode.ssd_constexprs(*shape)) for dtype in FLOAT_DTYPES
             for state in states for shape in ((64, 128, 16), (80, 128, 16), (64, 64, 18))]
    cases += [_case("delta_rule_decode", dtype, state, decode.delta_rule_constexprs(128, 128))
              for dtype in FLOAT_DTYPES for state in states]
    cases += [_case("selective_scan_decode", "fp32", state, decode.selective_scan_constexprs(8192, 16))
              for state in states]
    cases += [_case("conv_decode", dtype, dtype, decode.conv_constexprs(channels, 4, biased))
              for dtype in FLOAT_DTYPES for channels, biased in ((10240, True), (8192, False))]
    cases += [_case("ssd_chunk", "fp32", "", prompt.chunk_constexprs(head_dim)) for head_dim in (64, 80)]
    cases += [_case("selective_scan_prompt", "fp32", "", prompt.scan_constexprs(8192, 16))]
    cases += [_case("delta_rule_prompt", "fp32", "", prompt.delta_rule_constexprs(128, 128))]
    return cases


def all_cases(full: bool = False) -> list[KernelCase]:
    return (attention_cases(full) + store_cases() + w4a16_cases() + gemv_cases() + moe_cases() + fused_layer_cases()
            + rotary_store_cases() + fp8_cases() + recurrent_cases())


def _kernel_and_types(case: KernelCase) -> tuple[object, dict[str, str]]:
    """The jit function and the types of its runtime arguments (pointers by what the launcher passes)."""
    from llmctl.kernels import attention, fp8_w8a16, fused_layers, fused_moe, kv_store, rotary_store, w4a16, w4a16_gemv

    act, kv = f"*{case.dtype}", f"*{case.kv_dtype}" if case.kv_dtype else ""
    if case.kernel == "attention":
        return attention._attention_kernel, dict(
            out_ptr=act, partial_ptr="*fp32", max_ptr="*fp32", sum_ptr="*fp32", used_ptr="*i32", q_ptr=act, kv_ptr=kv,
            tables_ptr="*i32", lens_ptr="*i32", starts_ptr="*i32", block_seq_ptr="*i32", block_first_ptr="*i32",
            slopes_ptr="*fp32", limits_ptr="*i32", sinks_ptr="*fp32")
    if case.kernel == "merge":
        return attention._merge_kernel, dict(out_ptr=act, partial_ptr="*fp32", max_ptr="*fp32", sum_ptr="*fp32",
                                             used_ptr="*i32", sinks_ptr="*fp32")
    if case.kernel == "rms_norm":
        return fused_layers._rms_norm_kernel, dict(out_ptr=act, x_ptr=act, residual_ptr=act, weight_ptr=act)
    if case.kernel == "gated_activation":
        return fused_layers._gated_activation_kernel, dict(out_ptr=act, fused_ptr=act)
    if case.kernel == "rotary_store":
        return rotary_store._rotary_store_kernel, dict(out_ptr=act, q_ptr=act, k_ptr=act, v_ptr=act, cos_ptr=act,
                                                       sin_ptr=act, cache_ptr=kv, slot_ptr="*i64")
    if case.kernel == "store":
        return kv_store._store_kernel, dict(key_ptr=act, value_ptr=act, cache_ptr=kv, slot_ptr="*i64")
    if case.kernel == "fused_moe":
        mxfp4 = dict(case.constexprs)["MXFP4"]
        return fused_moe._fused_moe_kernel, dict(a_ptr=act, b_ptr="*u8" if mxfp4 else act, out_ptr=act,
                                                 routing_ptr="*fp32", bias_ptr=act, scales_ptr="*u8" if mxfp4 else act,
                                                 sorted_ids_ptr="*i32", block_expert_ptr="*i32", total_ptr="*i32")
    if case.kernel == "ssd_chunk":
        from llmctl.kernels import recurrent_prefill

        return recurrent_prefill._within_chunks_kernel, dict(cb_ptr="*fp32", cumsum_ptr="*fp32", xdt_ptr="*fp32",
                                                       y_ptr="*fp32")
    if case.kernel == "selective_scan_prompt":
        from llmctl.kernels import recurrent_prefill

        return recurrent_prefill._selective_scan_kernel, {f"{name}_ptr": "*fp32" for name in
                                                          ("x", "dt", "a", "b", "c", "d", "states", "y")}
    if case.kernel == "delta_rule_prompt":
        from llmctl.kernels import recurrent_prefill

        return recurrent_prefill._delta_rule_kernel, {f"{name}_ptr": "*fp32" for name in
                                                      ("q", "k", "v", "g", "beta", "states", "y")}
    if case.kernel.endswith("_decode") and case.kernel != "fp8_dequantize":
        return _recurrent_kernel_and_types(case)
    if case.kernel == "fp8":
        return fp8_w8a16._fp8_kernel, dict(x_ptr=act, qweight_ptr="*u8", scales_ptr="*fp32", out_ptr=act)
    if case.kernel == "fp8_dequantize":
        return fp8_w8a16._fp8_dequantize_kernel, dict(qweight_ptr="*u8", scales_ptr="*fp32", out_ptr=act)
    packed = dict(qweight_ptr="*i32", qzeros_ptr="*i32", scales_ptr="*fp16", g_idx_ptr="*i32")
    if case.kernel.startswith("gemv_"):
        kernel = w4a16_gemv._gemv_awq_kernel if case.kernel == "gemv_awq" else w4a16_gemv._gemv_gptq_kernel
        atomic = dict(case.constexprs)["SPLIT"] and not dict(case.constexprs)["LAST_SUMS"]
        return kernel, dict(packed, x_ptr=act, out_ptr="*fp32" if atomic else act, partial_ptr="*fp32",
                            count_ptr="*i32")
    if case.kernel == "w4a16":
        return w4a16._w4a16_kernel, dict(packed, x_ptr=act, out_ptr="*fp32" if dict(case.constexprs)["SPLIT"] else act)
    return w4a16._dequantize_kernel, dict(packed, out_ptr=act)


def _recurrent_kernel_and_types(case: KernelCase) -> tuple[object, dict[str, str]]:
    from llmctl.kernels import recurrent_decode

    act, state, fp32 = f"*{case.dtype}", f"*{case.kv_dtype}", "*fp32"
    if case.kernel == "conv_decode":
        return recurrent_decode._conv_decode_kernel, dict(windows_ptr=state, slots_ptr="*i64", x_ptr=act, w_ptr=fp32,
                                                          bias_ptr=fp32, out_ptr=fp32)
    common = dict(states_ptr=state, slots_ptr="*i64", y_ptr=fp32)
    if case.kernel == "ssd_decode":
        return recurrent_decode._ssd_decode_kernel, dict(common, x_ptr=act, dt_ptr=act, a_ptr=fp32, b_ptr=act,
                                                         c_ptr=act, d_ptr=fp32, dt_bias_ptr=fp32)
    if case.kernel == "delta_rule_decode":
        return recurrent_decode._delta_rule_decode_kernel, dict(common, q_ptr=fp32, k_ptr=fp32, v_ptr=act,
                                                                g_ptr=fp32, beta_ptr=fp32)
    return recurrent_decode._selective_scan_decode_kernel, dict(common, x_ptr=fp32, dt_ptr=fp32, a_ptr=fp32,
                                                                b_ptr=fp32, c_ptr=fp32, d_ptr=fp32)


def _scalar_type(name: str) -> str:
    floats = ("scale", "softcap", "k_scale", "v_scale", "k_inverse", "v_inverse", "eps", "dt_min", "dt_max")
    return "fp32" if name in floats else "i32"


def compiled_kernel(case: KernelCase, arch: int, aligned: bool = False, **options):
    """Triton's CompiledKernel for this case and target (its `asm["ptx"]`, `metadata.shared`). `aligned`:
    as the launcher's JIT specializes it when every pointer and integer is a multiple of 16 (Llama's
    shapes), which lets loads vectorize; `options`: num_warps, num_stages."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, pointers = _kernel_and_types(case)
    constexprs = dict(case.constexprs)
    signature = {name: "constexpr" if name in constexprs else pointers.get(name) or _scalar_type(name)
                 for name in inspect.signature(kernel.fn).parameters}
    attrs = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values())
             if aligned and (kind.startswith("*") or kind == "i32")}
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=options or None)


def compile_case(case: KernelCase, arch: int) -> Outcome:
    started = time.perf_counter()
    try:
        compiled = compiled_kernel(case, arch)
    except Exception as exc:  # Triton's compile errors have no common base class
        return Outcome(case, arch, _first_line(exc), seconds=time.perf_counter() - started)
    shared = compiled.metadata.shared
    limit = shared_memory_limit(arch)
    error = None if shared <= limit else f"needs {shared:,} bytes of shared memory; sm_{arch} has {limit:,}"
    return Outcome(case, arch, error, shared, time.perf_counter() - started)


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if "error" in line.lower() or "assert" in line.lower()]
    return f"{type(exc).__name__}: {(useful or lines or [''])[-1][:200]}"


def _compile_pair(pair: tuple[KernelCase, int]) -> Outcome:
    case, arch = pair
    outcome = compile_case(case, arch)
    constexprs = dict(case.constexprs)
    shape = (constexprs["PADDED_DIM"], constexprs["ROWS"]) if case.kernel == "attention" else (0, 0)
    outcome.refusal = kernel_refusal(arch, case.dtype, case.kv_dtype, *shape)
    return outcome


def all_pairs(arches: tuple[int, ...], full: bool = False) -> list[tuple[KernelCase, int]]:
    return [(case, arch) for arch in arches for case in all_cases(full)]


def ci_pairs() -> list[tuple[KernelCase, int]]:
    """The test suite's share (a few minutes on two cores; the full set is a quarter of an hour): bfloat16
    and float32 cases for sm_90 that take every value of every constexpr at least once, largest tiles first;
    for sm_80 and sm_89 the largest tile of each kernel × dtype × KV dtype (what their shared memory and fp8
    support decide); float16 only on sm_80, its largest tiles (it compiles as bfloat16 does)."""
    cases = all_cases()
    pairs = [(case, 90) for dtype in ("bf16", "fp32") for case in _covering([c for c in cases if c.dtype == dtype])]
    for arch in (80, 89):
        seen: set[tuple[str, str, str]] = set()
        for case in sorted(cases, key=lambda c: -_tile_bytes(c)):
            key = (case.kernel, case.dtype, case.kv_dtype)
            if key not in seen and (arch == 80 or case.dtype != "fp16"):
                seen.add(key)
                pairs.append((case, arch))
    return pairs


def _covering(cases: list[KernelCase]) -> list[KernelCase]:
    """Cases, largest tiles first, each kept only if it brings a kernel's constexpr value not yet taken."""
    taken: set[tuple[str, str, str, object]] = set()
    kept = []
    for case in sorted(cases, key=lambda c: -_tile_bytes(c)):
        values = {(case.kernel, case.kv_dtype, name, value) for name, value in case.constexprs}
        if not values <= taken:
            taken |= values
            kept.append(case)
    return kept


def _tile_bytes(case: KernelCase) -> int:
    c = dict(case.constexprs)
    if case.kernel == "attention":
        return attention_shared_bytes(c["PADDED_DIM"], c["ROWS"], c["KEY_TILE"], 4 if case.dtype == "fp32" else 2)
    return c.get("BLOCK_M", 1) * c.get("BLOCK_K", 0) + c.get("BLOCK_K", 0) * c.get("BLOCK_N", 0) + c.get("PADDED_DIM", 0)


def run(pairs: list[tuple[KernelCase, int]], workers: int | None = None) -> list[Outcome]:
    """Compile in worker processes. Triton decides at import whether kernels are interpreted, so this runs
    in a process where TRITON_INTERPRET is unset (the test suite starts the command in one)."""
    if os.environ.get("TRITON_INTERPRET") not in (None, "", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: the compile check compiles, it does not interpret")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated (it warns otherwise)
    with ProcessPoolExecutor(max_workers=workers or min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(_compile_pair, pairs, chunksize=4))


def mismatches(outcomes: list[Outcome]) -> list[str]:
    """Cases that fail where the engine would run them, or compile where the engine refuses them."""
    wrong = []
    for o in outcomes:
        if o.error and not o.refusal:
            wrong.append(f"sm_{o.arch} {o.case.label}: fails to compile and the engine does not refuse it: {o.error}")
        elif o.refusal and not o.error:
            wrong.append(f"sm_{o.arch} {o.case.label}: compiles, yet the engine refuses it ({o.refusal})")
    return wrong


def outcome_to_dict(outcome: Outcome) -> dict:
    return {"kernel": outcome.case.kernel, "dtype": outcome.case.dtype, "kv_dtype": outcome.case.kv_dtype,
            "constexprs": dict(outcome.case.constexprs), "arch": outcome.arch, "error": outcome.error,
            "refusal": outcome.refusal, "shared_bytes": outcome.shared_bytes, "seconds": round(outcome.seconds, 2)}


def print_table(outcomes: list[Outcome]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("kernel", "dtype", *(f"sm_{a}" for a in sorted({o.arch for o in outcomes})), "max shared", title=
                  "Triton kernels compiled ahead of time (cases: compiled / refused by the engine / failing)")
    groups: dict[tuple[str, str], dict[int, list[Outcome]]] = {}
    for o in outcomes:
        kv = o.case.kv_dtype if o.case.kv_dtype not in ("", o.case.dtype) else ""
        groups.setdefault((o.case.kernel, o.case.dtype + (f" · kv {kv}" if kv else "")), {}).setdefault(o.arch, []).append(o)
    for (kernel, dtype), by_arch in groups.items():
        cells = []
        for arch in sorted(by_arch):
            items = by_arch[arch]
            ok = sum(not o.error for o in items)
            refused = sum(bool(o.error and o.refusal) for o in items)
            failing = len(items) - ok - refused
            cells.append(f"{ok}" + (f" / {refused} refused" if refused else "") + (f" / [red]{failing} failing[/]" if failing else ""))
        shared = max(o.shared_bytes for items in by_arch.values() for o in items)
        table.add_row(kernel, dtype, *cells, f"{shared / 1024:.0f} KiB")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmctl.kernels.compile_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default=",".join(map(str, ARCHES)), help="compute capabilities, e.g. 80,89,90")
    parser.add_argument("--full", action="store_true", help="every head dim with every group (slower)")
    parser.add_argument("--ci", action="store_true", help="the test suite's share (ignores --arch)")
    parser.add_argument("--json", type=Path, help="also write every outcome to this file")
    parser.add_argument("--workers", type=int, default=None, help="compiler processes (default: up to 4)")
    args = parser.parse_args(argv)
    try:
        arches = tuple(int(a) for a in args.arch.split(","))
    except ValueError:
        print(f"--arch {args.arch!r}: give compute capabilities as numbers, e.g. 80,89,90", file=sys.stderr)
        return 2
    started = time.perf_counter()
    outcomes = run(ci_pairs() if args.ci else all_pairs(arches, args.full), args.workers)
    print_table(outcomes)
    if args.json:
        args.json.write_text(json.dumps([outcome_to_dict(o) for o in outcomes]))
    wrong = mismatches(outcomes)
    for line in wrong:
        print(line)
    print(f"{len(outcomes)} compilations in {time.perf_counter() - started:.0f} s; "
          f"{'all as the engine expects' if not wrong else f'{len(wrong)} not as the engine expects'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
