"""Decode attention on the CPU: llmctl's C++ paged kernel (the `cpu` backend) against what
memory allows on this machine.

    .venv/bin/python benchmarks/cpu_attention.py [--seqs 32] [--context 300] [--threads 2] [--pool-blocks 2912]
    .venv/bin/python benchmarks/cpu_attention.py --prompts 40 144 256 512 1024 [--dtype bfloat16]

One decode step of SmolLM2-135M's attention by default: 32 sequences of 300 cached tokens,
9 query / 3 KV heads of 64, 30 layers each with its own cache (so the K/V come from memory,
not from the last level cache), blocks of 16 in random order as a busy pool leaves them
(`--pool-blocks`: the pool they are drawn from; 2,912 is the engine's 2 GiB for SmolLM2).
The same caches run twice, interleaved: on torch's ordinary allocation (4 KiB pages where
transparent huge pages are in `madvise` mode) and as the engine allocates them, one buffer on
2 MiB pages (llmctl.kernels.huge_pages). Prints ms per step and the GB/s of K/V read, next to
a plain `sum` over 1 GiB in the same run (the read bandwidth these cores get).

With `--prompts`, one sequence's prompt attention instead, for each length: a fresh prompt
(every token new) and a chunk of half the length over cached tokens, through the C++ kernel
and through torch's SDPA as the `torch` backend runs it (a causal SDPA over the new K/V for
the fresh prompt; the pages gathered, then SDPA with a mask, for the chunk). This is what
sets VECTOR_QUERY_LIMIT and SHORT_QUERY_LIMIT in llmctl.engine.layers.cpu_attention.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from llmctl.kernels import cpu
from llmctl.kernels.huge_pages import zeros_on_huge_pages


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
    parser.add_argument("--pool-blocks", type=int, default=None,
                        help="blocks per layer the tables draw from (default: just enough)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the decode rows, interleaved")
    parser.add_argument("--prompts", type=int, nargs="*", help="prompt lengths: time prompt attention instead")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="for --prompts")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu.load()
    torch.manual_seed(0)
    if args.prompts:
        prompts(args, getattr(torch, args.dtype))
        return
    blocks_per_seq = -(-args.context // args.block_size)
    pool = max(args.pool_blocks or 0, args.seqs * blocks_per_seq)
    shape = (pool, args.block_size, 2, args.kv_heads, args.dim)
    caches = [torch.randn(shape) for _ in range(args.layers)]
    huge = zeros_on_huge_pages((args.layers, *shape), torch.float32)
    for layer, cache in enumerate(caches):
        huge[layer].copy_(cache)
    tables = torch.randperm(pool)[:args.seqs * blocks_per_seq].to(torch.int32).view(args.seqs, blocks_per_seq)
    lens = torch.full((args.seqs,), args.context, dtype=torch.int32)
    starts = torch.arange(args.seqs + 1, dtype=torch.int32)
    query = torch.randn(args.seqs, args.heads, args.dim)
    out = torch.empty_like(query)
    scale = args.dim ** -0.5

    def kernel(pool=caches) -> None:
        for cache in pool:
            cpu.paged_attention(out, query, cache, tables, lens, starts, scale, None, 0)

    whole = torch.randn(2**28)  # 1 GiB
    kv_bytes = args.seqs * args.context * 2 * args.kv_heads * args.dim * 4 * args.layers
    print(f"{torch.get_num_threads()} threads; {args.seqs} sequences × {args.context} tokens, "
          f"{args.heads}/{args.kv_heads} heads of {args.dim}, {args.layers} layers: {kv_bytes / 1e9:.2f} GB of K/V")
    rows = [("C++ kernel, 4 KiB pages", kernel, kv_bytes),
            ("C++ kernel, 2 MiB pages (engine)", lambda: kernel(list(huge)), kv_bytes),
            ("sum over 1 GiB (read bandwidth)", whole.sum, whole.numel() * 4)]
    for _ in range(args.repeat):
        for name, call, nbytes in rows:
            seconds = _seconds(call)
            print(f"{name:<34} {seconds * 1e3:8.1f} ms  {nbytes / seconds / 1e9:6.1f} GB/s", flush=True)


def prompts(args: argparse.Namespace, dtype: torch.dtype) -> None:
    print(f"{torch.get_num_threads()} threads; {args.heads}/{args.kv_heads} heads of {args.dim}, {args.dtype}, "
          "one layer; µs per call")
    print(f"{'new tokens':>10} {'context':>8} {'C++ kernel':>11} {'SDPA':>8}  kernel / SDPA")
    scale = args.dim ** -0.5
    for length in args.prompts:
        for new in (length, length // 2):
            blocks = -(-length // args.block_size)
            cache = torch.randn(4 * blocks, args.block_size, 2, args.kv_heads, args.dim).to(dtype)
            table = torch.randperm(4 * blocks)[:blocks].to(torch.int32).view(1, blocks)
            kv = cache.index_select(0, table[0].long()).flatten(0, 1)[:length]  # [length, 2, KVH, D]
            query = torch.randn(new, args.heads, args.dim).to(dtype)
            lens, starts = torch.tensor([length], dtype=torch.int32), torch.tensor([0, new], dtype=torch.int32)
            out = torch.empty_like(query)
            q = query.transpose(0, 1).unsqueeze(0)
            mask = torch.ones(new, length, dtype=torch.bool).tril(length - new)

            def kernel() -> None:
                cpu.paged_attention(out, query, cache, table, lens, starts, scale, None, 0)

            def sdpa() -> None:
                if new == length:  # fresh: the new K/V as they come out of the projection
                    k, v = kv[:, 0].transpose(0, 1).unsqueeze(0), kv[:, 1].transpose(0, 1).unsqueeze(0)
                    F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
                    return
                pages = cache.index_select(0, table[0].long()).flatten(0, 1)[:length]
                k, v = pages[:, 0].transpose(0, 1).unsqueeze(0), pages[:, 1].transpose(0, 1).unsqueeze(0)
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)

            ours, theirs = _seconds(kernel, 20), _seconds(sdpa, 20)
            print(f"{new:>10} {length:>8} {ours * 1e6:>11.0f} {theirs * 1e6:>8.0f}  {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
