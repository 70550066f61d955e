"""CPU linears: torch's plain F.linear, oneDNN's packed linear and llmctl's panel GEMM
(the paths of llmctl.engine.layers.cpu_gemm), on SmolLM2-135M's shapes at decode and prefill
row counts.

    .venv/bin/python benchmarks/cpu_gemm.py [--threads 2] [--layers 30] [--rows 1 4 8 16 32 64 256 2048]
    .venv/bin/python benchmarks/cpu_gemm.py --dtype bfloat16   # panels on AMX tiles where the CPU has AMX
    ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        .venv/bin/python benchmarks/cpu_gemm.py --isa avx2   # all three held to AVX2
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 .venv/bin/python benchmarks/cpu_gemm.py --dtype bfloat16 --no-amx
        # as on an AVX512-BF16 CPU without AMX (Zen 4): llmctl's vdpbf16ps panels against oneDNN

Each row count runs every linear of `--layers` decoder layers (qkv, o, gate/up, down; each
with its own weight, 14 MB a layer) and the LM head once, as a decode step does: the weights
come from memory, not from the last-level cache. Prints ms per pass, the weight read rate
and GFLOP/s for each path, and the panel kernel's speed-up over oneDNN. "panels" packs each
weight on its own (torch's allocation: 4 KiB pages where transparent huge pages are in
`madvise` mode); "panels 2M" packs them into one buffer on 2 MiB pages, as the engine does. The three paths run
interleaved per row count, so machine noise hits them alike. Without AVX-512 (or without
the C++ kernels; in bfloat16, without AVX512-BF16) the panel columns are left out.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from llmctl.engine.layers.cpu_gemm import PanelArena
from llmctl.kernels import cpu

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K): qkv, o, gate/up, down
LM_HEAD = (49152, 576)


def _seconds(call: Callable[[], object], repeats: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 256, 2048])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--isa", choices=["auto", "avx512", "avx2"], default="auto",
                        help="the float32 panel path (oneDNN's: the ONEDNN_MAX_CPU_ISA environment variable)")
    parser.add_argument("--no-amx", action="store_true", help="bfloat16 panels with AVX512-BF16 only, not AMX tiles")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [torch.randn(n, k, dtype=dtype) for _ in range(args.layers) for n, k in LAYER_SHAPES] + \
        [torch.randn(*LM_HEAD, dtype=dtype)]
    paths: dict[str, list[Callable[[torch.Tensor], torch.Tensor]]] = {
        "plain": [lambda x, w=w: F.linear(x, w) for w in weights],
        "oneDNN": [lambda x, p=torch.ops.mkldnn._reorder_linear_weight(w, None): torch.ops.mkldnn._linear_pointwise(
            x, p, None, "none", [], "") for w in weights],
    }
    if cpu.panel_isas() if dtype == torch.float32 else cpu.bf16_panels_supported():
        isa = args.isa if dtype == torch.float32 else "auto"
        amx = not args.no_amx
        paths["panels"] = [lambda x, p=cpu.pack_panels(w), n=w.shape[0]: cpu.panel_linear(x, p, n, use_amx=amx,
                                                                                            isa=isa)
                           for w in weights]
        arena = PanelArena(weights)  # as the engine packs them: one buffer on 2 MiB pages
        paths["panels 2M"] = [lambda x, p=arena.place(cpu.pack_panels(w)), n=w.shape[0]:
                              cpu.panel_linear(x, p, n, use_amx=amx, isa=isa) for w in weights]
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    print(f"{torch.get_num_threads()} threads; {args.layers} layers + LM head, {weight_bytes / 1e6:.0f} MB of "
          f"{args.dtype} weights")
    print(f"{'rows':>5} " + " ".join(f"{name + ' ms':>10} {'GB/s':>5} {'GF/s':>5}" for name in paths)
          + ("  panels 2M/oneDNN" if "panels" in paths else ""))
    for rows in args.rows:
        inputs = {k: torch.randn(rows, k, dtype=dtype) for k in {k for _, k in LAYER_SHAPES + [LM_HEAD]}}
        repeats = max(2, int(3e9 // (rows * weight_bytes)) + 1)
        seconds = {name: _seconds(lambda calls=calls: [call(inputs[w.shape[1]]) for call, w in zip(calls, weights)],
                                  repeats) for name, calls in paths.items()}
        flops = 2 * rows * weight_bytes / weights[0].element_size()
        cells = [f"{s * 1e3:10.1f} {weight_bytes / s / 1e9:5.1f} {flops / s / 1e9:5.0f}"
                 for s in seconds.values()]
        ratio = f"  {seconds['oneDNN'] / seconds['panels 2M']:.2f}x" if "panels" in seconds else ""
        print(f"{rows:5} " + " ".join(cells) + ratio)


if __name__ == "__main__":
    main()
