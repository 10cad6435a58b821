"""torch.compile's on-disk caches and rebuilt op libraries: a library rebuilt with another
declaration (here its backward op's arguments in another order) must not be given graphs that
were compiled against the old one (opforge._compile_caches), whatever the order in which the
caller sets its own cache key tag and loads libraries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).parent / "fixtures" / "compile_cache_child.py"


def gradient_errors(tmp_path: Path, *extra: str) -> list[float]:
    """Runs the child twice in fresh processes sharing one Inductor cache: the op library built
    with its backward op's arguments as (grad_y, x), then rebuilt at the same path as (x, grad_y);
    returns each run's gradient error."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    errors = []
    for order in ("grad_first", "x_first"):
        proc = subprocess.run(
            [sys.executable, str(CHILD), order, str(tmp_path), *extra], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        errors.append(float(proc.stdout.strip().splitlines()[-1]))
    return errors


def test_a_rebuilt_library_gets_freshly_compiled_graphs(tmp_path):
    assert max(gradient_errors(tmp_path)) < 1e-4


def test_a_tag_the_caller_sets_after_loading_keeps_the_digest(tmp_path):
    assert max(gradient_errors(tmp_path, "tag_after")) < 1e-4


def test_without_the_tag_the_stale_graph_is_replayed(tmp_path):
    """The hazard the tag removes, shown with it turned off: the second process replays the
    backward graph cached for the first library, which passes the backward op its arguments in
    the old order."""
    first, second = gradient_errors(tmp_path, "untagged")
    assert first < 1e-4
    assert second > 1.0, "the Inductor caches did not replay the old graph: this test no longer shows the hazard"
