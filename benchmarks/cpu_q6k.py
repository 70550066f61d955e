"""Q6_K weights (8-bit codes in 16-wide groups, as GGUF's Q4_K_M files hold their attn_v, half their ffn_down
and their output) on the CPU: float32 activations (`int8_linear`, codes converted as they are multiplied) against
int8 activations (`q8_linear`'s 16-wide-group path, as llama.cpp's Q8_K dot products). One decode step's worth of
an 8B model's Q6_K share: `--weights` distinct [4096, 4096] / [4096, 14336] weights cycled (larger than the
caches), 1 to 8 rows, fastest of 10 passes, both paths interleaved.

    python benchmarks/cpu_q6k.py [--threads 2] [--weights 12]
"""

from __future__ import annotations

import argparse

import torch
from cpu_int4 import fastest

from llmctl.kernels import cpu


def q6_k_like(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes in Q6_K's range (q − 32 for q in 0..63), one float32 scale per 16, no offsets."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(-32, 32, (rows, columns), dtype=torch.int8, generator=generator)
    scales = torch.rand(rows, columns // 16, generator=generator) * 1e-3
    return codes, scales, torch.zeros_like(scales)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--weights", type=int, default=12)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [(4096, 4096), (4096, 14336)]
    weights = [q6_k_like(*shapes[i % 2], seed=i) for i in range(args.weights)]
    megabytes = sum(c.numel() + s.numel() * 4 for c, s, _ in weights) / 1e6
    print(f"{torch.get_num_threads()} threads; {args.weights} Q6_K-like weights, {megabytes:.0f} MB as llmctl holds them")
    print(f"{'rows':>5} {'float act. ms':>14} {'int8 act. ms':>13} {'speed-up':>9}")
    for rows in (1, 2, 4, 8):
        inputs = {k: torch.randn(rows, k) for k in {s[1] for s in shapes}}
        float_path = fastest(lambda: [cpu.int8_linear(inputs[c.shape[1]], c, s, o) for c, s, o in weights], 10)
        int8_path = fastest(lambda: [cpu.q8_linear(inputs[c.shape[1]], c, s, o, None, offsets_used=False)
                                          for c, s, o in weights], 10)
        print(f"{rows:5} {float_path * 1e3:14.1f} {int8_path * 1e3:13.1f} {float_path / int8_path:8.2f}x")


if __name__ == "__main__":
    main()
