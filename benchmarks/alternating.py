"""Peers measured in one script run, alternating: each round runs every engine once, in the same order, so the
machine's noise spreads over all of them; each figure is then a median against the peer's."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def alternate(names: list[str], rounds: int, run: Callable[[str], float],
              after_round: Callable[[dict[str, list[float]]], None] | None = None) -> dict[str, list[float]]:
    """{name: one figure per round}; `after_round` sees the figures so far (to write them out)."""
    figures: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            figures[name].append(run(name))
        if after_round is not None:
            after_round(figures)
    return figures


def median_ratios(figures: dict[str, list[float]], base: str) -> dict[str, tuple[float, float | None]]:
    """{name: (median, median ÷ the base's median, None without the base)}."""
    reference = statistics.median(figures[base]) if figures.get(base) else None
    return {name: (statistics.median(values), statistics.median(values) / reference if reference else None)
            for name, values in figures.items()}


def worker_figure(command: list[str], env: dict[str, str], key: str, engine: str) -> float:
    """Run one engine's worker process; its last JSON line's `key` (the process's error ends the script)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        sys.exit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])[key]


def decode_tokens_per_second(llm, prompt: list[int], output_tokens: int, repeat: int) -> float:
    """One stream's decode rate: (output_tokens − 1) / (time for output_tokens − time for 1), each the median of
    `repeat` greedy requests of `prompt` on a warmed engine (the prompt's prefill cancels out)."""
    import time

    from llmctl import SamplingParams

    def timed(tokens: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            llm.generate([{"prompt_token_ids": prompt}], params)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    timed(8)  # warm-up
    return (output_tokens - 1) / (timed(output_tokens) - timed(1))


def rounds_parser(description: str, folder: str):
    """The arguments of a script that builds models into `folder` and runs each in a fresh worker process:
    --rounds, --repeat, --dir and --worker (the worker's own call)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(folder))
    parser.add_argument("--worker")
    return parser
