"""torch.compile's on-disk caches and rebuilt op libraries: a library rebuilt with another
declaration (here its backward op's arguments in another order) must not be given graphs that
were compiled against the old one (opforge._compile_caches), whatever the order in which the
caller sets its own cache key tag and loads libraries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).parent / "fixtures" / "compile_cache_child.py"


@pytest.fixture(scope="module")
def library_folder(tmp_path_factory) -> Path:
    """The folder the children build the cube library in, shared by this file's tests: each child
    rebuilds it from the source it writes, and a later test's first child finds it configured."""
    return tmp_path_factory.mktemp("cachetest")


def gradient_errors(library_folder: Path, tmp_path: Path, *extra: str) -> list[float]:
    """Runs the child twice in fresh processes sharing one Inductor cache (new for each test): the
    op library built with its backward op's arguments as (grad_y, x), then rebuilt at the same path
    as (x, grad_y); returns each run's gradient error."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    errors = []
    for order in ("grad_first", "x_first"):
        proc = subprocess.run(
            [sys.executable, str(CHILD), order, str(library_folder), *extra], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        errors.append(float(proc.stdout.strip().splitlines()[-1]))
    return errors


@pytest.mark.slow
def test_a_rebuilt_library_gets_freshly_compiled_graphs(library_folder, tmp_path):
    assert max(gradient_errors(library_folder, tmp_path)) < 1e-4


@pytest.mark.slow
def test_a_tag_the_caller_sets_after_loading_keeps_the_digest(library_folder, tmp_path):
    assert max(gradient_errors(library_folder, tmp_path, "tag_after")) < 1e-4


@pytest.mark.slow
def test_without_the_tag_the_stale_graph_is_replayed(library_folder, tmp_path):
    """The hazard the tag removes, shown with it turned off: the second process replays the
    backward graph cached for the first library, which passes the backward op its arguments in
    the old order."""
    first, second = gradient_errors(library_folder, tmp_path, "untagged")
    assert first < 1e-4
    assert second > 1.0, "the Inductor caches did not replay the old graph: this test no longer shows the hazard"
