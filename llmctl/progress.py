"""Rich progress bars for long work, drawn on stderr so --json output stays clean; where stderr is not a
terminal (a redirected log), plain lines instead, which a bar cannot leave there."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

stderr_console = Console(stderr=True)


@contextmanager
def progress_bar(description: str, total: int, *, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """Yield an ``advance()`` callable; draws nothing when disabled."""
    if not enabled:
        yield lambda: None
        return
    if not stderr_console.is_terminal:
        yield _progress_lines(description, total)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def _progress_lines(description: str, total: int) -> Callable[[], None]:
    """"DESCRIPTION: 3/30 (12 s)" per step up to 64 steps (each layer of a model), else about every 5 %."""
    started, done = time.perf_counter(), 0
    every = 1 if total <= 64 else -(-total // 20)

    def advance() -> None:
        nonlocal done
        done += 1
        if done % every == 0 or done == total:
            print(f"{description}: {done}/{total} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
                  flush=True)

    return advance
