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


def test_creating_the_environment_says_each_step_and_a_second_run_nothing(tmp_path):
    clone = tmp_path / "clone"
    (clone / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "bootstrap.sh", clone / "tools" / "bootstrap.sh")
    (clone / "requirements.txt").write_text("# the environment\ntorch==2.11.0\n\nnumpy>=2.0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_PYTHON"}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", OPFORGE_VENV_ROOT=str(tmp_path / "venvs"))

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
