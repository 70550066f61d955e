"""Rich progress bars for long work, drawn on stderr so --json output stays clean."""

from __future__ import annotations

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
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)
