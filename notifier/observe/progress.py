"""The one progress bar, for sending and for drafting: on a terminal's stderr only."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A bar labelled `label` on a terminal's stderr; elsewhere (a pipe, a log) nothing,
    and rich is not even loaded."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console  # noqa: PLC0415 (start-up time)
    from rich.progress import (  # noqa: PLC0415 (start-up time)
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True, emoji=False)  # a label names files and runs as written
    with Progress(
        TextColumn(label, markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
