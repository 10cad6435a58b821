"""A failing test's report stays readable: pytest.ini captures logged warnings and errors only, so
torch.compile's structured trace (hundreds of empty DEBUG records of the logger ``torch.__trace``
per compile) does not bury the failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAILING = """
import logging

import torch


def test_fails_after_a_compile():
    torch.compile(lambda x: x * 2, backend="aot_eager", fullgraph=True)(torch.randn(4))
    logging.getLogger("user").warning("a warning the user logged")
    assert 1 == 2
"""


def pytest_on(path: Path, *options: str) -> str:
    """pytest's output on ``path`` under this checkout's pytest.ini (and ``options``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pytest.ini"), "-p", "no:cacheprovider", *options, str(path)],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_a_failure_after_torch_compile_shows_logged_warnings_and_no_trace_records(tmp_path):
    test = tmp_path / "test_failing.py"
    test.write_text(FAILING)
    out = pytest_on(test)
    assert "assert 1 == 2" in out and "WARNING  user:test_failing.py" in out
    assert "torch.__trace" not in out
    # Without the setting (the report this test guards against), the trace records fill the report.
    assert pytest_on(test, "-o", "log_level=NOTSET").count("DEBUG    torch.__trace") > 10
