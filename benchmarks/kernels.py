"""llmctl's Triton kernels on a GPU: decode attention as KV bandwidth, and W4A16 against a bf16 GEMM.

    python benchmarks/kernels.py                        # on a CUDA GPU: batch 64 × context 4k, Llama-3-8B shapes
    TRITON_INTERPRET=1 python benchmarks/kernels.py --tiny   # anywhere: tiny shapes, checks the script runs

Decode attention reads every sequence's K and V once; its bandwidth is that many bytes over the
kernel's time, compared with the device's copy bandwidth (a device-to-device copy of 1 GiB).
The W4A16 GEMM (GPTQ and AWQ layouts) is timed against torch's bf16 matmul of the same shape.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

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


def copy_bandwidth(device: str, nbytes: int) -> float:
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return 2 * nbytes / timed(lambda: target.copy_(source), 10)  # read + write


def decode_attention(device: str, dtype: torch.dtype, batch: int, context: int, heads: int, kv_heads: int,
                     dim: int, block_size: int, repeats: int) -> None:
    from llmctl.kernels.attention import AttentionOptions, paged_attention, plan_step

    pages = -(-context // block_size)
    cache = torch.randn(batch * pages, block_size, 2, kv_heads, dim, device=device).to(dtype)
    tables = torch.randperm(batch * pages, device=device).view(batch, pages).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, heads, dim, device=device).to(dtype)
    starts = list(range(batch + 1))
    options = AttentionOptions(scale=dim ** -0.5)
    kv_bytes = batch * context * 2 * kv_heads * dim * cache.element_size()
    peak = copy_bandwidth(device, 1 << 30) if device == "cuda" else float("nan")
    for segments in (1, None):
        layout = plan_step(starts, [context] * batch, heads, kv_heads, torch.device(device), num_segments=segments)
        seconds = timed(lambda: paged_attention(query, cache, tables, lens, layout, options), repeats)
        label = f"{layout.num_segments} segment{'s' if layout.num_segments > 1 else ''}"
        print(f"decode attention, batch {batch} × context {context}, {heads}/{kv_heads} heads × {dim} ({label}): "
              f"{seconds * 1e6:8.1f} µs, {kv_bytes / seconds / 1e9:7.1f} GB/s of KV "
              f"({kv_bytes / seconds / peak:.0%} of copy bandwidth {peak / 1e9:.0f} GB/s)")


def w4a16(device: str, dtype: torch.dtype, rows: int, inner: int, cols: int, repeats: int) -> None:
    from llmctl.kernels.w4a16 import w4a16_matmul
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq

    weight = QuantizedWeight(q=torch.randint(0, 16, (cols, inner), dtype=torch.int32),
                             scales=torch.rand(cols, inner // 128) / 100, bits=4, group_size=128,
                             zeros=torch.randint(1, 16, (cols, inner // 128), dtype=torch.int32))
    x = torch.randn(rows, inner, device=device).to(dtype)
    dense = weight.dequantize().t().contiguous().to(device, dtype)
    baseline = timed(lambda: x @ dense, repeats)
    print(f"GEMM {rows} × {inner} × {cols}: torch {str(dtype).removeprefix('torch.')} {baseline * 1e6:8.1f} µs")
    for method, packed in (("gptq", pack_gptq(weight)), ("awq", pack_awq(weight))):
        args = [packed[k].to(device) for k in ("qweight", "qzeros", "scales")]
        seconds = timed(lambda: w4a16_matmul(x, method, *args, None, 128), repeats)
        print(f"    W4A16 {method}: {seconds * 1e6:8.1f} µs ({baseline / seconds:.2f}× the dense GEMM's speed)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="small shapes (for the interpreter)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    print(f"device: {torch.cuda.get_device_name() if cuda else 'CPU (Triton interpreter)'}")
    if args.tiny:
        decode_attention(device, dtype, batch=2, context=64, heads=4, kv_heads=2, dim=64, block_size=16, repeats=2)
        w4a16(device, dtype, rows=4, inner=256, cols=64, repeats=2)
        return
    decode_attention(device, dtype, batch=64, context=4096, heads=32, kv_heads=8, dim=128, block_size=16, repeats=20)
    for rows in (1, 16, 256):  # Llama-3-8B's MLP up projection
        w4a16(device, dtype, rows=rows, inner=4096, cols=14336, repeats=20)


if __name__ == "__main__":
    main()
