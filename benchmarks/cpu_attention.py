"""Decode attention on the CPU: llmctl's C++ paged kernel (the `cpu` backend) against what
memory allows on this machine.

    .venv/bin/python benchmarks/cpu_attention.py [--seqs 32] [--context 300] [--threads 2]

One decode step of SmolLM2-135M's attention by default: 32 sequences of 300 cached tokens,
9 query / 3 KV heads of 64, 30 layers each with its own cache (so the K/V come from memory,
not from the last level cache), blocks of 16 in random order as a busy pool leaves them.
Prints ms per step and the GB/s of K/V read, next to a plain `sum` over 1 GiB in the same
run (the read bandwidth these cores get).
"""

from __future__ import annotations

import argparse
import time

import torch

from llmctl.kernels import cpu


def _seconds(call, repeats: int = 5) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu.load()
    torch.manual_seed(0)
    blocks_per_seq = -(-args.context // args.block_size)
    pool = args.seqs * blocks_per_seq
    caches = [torch.randn(pool, args.block_size, 2, args.kv_heads, args.dim) for _ in range(args.layers)]
    tables = torch.randperm(pool).to(torch.int32).view(args.seqs, blocks_per_seq)
    lens = torch.full((args.seqs,), args.context, dtype=torch.int32)
    starts = torch.arange(args.seqs + 1, dtype=torch.int32)
    query = torch.randn(args.seqs, args.heads, args.dim)
    out = torch.empty_like(query)
    scale = args.dim ** -0.5

    def kernel() -> None:
        for cache in caches:
            cpu.paged_attention(out, query, cache, tables, lens, starts, scale, None, 0)

    whole = torch.randn(2**28)  # 1 GiB
    kv_bytes = args.seqs * args.context * 2 * args.kv_heads * args.dim * 4 * args.layers
    print(f"{torch.get_num_threads()} threads; {args.seqs} sequences × {args.context} tokens, "
          f"{args.heads}/{args.kv_heads} heads of {args.dim}, {args.layers} layers: {kv_bytes / 1e9:.2f} GB of K/V")
    rows = [("C++ paged kernel (cpu backend)", kernel, kv_bytes), ("sum over 1 GiB (read bandwidth)", whole.sum, whole.numel() * 4)]
    for name, call, nbytes in rows:
        seconds = _seconds(call)
        print(f"{name:<34} {seconds * 1e3:8.1f} ms  {nbytes / seconds / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
