"""The C++ CPU kernels (kernels/cpu_*.cpp): built once per machine, then loaded from a cache.

`torch.utils.cpp_extension` compiles the source with the machine's C++ compiler (-O3,
-march=native, -ffast-math, OpenMP shared with torch's own runtime) into
`$LLMCTL_CACHE/cpu_kernels/<key>/llmctl_cpu.so`; the key covers the source, torch's version
and the CPU's instruction sets, so an edit, a torch upgrade or another CPU builds anew.
A cached library loads in milliseconds; `python -m llmctl.kernels.cpu` builds it ahead of
time (scripts/setup.sh does). The ops, each tested against a torch reference:

- `paged_attention` (sliding window, ALiBi, logit soft-cap), `store_kv` (cpu_attention.cpp): reference
  `llmctl.kernels.attention.paged_attention_reference`;
- `rms_norm` (with the residual add fused), `rotary`, `silu_and_mul`, `gelu_tanh_and_mul` (cpu_layers.cpp):
  references are the torch code in llmctl.engine.models (common, llama, gemma) and
  llmctl.engine.layers.positions;
- `pack_panels`, `panel_linear` (cpu_gemm.cpp, float32 on AVX-512 only): reference `F.linear`;
- `int4_linear` (cpu_int4.cpp, 4-bit weights kept packed; AVX-512, AVX2 and plain paths): reference the
  weight dequantized in torch;
- `int8_linear` (cpu_int8.cpp, signed byte codes with a scale and offset per group of 16+: GGUF's Q5/Q6/Q8
  types; the same three paths): reference the same;
- `ssd_decode`, `delta_rule_decode`, `selective_scan_decode`, `conv_decode` (cpu_recurrent.cpp, the recurrent
  layers' decode step in place in each state's slot): references llmctl.engine.layers.ssd.state_step,
  delta_rule.step_delta_rule, selective_scan.step, causal_conv.conv_step.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from pathlib import Path

import torch

from llmctl.cache import llmctl_cache_dir
from llmctl.kernels.build_tools import missing_tools

SOURCES = [Path(__file__).with_name(name)
           for name in ("cpu_attention.cpp", "cpu_layers.cpp", "cpu_gemm.cpp", "cpu_int4.cpp", "cpu_int8.cpp",
                        "cpu_q8.cpp", "cpu_decode_layer.cpp", "cpu_recurrent.cpp")]
HEADERS = [Path(__file__).with_name(name) for name in ("cpu_coded.h", "cpu_attention_avx2.h", "cpu_q8_quantize.h")]  # included: part of the build key
LIBRARY = "llmctl_cpu"
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp"]  # fast-math: vectorized exp (libmvec)
TARGET_ENV = "LLMCTL_CPU_TARGET"  # a gcc -march (haswell: AVX2/FMA only) for a build older CPUs can run too


def build_flags() -> list[str]:
    """FLAGS, for this CPU, or for LLMCTL_CPU_TARGET (its own build directory)."""
    target = os.environ.get(TARGET_ENV, "native")
    if target == "native":
        return FLAGS
    return [f"-march={target}" if flag == "-march=native" else flag for flag in FLAGS
            if flag != "-mprefer-vector-width=512"]


class CPUKernelsUnavailable(RuntimeError):
    """The C++ kernels cannot be built here (no compiler, no ninja); the message says what to install."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def build_directory() -> Path:
    key = hashlib.sha256(b"".join(s.read_bytes() for s in SOURCES + HEADERS) + torch.__version__.encode() + " ".join(build_flags()).encode()
                         + _cpu_flags().encode() + platform.machine().encode()).hexdigest()[:16]
    return llmctl_cache_dir() / "cpu_kernels" / key


@functools.cache
def load() -> None:
    """Load the ops, building them first if this machine has no cached build. Raises CPUKernelsUnavailable."""
    directory = build_directory()
    library = directory / f"{LIBRARY}.so"
    if library.exists():
        torch.ops.load_library(str(library))
        return
    missing = missing_tools()
    if missing:
        raise CPUKernelsUnavailable(f"cannot build llmctl's C++ CPU attention kernel: {missing}")
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    # cpp_extension runs `ninja` from PATH: the one installed in this environment may not be on it.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    try:
        cpp_extension.load(LIBRARY, [str(s) for s in SOURCES], extra_cflags=build_flags(), extra_ldflags=["-fopenmp"],
                           build_directory=str(directory), is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:
        raise CPUKernelsUnavailable(f"building llmctl's C++ CPU attention kernel failed: {exc}") from exc


@functools.cache
def unavailable_reason() -> str | None:
    """None when the ops load (building them if needed), else why not."""
    try:
        load()
    except CPUKernelsUnavailable as exc:
        return str(exc)
    return None


def fused_layers_for(x: torch.Tensor) -> bool:
    """Whether rms_norm, rotary and silu_and_mul can take this tensor: on the CPU, with the kernels built."""
    return x.device.type == "cpu" and unavailable_reason() is None


def paged_attention(out: torch.Tensor, query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    alibi_slopes: torch.Tensor | None = None, sliding_window: int | None = None,
                    softcap: float | None = None, sinks: torch.Tensor | None = None,
                    chunk: int | None = None) -> torch.Tensor:
    """Causal attention of flat queries [T, H, D] over each sequence's cached tokens, into `out`.
    block_tables [B, n], seq_lens [B] and query_start_loc [B + 1] are int32; `softcap`: scores =
    softcap · tanh(scores / softcap); `sinks` [H]: a logit per head in the softmax's denominator (gpt-oss);
    `chunk`: a query sees only the keys of its own aligned chunk of that many positions (Llama 4)."""
    load()
    slopes = alibi_slopes.float().contiguous() if alibi_slopes is not None else None
    sinks = sinks.float().contiguous() if sinks is not None else None
    torch.ops.llmctl_cpu.paged_attention(out, query, kv_cache, block_tables, seq_lens, query_start_loc, scale,
                                         slopes, sliding_window or 0, softcap or 0.0, sinks,
                                         chunk or 0)
    return out


def store_kv(kv_cache: torch.Tensor, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """New K/V [T, KVH, D] into slots [T] (int64, -1 skips) of kv_cache [blocks, block_size, 2, KVH, D]."""
    load()
    torch.ops.llmctl_cpu.store_kv(kv_cache, slots, key, value)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [rows, size]; with `residual`, x += residual first, in place (x is the new residual)."""
    load()
    out = torch.empty_like(x)
    torch.ops.llmctl_cpu.rms_norm(out, x, residual, weight, eps)
    return out


def rotary(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate-half RoPE in place on query [T, H, D] and key [T, KVH, D]; cos/sin [T, rotary]."""
    load()
    torch.ops.llmctl_cpu.rotary(query, key, cos, sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] of shape [M, 2I]."""
    load()
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype)
    torch.ops.llmctl_cpu.silu_and_mul(out, x)
    return out


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu(gate, tanh approximation) * up for x = [gate | up] of shape [M, 2I] (Gemma's GeGLU)."""
    load()
    out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype)
    torch.ops.llmctl_cpu.gelu_tanh_and_mul(out, x)
    return out


def panel_linear_supported() -> bool:
    """Whether float32 linears can take the AVX-512 panel kernel here (built, and the CPU has AVX-512)."""
    return built_for_avx512()


def bf16_panels_supported() -> bool:
    """Whether bfloat16 linears can take the panel kernel here (built with AVX512-BF16, which the CPU has)."""
    return unavailable_reason() is None and _cpu_has_avx512_bf16()


@functools.cache
def _cpu_has_avx512_bf16() -> bool:
    return bool(torch.ops.llmctl_cpu.bf16_panels_supported())


def built_for_avx512() -> bool:
    """Whether the kernels are built and were compiled for AVX-512: the panel GEMM, and the
    attention's float32 rows in registers, exist only then."""
    return unavailable_reason() is None and _cpu_has_avx512()


@functools.cache
def _cpu_has_avx512() -> bool:
    return bool(torch.ops.llmctl_cpu.panel_linear_supported())


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """A float32 [N, K] weight in panel_linear's layout [2 * ceil(N / 32), K, 16] (bfloat16, K even:
    the same shape, each pair of K's rows interleaved column by column)."""
    load()
    return torch.ops.llmctl_cpu.pack_panels(weight.detach().contiguous())


def panel_linear(x: torch.Tensor, panels: torch.Tensor, out_features: int,
                 bias: torch.Tensor | None = None, use_amx: bool = True, isa: str = "auto") -> torch.Tensor:
    """x Wᵀ + b for float32 or bfloat16 x [M, K], with W of x's dtype packed by pack_panels. bfloat16
    runs on AMX tiles where the CPU has them and K is a multiple of 32 (unless use_amx is False),
    else with AVX512-BF16 dot products; float32 on the widest of panel_isas() (or `isa`)."""
    return torch.ops.llmctl_cpu.panel_linear(x.contiguous(), panels, out_features, bias, use_amx, CODED_ISAS[isa])


def panel_isas() -> list[str]:
    """The float32 panel paths built here (the kernels are built for this CPU), widest first."""
    return [] if unavailable_reason() is not None else _built_panel_isas()


@functools.cache
def _built_panel_isas() -> list[str]:
    load()
    names = {code: name for name, code in CODED_ISAS.items()}
    return [names[code] for code in torch.ops.llmctl_cpu.panel_isas()]


@functools.cache
def bf16_amx_supported() -> bool:
    """Whether bfloat16 panel_linear runs on AMX tiles here (built for it, the CPU has it, Linux grants it)."""
    return bf16_panels_supported() and bool(torch.ops.llmctl_cpu.bf16_amx_supported())


CODED_ISAS = {"auto": 0, "plain": 1, "avx2": 2, "avx512": 3}


def int4_isas() -> list[str]:
    """The int4_linear paths built on this machine, widest first (what "auto" runs is the first)."""
    load()
    names = {code: name for name, code in CODED_ISAS.items()}
    return [names[code] for code in torch.ops.llmctl_cpu.int4_isas()]


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] (0..15, K a multiple of 32) as int4_linear reads them, [N, K / 2] uint8: in each
    32-code chunk, byte j holds code j (low nibble) and code j + 16 (high) — GGUF's Q4_0/Q4_1 order."""
    rows, k = codes.shape
    chunks = codes.to(torch.uint8).reshape(rows, k // 32, 2, 16)
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(rows, k // 2).contiguous()


def int4_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                bias: torch.Tensor | None = None, isa: str = "auto") -> torch.Tensor:
    """x Wᵀ + b for float32 x [M, K], W[n, k] = code · scale[n, k // group] + offset[n, k // group], the codes
    packed by pack_int4; scales and offsets [N, groups], both float32 or both float16."""
    load()
    return torch.ops.llmctl_cpu.int4_linear(x.contiguous(), codes, scales, offsets, bias, CODED_ISAS[isa])


def int4_dequantize(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] of int4_linear's operands."""
    load()
    return torch.ops.llmctl_cpu.int4_dequantize(codes, scales, offsets)


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                bias: torch.Tensor | None = None, isa: str = "auto") -> torch.Tensor:
    """x Wᵀ + b for float32 x [M, K], W[n, k] = code · scale[n, k // group] + offset[n, k // group]; codes int8
    [N, K], the group size a multiple of 16; scales and offsets [N, groups], both float32 or both float16."""
    load()
    return torch.ops.llmctl_cpu.int8_linear(x.contiguous(), codes, scales, offsets, bias, CODED_ISAS[isa])


def int8_dequantize(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] of int8_linear's operands."""
    load()
    return torch.ops.llmctl_cpu.int8_dequantize(codes, scales, offsets)


def q8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
              bias: torch.Tensor | None = None, isa: str = "auto", offsets_used: bool = True,
              per_token: bool = False) -> torch.Tensor:
    """int4_linear / int8_linear (by the codes' dtype) with x quantized to int8 in blocks of 32 as llama.cpp's
    Q8_0, the dot products taken in integers; groups of 32 (GGUF's blocks), or of 16 with int8 codes (Q6_K:
    each half block takes its group's scale). `offsets_used=False` skips the offsets (all zero, as Q8_0's).
    `per_token`: x quantized with one scale per row as compressed-tensors' dynamic int8 scheme (W8A8), for
    int8 codes in groups of 32 (a per-channel scale repeated), exactly as the library rounds it."""
    load()
    return torch.ops.llmctl_cpu.q8_linear(x.contiguous(), codes, scales, offsets, bias, CODED_ISAS[isa],
                                          offsets_used, per_token)


def q8_vnni() -> bool:
    """Whether q8_linear's avx512 path multiplies with AVX-512 VNNI (vpdpbusd) here."""
    load()
    return bool(torch.ops.llmctl_cpu.q8_vnni())


if __name__ == "__main__":
    reason = unavailable_reason()
    if reason:
        sys.exit(reason)
    print(f"llmctl C++ CPU kernels ready in {build_directory()}")


def ssd_decode(states: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor,
               b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, dt_bias: torch.Tensor,
               limit: tuple[float, float]) -> torch.Tensor:
    """Mamba2's decode step in place in `states` [slots, h, p, n] -> y [S, h, p] float32 (cpu_recurrent.cpp)."""
    load()
    y = torch.zeros(x.shape, dtype=torch.float32)  # zeros: padding rows (slot -1) are skipped
    f32 = [t.float().contiguous() for t in (x, dt, a, b, c, d, dt_bias)]
    torch.ops.llmctl_cpu.ssd_decode(states, slots, *f32, float(limit[0]), min(float(limit[1]), 3.0e38), y)
    return y


def conv_decode(windows: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """The causal convolution's decode step, each window [slots, C, K-1] shifted in place -> out [S, C] float32,
    as torch's step gives it (float32 weights promote) (cpu_recurrent.cpp)."""
    load()
    out = torch.zeros(x.shape, dtype=torch.float32)  # zeros: padding rows (slot -1) are skipped
    no_bias = torch.empty(0, dtype=torch.float32)
    torch.ops.llmctl_cpu.conv_decode(windows, slots, x.float().contiguous(), weight.float().contiguous(),
                                     bias.float().contiguous() if bias is not None else no_bias, out)
    return out


def delta_rule_decode(states: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The gated delta rule's decode step in place in `states` [slots, Hv, dk, dv] -> y [S, Hv, dv] float32."""
    load()
    y = torch.zeros(v.shape, dtype=torch.float32)  # zeros: padding rows (slot -1) are skipped
    torch.ops.llmctl_cpu.delta_rule_decode(states, slots, *[t.float().contiguous() for t in (q, k, v, g, beta)], y)
    return y


def selective_scan_decode(states: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                          a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Mamba (1)'s decode step in place in `states` [slots, I, n] -> y [S, I] float32."""
    load()
    y = torch.zeros(x.shape, dtype=torch.float32)  # zeros: padding rows (slot -1) are skipped
    torch.ops.llmctl_cpu.selective_scan_decode(states, slots, *[t.float().contiguous() for t in (x, dt, a, b, c, d)], y)
    return y
