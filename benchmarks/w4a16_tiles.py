"""Which W4A16 tiles are fastest on this GPU: a sweep over block N/K, split-K and warps at decode row counts.

    python benchmarks/w4a16_tiles.py [--json FILE]          # on a CUDA GPU, Llama-3-8B's MLP up projection
    TRITON_INTERPRET=1 python benchmarks/w4a16_tiles.py --tiny

Each configuration is checked against the dequantized reference before it is timed; the table prints
the engine's own choice (`choose_tiles`) beside the best found, against torch's bf16 GEMM of the same shape.
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernels import setup, timed  # noqa: E402  (benchmarks/kernels.py: flags and device; median seconds)


def sweep(device: str, dtype: torch.dtype, rows: int, inner: int, cols: int, method: str, repeats: int,
          grid: dict) -> dict:
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
    from llmctl.kernels.w4a16 import choose_tiles, w4a16_matmul

    torch.manual_seed(0)
    weight = QuantizedWeight(q=torch.randint(0, 16, (cols, inner), dtype=torch.int32),
                             scales=torch.rand(cols, inner // 128) / 100, bits=4, group_size=128,
                             zeros=torch.randint(1, 16, (cols, inner // 128), dtype=torch.int32))
    packed = (pack_gptq if method == "gptq" else pack_awq)(weight)
    args = [packed[k].to(device) for k in ("qweight", "qzeros", "scales")]
    x = torch.randn(rows, inner, device=device).to(dtype)
    dense = weight.dequantize().t().contiguous().to(device, dtype)
    expected = (x.float() @ dense.float())
    dense_seconds = timed(lambda: x @ dense, repeats)
    chosen = choose_tiles(rows, inner, 128, False, method == "awq", x.element_size())
    results = []
    for block_n, block_k, split_k, warps in itertools.product(*grid.values()):
        tiles = replace(chosen, block_n=block_n, block_k=block_k, split_k=split_k, num_warps=warps,
                        uniform_groups=128 % block_k == 0)
        run = lambda: w4a16_matmul(x, method, *args, None, 128, tiles=tiles)  # noqa: E731
        try:
            error = (run().float() - expected).abs().max().item() / expected.abs().max().item()
            seconds = timed(run, repeats)
        except Exception as failure:  # a tile the compiler refuses (shared memory): reported, not timed
            print(f"    {tiles}: {type(failure).__name__}: {str(failure)[:120]}", flush=True)
            continue
        results.append(dict(asdict(tiles), seconds=seconds, relative_error=error))
    results.sort(key=lambda r: r["seconds"])
    engine = w4a16_timing(x, method, args, repeats)
    best = results[0]
    print(f"M={rows} {method}: dense {dense_seconds * 1e6:.1f} µs; engine's tiles {engine * 1e6:.1f} µs "
          f"({dense_seconds / engine:.2f}×); best {best['seconds'] * 1e6:.1f} µs ({dense_seconds / best['seconds']:.2f}×) "
          f"block_n {best['block_n']} block_k {best['block_k']} split {best['split_k']} warps {best['num_warps']}",
          flush=True)
    bad = [r for r in results if r["relative_error"] > 2e-2]
    if bad:
        print(f"WRONG RESULTS from {len(bad)} tilings, e.g. {bad[0]}", flush=True)
    return dict(rows=rows, method=method, dense_seconds=dense_seconds, engine_seconds=engine, top=results[:5],
                wrong=bad)


def w4a16_timing(x: torch.Tensor, method: str, args: list, repeats: int) -> float:
    from llmctl.kernels.w4a16 import w4a16_matmul
    return timed(lambda: w4a16_matmul(x, method, *args, None, 128), repeats)


def main() -> None:
    args, device, dtype, _ = setup()
    if args.tiny:
        grid = dict(block_n=[32, 64], block_k=[32], split_k=[1, 2], num_warps=[4])
        report = [sweep(device, dtype, 2, 256, 64, m, 1, grid) for m in ("gptq", "awq")]
    else:
        grid = dict(block_n=[32, 64, 128, 256], block_k=[64, 128], split_k=[1, 2, 4, 8, 16], num_warps=[4, 8])
        report = [sweep(device, dtype, rows, 4096, 14336, method, 10, grid)
                  for rows in (1, 16) for method in ("gptq", "awq")]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
