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
