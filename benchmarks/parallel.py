"""Offline throughput of the default model at several layouts, in one run (machines here are noisy).

    .venv/bin/python benchmarks/parallel.py [--num-prompts 16] [--input-len 64] [--output-len 64]
        [--layouts tp1 pp2 tp3 dp2 tp1]

Each layout is its own `llmctl bench offline` process; TP 1 runs first and last by default, so
the machine's drift shows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

LAYOUT_FLAGS = {"tp1": [], "pp2": ["--pp", "2"], "tp2": ["--tp", "2"], "tp3": ["--tp", "3"], "dp2": ["--dp", "2"]}
DEFAULT_LAYOUTS = ["tp1", "pp2", "tp3", "dp2", "tp1"]  # TP 1 twice: before and after the others


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUT_FLAGS), default=DEFAULT_LAYOUTS)
    args = parser.parse_args()
    for layout in args.layouts:
        flags = LAYOUT_FLAGS[layout]
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "llmctl", "bench", "offline", "--num-prompts", str(args.num_prompts),
             "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
             "--temperature", "0", "--max-model-len", "512", "--json", *flags],
            capture_output=True, text=True, check=True)
        report = json.loads(result.stdout)
        tokens = report.get("output_tokens_per_s") or report.get("llmctl", {}).get("output_tokens_per_s")
        print(f"{' '.join(flags) or 'TP 1':>10}: {tokens:8.1f} output tok/s   "
              f"(process wall {time.perf_counter() - started:5.1f} s)", flush=True)


if __name__ == "__main__":
    main()
