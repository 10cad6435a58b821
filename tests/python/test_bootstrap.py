"""tools/bootstrap.sh: creating the Python environment says what it does, step by step with each
step's time, on standard error whatever it is (a log: no terminal), and prints only the
interpreter's path on standard output; a second run finds the environment and says nothing.
Run on a copy of the script beside a small requirements.txt, with stand-ins for python3 and pip
(a real environment downloads a few GB)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: A stand-in for ``python3 -m venv DIR`` whose DIR/bin/python accepts ``-m pip ...``.
FAKE_PYTHON3 = """#!/bin/sh
[ "$1 $2" = "-m venv" ] || exit 3
mkdir -p "$3/bin"
printf '#!/bin/sh\\necho "pip $*" >> "%s/pip.log"\\n' "$3" > "$3/bin/python"
chmod +x "$3/bin/python"
"""

#: The same, whose pip fails (exit 7) to install requirements.txt, as without the package index.
FAILING_PIP_PYTHON3 = """#!/bin/sh
[ "$1 $2" = "-m venv" ] || exit 3
mkdir -p "$3/bin"
printf '#!/bin/sh\\ncase "$*" in *-r*) exit 7;; esac\\n' > "$3/bin/python"
chmod +x "$3/bin/python"
"""


#: The same, whose pip takes 3.5 s to install requirements.txt.
SLOW_PIP_PYTHON3 = """#!/bin/sh
[ "$1 $2" = "-m venv" ] || exit 3
mkdir -p "$3/bin"
printf '#!/bin/sh\\ncase "$*" in *-r*) sleep 3.5;; esac\\n' > "$3/bin/python"
chmod +x "$3/bin/python"
"""


def fake_clone(tmp_path: Path, python3: str) -> tuple[Path, dict[str, str]]:
    """A copy of bootstrap.sh beside a small requirements.txt, and an environment whose python3
    is the stand-in ``python3`` (script text), its environments under ``tmp_path/venvs``."""
    clone = tmp_path / "clone"
    (clone / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "bootstrap.sh", clone / "tools" / "bootstrap.sh")
    (clone / "requirements.txt").write_text("# the environment\ntorch==2.11.0\n\nnumpy>=2.0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(python3)
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_PYTHON"}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", OPFORGE_VENV_ROOT=str(tmp_path / "venvs"))
    return clone, env


def test_creating_the_environment_says_each_step_and_a_second_run_nothing(tmp_path):
    clone, env = fake_clone(tmp_path, FAKE_PYTHON3)

    def bootstrap() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(clone / "tools" / "bootstrap.sh")], capture_output=True, text=True, env=env, timeout=60
        )

    first = bootstrap()
    assert first.returncode == 0, first.stderr
    (venv,) = [p for p in (tmp_path / "venvs").glob("venv-*") if p.is_dir()]
    assert first.stdout == f"{venv}/bin/python\n"
    said = re.sub(r"done in \d+ s", "done in N s", first.stderr)
    assert said.splitlines() == [
        f"opforge: creating the Python environment {venv} for requirements.txt (first run only; a few minutes: "
        "torch and the other packages are a few GB)",
        "opforge: creating the virtual environment",
        "opforge:   done in N s",
        "opforge: upgrading pip",
        "opforge:   done in N s",
        "opforge: installing 2 packages of requirements.txt with their dependencies",
        "opforge:   done in N s",
    ]
    # off a terminal, pip runs quietly: its progress bars are for terminals
    assert (venv / "pip.log").read_text().splitlines() == [
        "pip -m pip install --quiet --upgrade pip",
        f"pip -m pip install --quiet -r {clone / 'requirements.txt'}",
    ]
    second = bootstrap()
    assert (second.returncode, second.stdout, second.stderr) == (0, first.stdout, "")


def test_a_failed_install_says_so_and_names_the_interpreter_way(tmp_path):
    """pip failing (no package index, as on the GPU machine) ends the script with the step that
    failed and how to use a Python that has torch instead; nothing on standard output, so make
    stops; the next run starts the environment again."""
    clone, env = fake_clone(tmp_path, FAILING_PIP_PYTHON3)
    run = subprocess.run(
        ["bash", str(clone / "tools" / "bootstrap.sh")], capture_output=True, text=True, env=env, timeout=60
    )
    assert (run.returncode, run.stdout) == (1, "")
    said = re.sub(r"done in \d+ s", "done in N s", run.stderr).splitlines()
    assert said[-3:] == [
        "opforge: installing 2 packages of requirements.txt with their dependencies",
        "opforge:   failed (exit 7): the environment is incomplete; the next run creates it again.",
        "opforge: a Python that already has torch==2.11.0 (the way on a machine without the package index) can be "
        "used instead: OPFORGE_PYTHON=python3 make test",
    ]
    (venv,) = [p for p in (tmp_path / "venvs").glob("venv-*") if p.is_dir()]
    assert not (venv / ".complete").exists()


def test_a_new_environment_removes_all_but_the_most_recently_used_earlier_one(tmp_path):
    """Each requirements.txt has its environment (a few GB); creating one removes those of earlier
    requirements except the most recently used, and leaves other folders alone."""
    clone, env = fake_clone(tmp_path, FAKE_PYTHON3)
    venvs = tmp_path / "venvs"
    earlier = [venvs / f"venv-{d * 16}" for d in "abc"]
    for age, folder in enumerate(earlier):  # venv-aaaa... used last, venv-cccc... first
        folder.mkdir(parents=True)
        (folder / ".complete").touch()
        os.utime(folder / ".complete", (1e9 - age, 1e9 - age))
    other = venvs / "torch-check-2.10.0"
    other.mkdir()
    run = subprocess.run(
        ["bash", str(clone / "tools" / "bootstrap.sh")], capture_output=True, text=True, env=env, timeout=60
    )
    assert run.returncode == 0, run.stderr
    created = Path(run.stdout.strip()).parents[1]
    assert sorted(p for p in venvs.iterdir() if p.is_dir()) == sorted([created, earlier[0], other])
    assert [line for line in run.stderr.splitlines() if "removing" in line] == [
        f"opforge: removing {folder}, the environment of an earlier requirements.txt" for folder in earlier[1:]
    ]


def test_off_a_terminal_a_long_step_says_it_is_still_running(tmp_path):
    """pip prints nothing in a log until it ends (minutes for torch): the step says it is still
    running every OPFORGE_HEARTBEAT_S seconds (30 by default), and a step's end ends the lines."""
    clone, env = fake_clone(tmp_path, SLOW_PIP_PYTHON3)
    env["OPFORGE_HEARTBEAT_S"] = "1"
    run = subprocess.run(
        ["bash", str(clone / "tools" / "bootstrap.sh")], capture_output=True, text=True, env=env, timeout=60
    )
    assert run.returncode == 0, run.stderr
    said = re.sub(r"done in \d+ s", "done in N s", run.stderr).splitlines()
    install = said.index("opforge: installing 2 packages of requirements.txt with their dependencies")
    beats = said[install + 1 : -1]
    assert len(beats) >= 2 and beats == [f"opforge:   still running after {k} s" for k in range(1, len(beats) + 1)]
    assert said[-1] == "opforge:   done in N s"
    assert not any("still running" in line for line in said[:install])
