"""The Python sources keep the rules of ruff.toml: `ruff check` and `ruff format --check` over the
clone, with the ruff that requirements.txt pins."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed in this Python (requirements.txt pins it; a python3 of the GPU machine has none)",
)


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(command):
    run = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", str(ROOT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
