"""W4A16 at decode: llmctl's GEMV (llmctl.kernels.w4a16_gemv) against torch's bf16 GEMM (cuBLAS) and the
tensor-core W4A16 kernel, timed as a decode step runs them: captured in a CUDA graph, cycling through
enough copies of the weight that the L2 cache holds none of it (a model's layers each have their own).

    python benchmarks/w4a16_gemv.py [--json FILE]   # on a CUDA GPU: Llama-3-8B's MLP up and down projections
    TRITON_INTERPRET=1 python benchmarks/w4a16_gemv.py --tiny

At one row (where the engine runs the GEMV) it also sweeps its tiles (block N, block K, split K, warps),
each checked against the dequantized weight first; at 2, 4 and 8 rows it shows why the engine does not.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernels import graphed_seconds, l2_bytes, setup  # noqa: E402  (benchmarks/kernels.py)


def random_weight(inner: int, cols: int, method: str, copies: int, device: str) -> tuple[list[list], torch.Tensor]:
    """`copies` packed copies of one random 4-bit weight (group 128) and its dequantized [K, N] float32 form."""
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq

    gen = torch.Generator().manual_seed(inner + cols)
    weight = QuantizedWeight(q=torch.randint(0, 16, (cols, inner), generator=gen, dtype=torch.int32),
                             scales=torch.rand(cols, inner // 128, generator=gen) / 100 + 1e-3, bits=4,
                             group_size=128, zeros=torch.randint(1, 16, (cols, inner // 128), generator=gen,
                                                                 dtype=torch.int32))
    packed = (pack_gptq if method == "gptq" else pack_awq)(weight)
    args = [[packed[k].to(device) for k in ("qweight", "qzeros", "scales")] for _ in range(copies)]
    return args, weight.dequantize().t().contiguous()


def copies_beyond_l2(nbytes: int, device: str) -> int:
    return max(2, math.ceil(3 * l2_bytes() / nbytes)) if device == "cuda" else 1


def compare(device: str, dtype: torch.dtype, rows: int, inner: int, cols: int, method: str, repeats: int,
            grid: dict | None) -> dict:
    from llmctl.kernels.w4a16 import choose_tiles, w4a16_matmul
    from llmctl.kernels.w4a16_gemv import GemvTiles, w4a16_gemv

    packed_bytes = inner * cols // 2 + 4 * cols * inner // 128
    args, weight = random_weight(inner, cols, method, copies_beyond_l2(packed_bytes, device), device)
    dense = [weight.to(device, dtype) for _ in range(copies_beyond_l2(2 * inner * cols, device))]
    x = torch.randn(rows, inner, device=device).to(dtype)
    expected = x.float().cpu() @ weight
    error = lambda got: (got.float().cpu() - expected).abs().max().item() / expected.abs().max().item()  # noqa: E731
    dense_s = graphed_seconds([lambda d=d: x @ d for d in dense], repeats)
    tensor_cores = choose_tiles(rows, inner, 128, False, method == "awq", x.element_size())
    cores_s = graphed_seconds([lambda a=a: w4a16_matmul(x, method, *a, None, 128, tiles=tensor_cores) for a in args],
                              repeats)
    gemv_error = error(w4a16_gemv(x, method, *args[0], 128))
    gemv_s = graphed_seconds([lambda a=a: w4a16_gemv(x, method, *a, 128) for a in args], repeats)
    print(f"M={rows} {inner} → {cols} {method}: bf16 GEMM {dense_s * 1e6:7.1f} µs, tensor-core W4A16 "
          f"{cores_s * 1e6:7.1f} µs ({dense_s / cores_s:.2f}×), GEMV {gemv_s * 1e6:7.1f} µs "
          f"({dense_s / gemv_s:.2f}×, {packed_bytes / gemv_s / 1e9:.0f} GB/s), relative error {gemv_error:.1e}"
          f"{'  WRONG' if gemv_error > 2e-2 else ''}", flush=True)
    record = dict(rows=rows, inner=inner, cols=cols, method=method, dense_seconds=dense_s, tensor_core_seconds=cores_s,
                  gemv_seconds=gemv_s, gemv_relative_error=gemv_error, sweep=[])
    for block_n, block_k, split_k, warps in itertools.product(*grid.values()) if grid else ():
        tiles = GemvTiles(block_n, block_k, split_k, warps)
        wrong = error(w4a16_gemv(x, method, *args[0], 128, tiles=tiles))
        seconds = graphed_seconds([lambda a=a: w4a16_gemv(x, method, *a, 128, tiles=tiles) for a in args], repeats)
        record["sweep"].append(dict(asdict(tiles), seconds=seconds, relative_error=wrong))
    if record["sweep"]:
        record["sweep"].sort(key=lambda r: r["seconds"])
        best = record["sweep"][0]
        print(f"    best tiles {best}: {dense_s / best['seconds']:.2f}× the bf16 GEMM"
              f"{'  WRONG' if any(r['relative_error'] > 2e-2 for r in record['sweep']) else ''}", flush=True)
    return record


def main() -> None:
    args, device, dtype, name = setup()
    report: dict = dict(device=name, results=[])
    if args.tiny:
        grid = dict(block_n=[32], block_k=[32, 64], split_k=[1, 2], num_warps=[4])
        for method in ("gptq", "awq"):
            report["results"].append(compare(device, dtype, 1, 256, 64, method, 1, grid))
    else:
        grid = dict(block_n=[64, 128, 256], block_k=[64, 128], split_k=[1, 4, 8, 16], num_warps=[2, 4, 8])
        for (inner, cols), method, rows in itertools.product(((4096, 14336), (14336, 4096)), ("gptq", "awq"),
                                                             (1, 2, 4, 8)):
            sweeping = grid if rows == 1 else None
            report["results"].append(compare(device, dtype, rows, inner, cols, method, 10, sweeping))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
