"""What a GPU would give each decode kernel, read from its sm_90 compilation on any machine (no GPU):
registers per thread and spills (`ptxas -v`, Triton's own ptxas), shared memory, and how the loop
loads memory — asynchronous copies (`cp.async`, a pipelined loop) or plain global loads, 16-byte
vector loads among them. Registers bound how many programs a multiprocessor holds (65,536 per SM),
and so how many loads are in flight: the figures behind docs/kernels.md's reading of the decode
attention and W4A16 GEMV timings, for the tilings `scripts/gpu-check.sh` sweeps.

    python benchmarks/kernel_resources.py            # Llama-3-8B decode shapes, bf16, as the JIT specializes them
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch

ARCH = 90
REGISTERS_PER_SM = 65_536


@dataclass(frozen=True)
class Resources:
    registers: int
    spilled_bytes: int
    shared_bytes: int
    async_copies: int
    global_loads: int
    vector_loads: int


def resources(case, num_warps: int, num_stages: int = 3) -> Resources:
    from triton.backends.nvidia.compiler import get_ptxas

    from llmctl.kernels.compile_check import compiled_kernel

    compiled = compiled_kernel(case, ARCH, aligned=True, num_warps=num_warps, num_stages=num_stages)
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        report = subprocess.run([get_ptxas(ARCH).path, f"-arch=sm_{ARCH}a", "-v", source.name, "-o", "/dev/null"],
                                capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spilled = sum(int(n) for n in re.findall(r"(\d+) bytes spill", report))
    return Resources(registers, spilled, compiled.metadata.shared, len(re.findall(r"cp\.async\.c", ptx)),
                     len(re.findall(r"ld\.global", ptx)), len(re.findall(r"ld\.global[.\w]*\.v4", ptx)))


def programs_per_sm(registers: int, num_warps: int) -> int:
    return REGISTERS_PER_SM // (registers * 32 * num_warps)


def show(label: str, found: Resources, num_warps: int) -> None:
    print(f"{label:<44} {found.registers:4} regs ({programs_per_sm(found.registers, num_warps)} programs/SM), "
          f"{found.spilled_bytes} B spilled, {found.shared_bytes:6,} B shared, {found.async_copies:3} cp.async, "
          f"{found.global_loads:3} ld.global ({found.vector_loads} of 16 B)", flush=True)


def main() -> None:
    from llmctl.kernels.attention import kernel_constexprs
    from llmctl.kernels.compile_check import _case
    from llmctl.kernels.w4a16_gemv import GemvTiles, gemv_constexprs

    print(f"sm_{ARCH}, bf16, Llama-3-8B decode shapes (32/8 heads × 128, block 16; MLP 4096 → 14,336, group 128)")
    for tile in (16, 32, 64):
        constexprs = kernel_constexprs(dim=128, block_size=16, group=4, rows=16, segments=16, decode_only=True,
                                       dtype=torch.bfloat16, kv_fp8=False, window=False, alibi=False, softcap=False,
                                       preferred_key_tile=tile)
        case = _case("attention", "bf16", "bf16", constexprs)
        show(f"decode attention, {tile}-key tiles, 3 stages", resources(case, 4), 4)
    for method, block_n in (("gptq", 128), ("awq", 256)):
        for stages in (1, 2, 3, 4):
            tiles = GemvTiles(block_n, 128, 8, 4, stages)
            case = _case(f"gemv_{method}", "bf16", "", gemv_constexprs(tiles, method, 128))
            show(f"GEMV {method} {block_n} × 128, {stages} stage{'s' if stages > 1 else ''}", resources(case, 4), 4)
        tiles = GemvTiles(block_n, 128, 8, split_sum="last")
        case = _case(f"gemv_{method}", "bf16", "", gemv_constexprs(tiles, method, 128))
        show(f"GEMV {method} {block_n} × 128, last split sums", resources(case, 4), 4)


if __name__ == "__main__":
    main()
