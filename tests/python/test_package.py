"""What ``import opforge`` gives a fresh process: its submodules on first use (as torch's), with no
torch imported until a PyTorch name is used, and its version, read from pyproject.toml (in an
installed opforge, from the package's metadata, which pip writes from that file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import opforge

ROOT = Path(__file__).resolve().parents[2]


def fresh(script: str) -> str:
    """``script``'s standard output in a fresh interpreter (asserting it succeeded)."""
    env = {**os.environ, "OPFORGE_QUIET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_submodules_load_on_first_use_after_a_plain_import():
    out = fresh(
        """
        import sys
        import opforge
        print("torch" in sys.modules)
        print(callable(opforge.aoti.package), callable(opforge.aoti.run))
        print(callable(opforge.verify.verify_op), opforge.verify is sys.modules["opforge.verify"])
        print(opforge.scaffold.__name__, opforge.stubs.__name__, opforge.distributed.__name__)
        try:
            opforge.no_such_thing
        except AttributeError as e:
            print(e)
        try:
            opforge._private
        except AttributeError as e:
            print(e)
        """
    )
    assert out.splitlines() == [
        "False",  # import opforge imports no torch
        "True True",
        "True True",
        "opforge.scaffold opforge.stubs opforge.distributed",
        "module 'opforge' has no attribute 'no_such_thing'",
        "module 'opforge' has no attribute '_private'",
    ]


def test_the_jax_submodule_loads_on_first_use_without_torch():
    import pytest

    pytest.importorskip("jax")
    out = fresh("import sys, opforge; print(callable(opforge.jax.load_library), 'torch' in sys.modules)")
    assert out == "True False\n"


def pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"$', text, re.MULTILINE)[1]


def test_the_version_is_pyproject_s():
    assert opforge.__version__ == pyproject_version()
    out = fresh("import sys, opforge; print(opforge.__version__, 'torch' in sys.modules)")
    assert out == f"{pyproject_version()} False\n"
