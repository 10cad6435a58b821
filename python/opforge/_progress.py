"""Progress display for opforge's long steps (builds, export, AOTInductor packaging), with rich."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def status(message: str) -> Iterator[None]:
    """Show ``message`` with a spinner and the elapsed time while the block runs.

    Shown on standard error when it is a terminal (and ``OPFORGE_QUIET`` is unset); elsewhere
    (logs, CI, pytest) nothing is printed.
    """
    if os.environ.get("OPFORGE_QUIET") or not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        progress.add_task(message, total=None)
        yield
