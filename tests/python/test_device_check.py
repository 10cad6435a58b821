"""tools/device_check.sh splits the suite into calls that fit the GPU machine's limit: ``tests
K/N`` builds, then runs the K-th of N groups of the Python tests (run_options.py's --group).
Run here with stand-ins for make, python3 and nvidia-smi that record how they were called."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The environment variables that tune device_check.sh's steps (its header names them).
SETTINGS = ("PYTEST_LIMIT", "PYTEST_WORKERS", "PYTEST_SELECT", "SANITIZE_GROUPS", "BENCH_ARGS")
SETTINGS += ("NCU_GROUP", "NCU_KERNELS")


def device_check(tmp_path: Path, *steps: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Runs tools/device_check.sh with ``steps``, its logs in ``tmp_path/out``, with make, python3
    and nvidia-smi replaced by scripts that print their arguments, and the script's settings
    (SETTINGS) at their defaults even where the caller's environment sets them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("make", "python3", "nvidia-smi"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*"\n')
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}  # the script's defaults, whoever runs it
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    run = subprocess.run(
        ["bash", str(ROOT / "tools" / "device_check.sh"), *steps], env=env, capture_output=True, text=True
    )
    return run, tmp_path / "out"


def test_tests_k_of_n_builds_then_runs_that_group_of_the_python_tests(tmp_path):
    run, out = device_check(tmp_path, "cpp", "tests", "2/3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "cpp.log").read_text() == "make test-cpp\n"
    assert (out / "build.log").read_text() == "make build\n"
    assert (out / "tests_2_of_3.log").read_text() == (
        "python3 -m pytest -q -rfEs --durations=30 -p no:logging -n 14 tests/python --group 2/3\n"
    )
    assert run.stdout.index("=== build:") < run.stdout.index("=== tests_2_of_3:")
    # Interrupted before the call's limit, so that pytest's summary names the failures so far.
    assert "=== tests_2_of_3: timeout --signal=INT --kill-after=30 480 python3 -m pytest" in run.stdout


def test_tests_without_its_group_is_refused(tmp_path):
    run, out = device_check(tmp_path, "tests", "cpp")
    assert run.returncode == 1
    assert (
        run.stderr
        == "device_check.sh: tests takes the group to run, K/N (tools/device_check.sh tests 1/3), got 'cpp'\n"
    )
    assert (out / "cpp.log").exists()  # the next step still runs
