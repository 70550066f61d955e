"""Offline throughput, startup and per-rank memory of the default model at several layouts, in one
run (machines here are noisy).

    .venv/bin/python benchmarks/parallel.py [--num-prompts 64] [--input-len 128] [--output-len 128]
        [--temperature 1.0] [--layouts tp1 pp2 tp3 dp2] [--repeat 3] [--even-heads]

SmolLM2's 9 heads split over 1, 3 or 9 ranks, never 2. `--even-heads` runs a random-weight model of
SmolLM2's shape (30 layers, hidden 576, intermediate 1536, its tokenizer and vocabulary) with 8 query
heads and 2 K/V heads of 64, built once into a temporary folder, so TP 2 can be measured
(`--even-heads --layouts tp1 tp2 pp2 dp2`). `--model DIR` runs another model: a mixture of experts from
benchmarks/moe_models.py with `--layouts tp1 dp2 dp2-ep` compares replicas holding every expert with
replicas sharing them (EP = TP × DP).

The workload defaults are `llmctl bench offline`'s. Each run is its own `llmctl bench offline`
process; the layouts alternate, `--repeat` times over, and the summary gives each layout's median
output tok/s, its range, and its median over TP 1's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUT_FLAGS = {"tp1": [], "pp2": ["--pp", "2"], "tp2": ["--tp", "2"], "tp3": ["--tp", "3"], "dp2": ["--dp", "2"],
                "dp2-ep": ["--dp", "2", "--enable-expert-parallel"]}  # MoE: experts spread over the replicas
GiB = 1024**3


def even_headed_model(folder: Path) -> Path:
    """SmolLM2-135M's shape with 8 query heads and 2 K/V heads (head_dim 64), random weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from llmctl.checkpoint.source import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=64, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_layout(flags: list[str], args: argparse.Namespace) -> dict:
    model = [args.model] if args.model else []
    result = subprocess.run(
        [sys.executable, "-m", "llmctl", "bench", "offline", *model, "--num-prompts", str(args.num_prompts),
         "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
         "--temperature", str(args.temperature), "--max-model-len", "512", "--json", *flags],
        capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUT_FLAGS), default=["tp1", "pp2", "tp3", "dp2"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--even-heads", action="store_true",
                        help="a random-weight SmolLM2-shaped model with 8 heads / 2 K/V heads, so TP 2 runs")
    parser.add_argument("--model", help="a model folder (default: the default model)")
    args = parser.parse_args()
    if args.even_heads:
        with tempfile.TemporaryDirectory(prefix="llmctl-parallel-") as folder:
            args.model = str(even_headed_model(Path(folder)))
            measure(args)
    else:
        measure(args)


def measure(args: argparse.Namespace) -> None:
    speeds: dict[str, list[float]] = {layout: [] for layout in args.layouts}
    for _ in range(args.repeat):
        for layout in args.layouts:
            report = run_layout(LAYOUT_FLAGS[layout], args)
            speed = report["llmctl"]["output_tokens_per_s"]
            speeds[layout].append(speed)
            ranks = ", ".join(f"{r['weights_bytes'] / GiB:.3f}+{r['kv_cache_bytes'] / GiB:.2f}" for r in report["ranks"])
            print(f"{layout:>6}: {speed:7.1f} output tok/s, startup {report['startup_s']:5.2f} s, "
                  f"weights+KV GiB per rank {ranks}", flush=True)
    base = statistics.median(speeds["tp1"]) if speeds.get("tp1") else None
    print("median (min-max) output tok/s" + (", median / TP 1's" if base else ""))
    for layout, values in speeds.items():
        ratio = f"  {statistics.median(values) / base:.2f}x" if base else ""
        print(f"{layout:>6}: {statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f}){ratio}")


if __name__ == "__main__":
    main()
