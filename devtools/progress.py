"""Progress bars for long dev work (the demo's produce step, the rehearsal's scenarios), with ``rich``.

Drawn on stderr, and only when stderr is a terminal: under ``make`` in CI, in a pipe or in
pytest nothing is drawn, and the plain lines the tools print stay the whole log. The ``lake``
CLI's ``backfill --wait`` draws its own bar the same way (``kafka_iceberg.lake_assets.backfill_cli.wait_for_backfill``).
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def on_terminal() -> bool:
    """Whether stderr is a terminal (the bars are drawn only then)."""
    return sys.stderr.isatty()


def progress_bar(transient: bool = True) -> Progress:
    """A ``rich.progress.Progress`` (use it as a context manager; ``add_task(description, total=N)``)
    with description, bar, ``done/total``, elapsed and remaining time; disabled off a terminal.
    ``transient``: the bar disappears when done, leaving only the tool's own lines."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not on_terminal(),
        transient=transient,
    )


__all__ = ["on_terminal", "progress_bar"]
