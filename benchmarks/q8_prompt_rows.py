"""Prompts through 4-bit GGUF codes: q8_linear (int8 activations, the codes read in place) against decoding the
weight once into float32 for torch's GEMM, on the shapes of the default model and of a Llama-3.2-1B-class one.
The ratio decides `CodedWeight.integer_prompts` (llmctl/engine/layers/coded_linear.py).

    python benchmarks/q8_prompt_rows.py [--rows 128,512] [--isa avx2]   # --isa: held, see benchmarks/held_isa.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable

from held_isa import HELD_TO, held_environment

SHAPES = [(960, 576), (1536, 576), (576, 1536), (49152, 576), (2048, 2048), (3072, 2048), (16384, 2048),
          (2048, 8192)]  # (outputs, inputs): SmolLM2-135M's qkv, gate/up, down, LM head; a 1B's o, qkv, gate+up, down


def seconds(run: Callable[[], object], repeats: int = 4) -> float:
    run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats


def measure(rows: list[int]) -> None:
    import torch
    import torch.nn.functional as F

    from llmctl.engine.layers.coded_linear import CodedWeight
    from llmctl.kernels import cpu

    print(f"{'outputs':>8} {'inputs':>7} {'rows':>5} {'q8_linear ms':>13} {'decode+GEMM ms':>15} {'ratio':>6}  "
          f"(VNNI: {cpu.q8_vnni()})")
    gen = torch.Generator().manual_seed(0)
    for outputs, inputs in SHAPES:
        codes = torch.randint(0, 256, (outputs, inputs // 2), dtype=torch.uint8, generator=gen)
        scales = torch.rand(outputs, inputs // 32, generator=gen) * 0.01
        weight = CodedWeight(codes, scales, -scales / 2, int8_activations=True)
        for count in rows:
            x = torch.randn(count, inputs, generator=gen)
            integer = seconds(lambda: cpu.q8_linear(x, weight.codes, weight.scales, weight.offsets, None))
            floating = seconds(lambda: F.linear(x, weight.dequantize()))
            print(f"{outputs:>8} {inputs:>7} {count:>5} {integer * 1e3:>13.2f} {floating * 1e3:>15.2f} "
                  f"{integer / floating:>6.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="128,512")
    parser.add_argument("--isa", choices=("native", *HELD_TO), default="native")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.worker or args.isa == "native":
        measure(rows)
        return
    env = {**os.environ, **held_environment(args.isa)}  # held before torch is imported: a fresh process
    subprocess.run([sys.executable, __file__, "--rows", args.rows, "--worker"], env=env, check=True)


if __name__ == "__main__":
    main()
