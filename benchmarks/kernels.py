"""llmctl's Triton kernels on a GPU: decode attention as KV bandwidth, and W4A16 against a bf16 GEMM.

    python benchmarks/kernels.py [--json FILE]          # on a CUDA GPU: batch 1–256 × context 1k–32k, Llama-3-8B shapes
    TRITON_INTERPRET=1 python benchmarks/kernels.py --tiny   # anywhere: tiny shapes, checks the script runs

Decode attention reads every sequence's K and V once; its bandwidth is that many bytes over the
kernel's time, compared with the device's copy bandwidth (a device-to-device copy of 1 GiB). It is timed
as decode steps run it, captured in a CUDA graph, over enough cache copies that the L2 cache holds none,
for the split into 1, 16 and 64 segments × key tiles of 16, 32 and 64 keys (* marks the engine's choice).
The W4A16 GEMM (GPTQ and AWQ layouts) is timed against torch's bf16 matmul of the same shape, and the
fused-MoE grouped GEMM against the torch path that runs each expert's rows in turn (same routing, same weights).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds per call (CUDA events on a GPU, wall clock elsewhere)."""
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2]


def graphed_seconds(calls: list[Callable[[], object]], repeats: int) -> float:
    """Median seconds per call when the calls run back to back as a decode step runs them: captured in one
    CUDA graph (no launch overhead between them); on CPUs, plain calls."""
    if not torch.cuda.is_available():
        return timed(lambda: [call() for call in calls], repeats) / len(calls)
    for call in calls:  # compile and allocate outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return timed(graph.replay, repeats) / len(calls)


def l2_bytes() -> int:
    """The GPU's L2 cache; a benchmark that cycles through more than a few times this reads from memory."""
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(properties, "L2_cache_size", 64 << 20)


def copy_bandwidth(device: str, nbytes: int) -> float:
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return 2 * nbytes / timed(lambda: target.copy_(source), 10)  # read + write


def decode_attention(device: str, dtype: torch.dtype, batch: int, context: int, heads: int, kv_heads: int,
                     dim: int, block_size: int, repeats: int, peak: float,
                     tilings: tuple = tuple(itertools.product((1, 16, 64), (16, 32, 64)))) -> list[dict]:
    """Each (segments, key tile) of `tilings` timed and checked."""
    from llmctl.kernels.attention import (
        DECODE_KEY_TILE,
        AttentionOptions,
        choose_segments,
        paged_attention,
        paged_attention_reference,
        plan_step,
        sm_count,
    )

    pages = -(-context // block_size)
    kv_bytes = batch * context * 2 * kv_heads * dim * torch.empty(0, dtype=dtype).element_size()
    copies = max(1, -(-3 * l2_bytes() // kv_bytes)) if device == "cuda" else 1  # each call reads memory
    caches = [torch.empty(batch * pages, block_size, 2, kv_heads, dim, device=device, dtype=dtype).normal_()
              for _ in range(copies)]
    tables = torch.randperm(batch * pages, device=device).view(batch, pages).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, heads, dim, device=device).to(dtype)
    starts = list(range(batch + 1))
    options = AttentionOptions(scale=dim ** -0.5)
    checked = min(batch, 2)  # each tiling's first sequences against the torch reference
    expected = paged_attention_reference(query[:checked], caches[0], tables[:checked], lens[:checked],
                                         torch.tensor(starts[:checked + 1]), options).float()
    records = []
    chosen = (choose_segments(True, batch, kv_heads, sm_count(torch.device(device)), context), DECODE_KEY_TILE)
    for segments, tile in dict.fromkeys((*tilings, chosen)):  # the engine's choice too; merged by a second kernel
        layout = plan_step(starts, heads, kv_heads, torch.device(device), num_segments=segments,
                           preferred_key_tile=tile)
        got = paged_attention(query, caches[0], tables, lens, layout, options)[:checked].float()
        error = ((got - expected).abs().max() / expected.abs().max()).item()
        seconds = graphed_seconds([lambda c=c: paged_attention(query, c, tables, lens, layout, options)
                                   for c in caches], repeats)
        mark = "*" if (segments, tile) == chosen else ""
        print(f"decode attention, batch {batch} × context {context}, {heads}/{kv_heads} heads × {dim}, {segments} "
              f"segments, {tile}-key tiles{mark}: {seconds * 1e6:8.1f} µs, {kv_bytes / seconds / 1e9:7.1f} GB/s of "
              f"KV ({kv_bytes / seconds / peak:.0%} of copy bandwidth {peak / 1e9:.0f} GB/s)"
              f"{'  WRONG' if error > 2e-2 else ''}", flush=True)
        records.append(dict(batch=batch, context=context, segments=segments, key_tile=tile,
                            engine_runs_this=bool(mark), seconds=seconds, relative_error=error,
                            kv_gb_per_s=kv_bytes / seconds / 1e9, fraction_of_copy=kv_bytes / seconds / peak))
    return records


def w4a16(device: str, dtype: torch.dtype, rows: int, inner: int, cols: int, repeats: int) -> dict:
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
    from llmctl.kernels.w4a16 import w4a16_matmul

    weight = QuantizedWeight(q=torch.randint(0, 16, (cols, inner), dtype=torch.int32),
                             scales=torch.rand(cols, inner // 128) / 100, bits=4, group_size=128,
                             zeros=torch.randint(1, 16, (cols, inner // 128), dtype=torch.int32))
    x = torch.randn(rows, inner, device=device).to(dtype)
    dense = weight.dequantize().t().contiguous().to(device, dtype)
    baseline = timed(lambda: x @ dense, repeats)
    print(f"GEMM {rows} × {inner} × {cols}: torch {str(dtype).removeprefix('torch.')} {baseline * 1e6:8.1f} µs")
    record = dict(rows=rows, inner=inner, cols=cols, dense_seconds=baseline)
    for method, packed in (("gptq", pack_gptq(weight)), ("awq", pack_awq(weight))):
        args = [packed[k].to(device) for k in ("qweight", "qzeros", "scales")]
        seconds = timed(lambda: w4a16_matmul(x, method, *args, None, 128), repeats)
        print(f"    W4A16 {method}: {seconds * 1e6:8.1f} µs ({baseline / seconds:.2f}× the dense GEMM's speed)",
              flush=True)
        record[f"{method}_seconds"], record[f"{method}_speedup"] = seconds, baseline / seconds
    return record


def fused_moe(device: str, dtype: torch.dtype, tokens: int, hidden: int, inter: int, experts: int, top_k: int,
              repeats: int) -> dict:
    from llmctl.engine.layers.moe import Routing, dense_expert, grouped_experts, route
    from llmctl.kernels.fused_moe import fused_moe as fused

    gen = torch.Generator(device).manual_seed(tokens)
    random = lambda *shape: torch.randn(*shape, generator=gen, device=device)  # noqa: E731 (made on the device: GBs)
    w13, w2 = (random(experts, 2 * inter, hidden) / 64).to(dtype), (random(experts, hidden, inter) / 64).to(dtype)
    x = random(tokens, hidden).to(dtype)
    weights, ids = route(random(tokens, experts), Routing(top_k, renormalize=True))
    reference = grouped_experts(x, weights, ids, experts, dense_expert(w13, w2)).float()
    error = float((fused(x, weights, ids, w13, w2).float() - reference).abs().max() / reference.abs().max())
    kernel = timed(lambda: fused(x, weights, ids, w13, w2), repeats)
    per_expert = timed(lambda: grouped_experts(x, weights, ids, experts, dense_expert(w13, w2)), repeats)
    print(f"fused MoE {tokens} tokens, {experts} experts top-{top_k}, {hidden} → {inter}: {kernel * 1e6:8.1f} µs, torch "
          f"per expert {per_expert * 1e6:8.1f} µs ({per_expert / kernel:.2f}×), relative error {error:.1e}"
          f"{'  WRONG' if error > 2e-2 else ''}", flush=True)
    return dict(tokens=tokens, hidden=hidden, inter=inter, experts=experts, top_k=top_k, seconds=kernel,
                torch_seconds=per_expert, relative_error=error)


def setup() -> tuple[argparse.Namespace, str, torch.dtype, str]:
    """The GPU benchmarks' flags (--tiny, --json), and where they run: bf16 on CUDA, else float32 interpreted."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="small shapes (for the interpreter)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    name = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)"
    print(f"device: {name}")
    return args, device, dtype, name


def main() -> None:
    args, device, dtype, name = setup()
    cuda = device == "cuda"
    peak = copy_bandwidth(device, 1 << 30) if cuda else float("nan")
    report: dict = dict(device=name, copy_gb_per_s=peak / 1e9, attention=[], w4a16=[], moe=[])
    if args.tiny:
        report["attention"] += decode_attention(device, dtype, batch=2, context=64, heads=4, kv_heads=2, dim=64,
                                                block_size=16, repeats=2, peak=peak, tilings=((1, 16), (16, 64)))
        report["w4a16"].append(w4a16(device, dtype, rows=4, inner=256, cols=64, repeats=2))
        report["moe"].append(fused_moe(device, dtype, tokens=5, hidden=32, inter=48, experts=4, top_k=2, repeats=2))
    else:
        free = torch.cuda.mem_get_info()[0]
        for batch in (1, 16, 64, 256):  # Llama-3-8B's attention: 32 query heads, 8 KV heads of 128
            for context in (1024, 4096, 32768):
                if batch * context * 2 * 8 * 128 * 2 < free // 3:
                    report["attention"] += decode_attention(device, dtype, batch=batch, context=context, heads=32,
                                                            kv_heads=8, dim=128, block_size=16, repeats=20, peak=peak)
        for rows in (1, 16, 256, 1024):  # Llama-3-8B's MLP up projection; 1024: dequantize, then cuBLAS
            report["w4a16"].append(w4a16(device, dtype, rows=rows, inner=4096, cols=14336, repeats=20))
        for shapes in (dict(hidden=4096, inter=14336, experts=8, top_k=2), dict(hidden=2048, inter=768, experts=128,
                                                                              top_k=8)):  # Mixtral-8x7B, Qwen3-30B-A3B
            for tokens in (1, 16, 256, 1024):
                report["moe"].append(fused_moe(device, dtype, tokens=tokens, **shapes, repeats=20))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
