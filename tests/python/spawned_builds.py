"""What the processes of test_build.py's concurrent-build test run, in a module of its own: it
imports opforge alone (neither torch nor pytest), so a process that ``multiprocessing``'s spawn
starts for it is ready in a fraction of a second instead of torch's seconds of import."""

from __future__ import annotations

from pathlib import Path

import opforge


def build_when_all_are_ready(barrier, src: Path, build_dir: Path, results) -> None:
    """Builds the library ``shared_ops`` from ``src`` into ``build_dir`` as soon as every process
    has reached ``barrier`` (a multiprocessing Barrier); puts the library's path, or "failed: "
    and the BuildError's message, on ``results`` (a multiprocessing Queue)."""
    barrier.wait()
    try:
        results.put(str(opforge.build_library("shared_ops", [src], build_dir=build_dir)))
    except opforge.BuildError as e:
        results.put(f"failed: {e}")
