"""CPU linears: torch's plain F.linear against the oneDNN-packed path llmctl uses
(llmctl.engine.layers.cpu_gemm), on SmolLM2-135M's shapes and decode/prefill row counts.

    .venv/bin/python benchmarks/cpu_gemm.py [--threads 2] [--dtype float32]

Prints µs per call for both and their ratio (plain / packed: above 1 means packing wins).
Both paths run in one process, interleaved per shape, so machine noise hits them alike.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from llmctl.engine.layers import cpu_gemm

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate/up": (576, 3072), "down": (1536, 576), "lm head": (576, 49152)}
ROWS = (1, 2, 4, 8, 16, 32, 64, 256, 2048)


def _time(call, repeats: int) -> float:
    for _ in range(3):
        call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"{'shape':<8} {'K x N':>12} {'rows':>5} {'plain µs':>9} {'packed µs':>9} {'ratio':>6}")
    for name, (k, n) in SHAPES.items():
        weight = torch.randn(n, k).to(dtype)
        packed = cpu_gemm.pack_weight(weight)
        for rows in ROWS:
            x = torch.randn(rows, k).to(dtype)
            repeats = max(3, int(2e5 // (rows * n)) + 3)
            plain = _time(lambda: F.linear(x, weight), repeats)
            ours = _time(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), repeats)
            print(f"{name:<8} {f'{k} x {n}':>12} {rows:>5} {plain:9.0f} {ours:9.0f} {plain / ours:6.2f}")


if __name__ == "__main__":
    main()
