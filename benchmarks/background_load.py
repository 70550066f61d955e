"""Throughput on a shared CPU: `llmctl bench offline` (default model, 16 × 64 → 64 tokens, greedy) on a
quiet machine and beside one busy process (a Python loop pinned to nothing, as any neighbour), with the
thread count llmctl chooses itself (it gives way to the neighbour, llmctl.engine.worker.cpu_share) and
with the count fixed (`--cpu-threads N`: all of this machine's cores, what it ran on before). Fresh
processes, alternating, median of `--runs`.

    python benchmarks/background_load.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

BENCH = ["-m", "llmctl", "bench", "offline", "--num-prompts", "16", "--random-input-len", "64",
         "--random-output-len", "64", "--temperature", "0"]


def output_rate(extra: list[str]) -> float:
    """Output tok/s of one fresh `llmctl bench offline` run."""
    out = subprocess.run([sys.executable, *BENCH, *extra], capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("llmctl"))
    return float(row.split("│")[4])


def measure(runs: int, busy: bool) -> dict[str, float]:
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        rates: dict[str, list[float]] = {"chosen by llmctl": [], "fixed": []}
        for _ in range(runs):
            rates["chosen by llmctl"].append(output_rate([]))
            rates["fixed"].append(output_rate(["--cpu-threads", str(len(os.sched_getaffinity(0)))]))
        return {name: statistics.median(values) for name, values in rates.items()}
    finally:
        if neighbour is not None:
            neighbour.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    quiet, busy = measure(args.runs, busy=False), measure(args.runs, busy=True)
    print(f"{len(os.sched_getaffinity(0))} cores; output tok/s, median of {args.runs}")
    for name in quiet:
        print(f"threads {name:>16}: quiet {quiet[name]:6.1f}, one busy neighbour {busy[name]:6.1f} "
              f"({busy[name] / quiet[name]:.2f}× quiet)")
    best_quiet = max(quiet.values())
    print(f"beside the neighbour, llmctl's own choice keeps {busy['chosen by llmctl'] / best_quiet:.2f}× the best "
          "quiet rate")


if __name__ == "__main__":
    main()
