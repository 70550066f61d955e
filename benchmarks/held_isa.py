"""Holding a benchmark's engines to an older CPU's instructions on a newer CPU, as a stand-in for that CPU
(its caches and memory stay the machine's): the environment each held engine process starts with.

- avx2: torch (ATEN_CPU_CAPABILITY), oneDNN (ONEDNN_MAX_CPU_ISA) and MKL (MKL_ENABLE_INSTRUCTIONS) held to
  AVX2; llmctl's C++ kernels built with -march=haswell (LLMCTL_CPU_TARGET, their own build directory).
- avx512-bf16 (a Zen 4: AVX512-BF16, no AMX): oneDNN held to AVX512_CORE_BF16, llmctl's bfloat16 panels
  without AMX tiles (LLMCTL_AMX=0).
"""

from __future__ import annotations

HELD_TO: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "LLMCTL_CPU_TARGET": "haswell"},
    "avx512-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "LLMCTL_AMX": "0"},
}


def held_environment(isa: str) -> dict[str, str]:
    """The variables for `isa` ("native": none)."""
    return dict(HELD_TO.get(isa, {}))
