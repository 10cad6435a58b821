"""Packages beyond opforge's dependencies: each part that needs one names the extra of ``pip install``
that brings it (pyproject.toml's [project.optional-dependencies]), and fails before its work when the
package is missing. Missing packages are made so in a fresh process: ``sys.modules[name] = None``
makes its import fail as an absent package's does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def without(module: str, script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` run with ``args`` in a fresh interpreter where ``module`` cannot be imported."""
    code = f"import sys\nsys.modules[{module!r}] = None\n" + textwrap.dedent(script)
    env = {**os.environ, "OPFORGE_QUIET": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def test_every_extra_named_in_the_sources_is_in_pyproject():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = set()
    for path in (ROOT / "python" / "opforge").rglob("*.py"):
        text = path.read_text()
        named |= set(re.findall(r"""\brequire\(\s*"[\w.]+",\s*"(\w+)\"""", text))
        named |= set(re.findall(r"""\binstall\(\s*['"](\w+)['"]\s*\)""", text))
    assert {"test", "doctor", "jax"} <= named
    assert named <= set(extras), named - set(extras)
    assert "matplotlib" in " ".join(extras["doctor"]) and "pytest" in " ".join(extras["test"])
    assert {"onnx", "onnxscript", "onnxruntime"} <= {re.split(r"[<>=\[ ]", r)[0] for r in extras["onnx"]}


DOCTOR = """
import torch
from opforge.__main__ import main

class Model(torch.nn.Module):
    def forward(self, x):
        raise AssertionError("the model ran")

def make():
    return Model(), (torch.randn(2),)

sys.exit(main(["doctor", __name__ + ":make", "--plot", sys.argv[1]]))
"""


def test_doctor_s_plot_without_matplotlib_fails_before_profiling_naming_the_extra(tmp_path):
    proc = without("matplotlib", DOCTOR, str(tmp_path / "t.png"))
    assert proc.returncode == 2
    assert proc.stderr == (
        "opforge doctor: opforge.doctor's plot needs matplotlib, which this Python does not have "
        "(import of matplotlib halted; None in sys.modules): pip install 'opforge[doctor]'\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_doctor_demo_without_matplotlib_stops_before_its_work(tmp_path):
    script = f"""
    import runpy, opforge
    opforge.load_library = lambda *a, **k: (_ for _ in ()).throw(AssertionError("the demo built its op"))
    sys.argv = ["doctor_demo.py", "--device", "cpu", "--out", sys.argv[1]]
    runpy.run_path({str(ROOT / "examples" / "models" / "doctor_demo.py")!r}, run_name="__main__")
    """
    proc = without("matplotlib", script, str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "doctor_demo.py: opforge.doctor's plot needs matplotlib, which this Python does not have "
        "(import of matplotlib halted; None in sys.modules): pip install 'opforge[doctor]'\n"
    )
    assert list((tmp_path / "out").iterdir()) == []


def test_doctor_s_api_checks_matplotlib_before_the_model_runs(tmp_path):
    script = """
    import torch, opforge

    class Model(torch.nn.Module):
        def forward(self, x):
            raise AssertionError("the model ran")

    try:
        opforge.doctor(Model(), torch.randn(2), plot=sys.argv[1])
    except ImportError as e:
        print(e)
    try:
        opforge.plot_timelines({}, sys.argv[1])
    except ImportError as e:
        print(e)
    """
    proc = without("matplotlib", script, str(tmp_path / "t.png"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "opforge.doctor's plot needs matplotlib, which this Python does not have (import of matplotlib halted; "
        "None in sys.modules): pip install 'opforge[doctor]'",
        "opforge's timeline plot needs matplotlib, which this Python does not have (import of matplotlib halted; "
        "None in sys.modules): pip install 'opforge[doctor]'",
    ]


def test_new_without_pytest_says_which_extra_brings_it(tmp_path):
    script = "from opforge.__main__ import main\nsys.exit(main(['new', 'demo::scaled', '--dir', sys.argv[1]]))\n"
    proc = without("pytest", script, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "scaled"
    assert proc.stdout.splitlines()[-2:] == [
        f"next: edit scaled.cpp and kernels/scaled.cu, then `opforge verify {folder}` and "
        f"`pytest {folder / 'test_scaled.py'}`",
        "pytest is not installed in this Python: pip install 'opforge[test]'",
    ]
    with_pytest = subprocess.run(
        [sys.executable, "-m", "opforge", "new", "demo::scaled", "--dir", str(tmp_path / "again")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert with_pytest.stdout.splitlines()[-1].startswith("next: edit scaled.cpp")


@pytest.mark.parametrize("name", ["jax", "onnx"])
def test_a_submodule_without_its_package_names_the_extra(name):
    """opforge.jax without jax, opforge.onnx without onnx (each extra is named after its package)."""
    proc = without(name, f"import opforge.{name}\n")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ImportError: opforge.{name} needs {name}, which this Python does not have (import of {name} halted; None in "
        f"sys.modules): pip install 'opforge[{name}]'"
    )


def test_onnx_session_options_without_onnxruntime_names_the_extra():
    script = """
    import opforge.onnx
    try:
        opforge.onnx.session_options([])
    except ImportError as e:
        print(e)
    """
    proc = without("onnxruntime", script)
    assert (proc.returncode, proc.stdout) == (
        0,
        "opforge.onnx.session_options needs onnxruntime, which this Python does not have (import of onnxruntime "
        "halted; None in sys.modules): pip install 'opforge[onnx]'\n",
    )
