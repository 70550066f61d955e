"""W4A16 at decode: llmctl's GEMV (llmctl.kernels.w4a16_gemv) against torch's bf16 GEMM (cuBLAS) and the
tensor-core W4A16 kernel, timed as a decode step runs them: captured in a CUDA graph, cycling through
enough copies of the weight that the L2 cache holds none of it (a model's layers each have their own).

    python benchmarks/w4a16_gemv.py [--json FILE]   # on a CUDA GPU: Llama-3-8B's MLP up and down projections
    TRITON_INTERPRET=1 python benchmarks/w4a16_gemv.py --tiny

At one row (where the engine runs the GEMV) it also sweeps its tiles, each checked against the
dequantized weight, in two rounds so the sweep fits a short GPU lease: first pipeline depth × split K ×
how splits are summed (atomic adds into a zeroed float32 output, or the last split program adding them)
at the engine's tile shape, then tile shapes × warps at the best of those. It also times what a split adds
around the kernel (zeroing the float32 output, casting it back). At 2, 4 and 8 rows it shows why the
engine does not run the GEMV there.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import sys
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
    from llmctl.kernels.w4a16_gemv import choose_gemv_tiles, multiprocessor_count, w4a16_gemv

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
    if grid:
        record["split_overhead_seconds"] = split_overhead(x, cols, repeats)
        engine = choose_gemv_tiles(rows, inner, cols, 128, method == "awq", multiprocessor_count(x.device))
        run = lambda tiles: sweep_one(x, method, args, tiles, error, repeats)  # noqa: E731
        record["sweep"] = sweep_rounds(engine, grid, run)
        best = min((r for r in record["sweep"] if "seconds" in r), key=lambda r: r["seconds"], default=None)
        wrong = any(r.get("relative_error", 0) > 2e-2 for r in record["sweep"])
        print(f"    split adds {record['split_overhead_seconds'] * 1e6:.1f} µs (zeroing, cast); best of "
              f"{len(record['sweep'])} tilings {best}: {dense_s / best['seconds']:.2f}× the bf16 GEMM"
              f"{'  WRONG' if wrong else ''}" if best else "    no tiling compiled", flush=True)
    return record


def split_overhead(x: torch.Tensor, cols: int, repeats: int) -> float:
    """What a split GEMV launches besides itself: the float32 output zeroed, then cast to x's dtype."""
    return graphed_seconds([lambda: torch.zeros(x.shape[0], cols, dtype=torch.float32, device=x.device).to(x.dtype)],
                           repeats)


def sweep_rounds(engine, grid: dict, run) -> list[dict]:
    """Round 1: stages × split × split sum at the engine's block sizes and warps; round 2: block sizes ×
    warps at round 1's best of those. Every record says its tiles and either its time and error or its failure."""
    first = [dataclasses.replace(engine, num_stages=stages, split_k=split, split_sum=summed)
             for stages, split, summed in itertools.product(grid["num_stages"], grid["split_k"], grid["split_sum"])
             if split > 1 or summed == "atomic"]
    records = [run(tiles) for tiles in dict.fromkeys(first)]
    timed_ = [r for r in records if "seconds" in r]
    best = min(timed_, key=lambda r: r["seconds"]) if timed_ else dataclasses.asdict(engine)
    second = [dataclasses.replace(engine, block_n=n, block_k=k, num_warps=w, num_stages=best["num_stages"],
                                  split_k=best["split_k"], split_sum=best["split_sum"])
              for n, k, w in itertools.product(grid["block_n"], grid["block_k"], grid["num_warps"])]
    return records + [run(tiles) for tiles in dict.fromkeys(second) if tiles not in first]


def sweep_one(x: torch.Tensor, method: str, args: list[list], tiles, error, repeats: int) -> dict:
    from llmctl.kernels.w4a16_gemv import w4a16_gemv

    record = dataclasses.asdict(tiles)
    try:  # a tiling may not compile or fit on this GPU: recorded, and the sweep goes on
        record["relative_error"] = error(w4a16_gemv(x, method, *args[0], 128, tiles=tiles))
        record["seconds"] = graphed_seconds([lambda a=a: w4a16_gemv(x, method, *a, 128, tiles=tiles) for a in args],
                                            repeats)
        # and again after the replays: a split sum that raced, or counts left dirty, shows here
        again = error(w4a16_gemv(x, method, *args[0], 128, tiles=tiles))
        record["relative_error"] = max(record["relative_error"], again)
    except Exception as exc:  # Triton's compile and resource errors have no common base class
        lines = str(exc).strip().splitlines() or [""]
        record["failed"] = f"{type(exc).__name__}: {lines[-1][:200]}"
    return record


def main() -> None:
    args, device, dtype, name = setup()
    report: dict = dict(device=name, results=[])
    if args.tiny:
        grid = dict(num_stages=[1, 3], split_k=[1, 2], split_sum=["atomic", "last"], block_n=[32], block_k=[32, 64],
                    num_warps=[4])
        for method in ("gptq", "awq"):
            report["results"].append(compare(device, dtype, 1, 256, 64, method, 1, grid))
    else:
        grid = dict(num_stages=[1, 2, 3, 4], split_k=[1, 4, 8, 16], split_sum=["atomic", "last"],
                    block_n=[32, 64, 128, 256], block_k=[64, 128], num_warps=[4, 8])
        for (inner, cols), method, rows in itertools.product(((4096, 14336), (14336, 4096)), ("gptq", "awq"),
                                                             (1, 2, 4, 8)):
            sweeping = grid if rows == 1 else None
            report["results"].append(compare(device, dtype, rows, inner, cols, method, 10, sweeping))
            if args.json:  # after each shape: a run cut short by its time limit keeps what it measured
                args.json.write_text(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
