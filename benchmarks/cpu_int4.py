"""4-bit linears on the CPU: llmctl's int4 kernel (codes decoded as they are multiplied), the weight
dequantized once then a float GEMM, and the float32 weight through the packed GEMM the dense models use
(the memory-bound reference a 4-bit weight should beat at decoding's batch sizes), for SmolLM2-135M's
and an 8B model's shapes. Fastest of 20 calls, weights larger than the caches are cycled through.

    python benchmarks/cpu_int4.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from llmctl.engine.layers import cpu_gemm
from llmctl.kernels import cpu

SHAPES = {"SmolLM2 gate/up 576→3072": (576, 3072), "SmolLM2 down 1536→576": (1536, 576),
          "8B gate/up 4096→28672": (4096, 28672)}


def fastest(call, calls: int = 20) -> float:
    call()
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    print(f"int4 paths built: {', '.join(cpu.int4_isas())} (the first runs); torch threads {torch.get_num_threads()}")
    torch.manual_seed(0)
    for name, (k, n) in SHAPES.items():
        codes = cpu.pack_int4(torch.randint(0, 16, (n, k)))
        scales, offsets = torch.rand(n, k // 64) / 8, torch.randn(n, k // 64) / 8  # groups of 64
        weight = cpu.int4_dequantize(codes, scales, offsets)
        packed = cpu_gemm.pack_weight(weight)
        for rows in (1, 4, 8, 16, 32, 64):
            x = torch.randn(rows, k)
            kernel = fastest(lambda: cpu.int4_linear(x, codes, scales, offsets))
            once = fastest(lambda: F.linear(x, cpu.int4_dequantize(codes, scales, offsets)))
            dense = fastest(lambda: cpu_gemm.linear(x, weight, packed))
            print(f"{name}, {rows:2d} rows: int4 kernel {kernel * 1e3:7.3f} ms, dequantize + GEMM "
                  f"{once * 1e3:7.3f} ms, float32 packed {dense * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
