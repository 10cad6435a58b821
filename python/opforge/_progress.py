"""What opforge's long steps (builds, export, AOTInductor packaging) say while they run.

Note [Long steps say what they do]: a step that can take more than a moment says so on standard
error, whatever standard output is: on a terminal, its message with a spinner and the elapsed
time (rich), gone when the step ends; elsewhere (a log, CI, a pipe, a notebook), its message as
one line, printed once the step has run ``after_s`` seconds, so that a step with nothing to do
(an op library already up to date) prints nothing, and then "opforge:   still running after N s"
every HEARTBEAT_S seconds until it ends (as pip does in a log), so that no minute passes silent.
A step known to be long (building the adapter) passes ``after_s=0``. ``$OPFORGE_QUIET`` (any
non-empty value) silences all of it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

#: Seconds a step runs before it is announced off a terminal (see the module docstring).
ANNOUNCE_AFTER_S = 1.0
#: Seconds between the lines that say an announced step is still running, off a terminal.
HEARTBEAT_S = 30.0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def note(line: str) -> None:
    """Say ``line`` on standard error once, unless ``$OPFORGE_QUIET`` is set: something opforge
    did that the user did not ask for (a stale build removed)."""
    if not os.environ.get("OPFORGE_QUIET"):
        _say(line)


def _announce(message: str, after_s: float, done: threading.Event) -> None:
    """Off a terminal: ``message`` once the step has run ``after_s`` seconds (at once, by the
    caller, where ``after_s`` <= 0), then a line every HEARTBEAT_S seconds, until ``done`` is set."""
    after_s = max(after_s, 0.0)
    if after_s > 0:
        if done.wait(after_s):
            return
        _say(message)
    beats = 0
    while not done.wait(HEARTBEAT_S):
        beats += 1
        _say(f"opforge:   still running after {after_s + beats * HEARTBEAT_S:.0f} s")


@contextlib.contextmanager
def status(message: str, *, after_s: float = ANNOUNCE_AFTER_S) -> Iterator[None]:
    """Say ``message`` on standard error while the block runs (Note [Long steps say what they do]).

    Args:
        message: one line: what runs and, for a step a user did not ask for, why
            ("opforge: building the PyTorch adapter for torch 2.11.0 (...)").
        after_s: seconds the block runs before ``message`` is printed off a terminal (0: at once).
    """
    if os.environ.get("OPFORGE_QUIET"):
        yield
        return
    if not sys.stderr.isatty():
        if after_s <= 0:
            _say(message)  # before the step's own output
        done = threading.Event()
        announcer = threading.Thread(target=_announce, args=(message, after_s, done), daemon=True)
        announcer.start()
        try:
            yield
        finally:
            done.set()
            announcer.join()
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
