"""Long steps say what they do (Note [Long steps say what they do] in python/opforge/_progress.py):
one line on standard error off a terminal, a spinner on one, nothing for a step that ends at once;
the adapter's and runner's first build says what it builds and why, in a fresh process whose
output is not a terminal, and is keyed by what it depends on, not by how the interpreter is spelled."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

STEPS = textwrap.dedent(
    """
    import time
    from opforge._progress import status

    with status("opforge: a long step", after_s=0.2):
        time.sleep(1.0)
    with status("opforge: a quick step", after_s=30):
        pass
    with status("opforge: a step known to be long", after_s=0):
        pass
    print("done")
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_QUIET"}
    return {**env, **extra}


def test_off_a_terminal_a_long_step_says_one_line_and_a_quick_one_nothing():
    proc = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    assert proc.stderr == "opforge: a long step\nopforge: a step known to be long\n"


def test_off_a_terminal_a_step_says_every_heartbeat_that_it_still_runs():
    """Beats every 0.3 s here: a 1.5 s step announced at 0.2 s has four nominally; a loaded machine
    may wake the thread late, so between two and four, their times rising."""
    steps = textwrap.dedent(
        """
        import time
        from opforge import _progress

        _progress.HEARTBEAT_S = 0.3
        with _progress.status("opforge: a long step", after_s=0.2):
            time.sleep(1.5)
        with _progress.status("opforge: a step known to be long", after_s=0):
            time.sleep(1.0)
        """
    )
    proc = subprocess.run([sys.executable, "-c", steps], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    second = lines.index("opforge: a step known to be long")
    for step, beats in (("opforge: a long step", lines[1:second]), (lines[second], lines[second + 1 :])):
        assert step.startswith("opforge: a ")
        times = [int(m.group(1)) for m in map(re.compile(r"opforge:   still running after (\d+) s").fullmatch, beats)]
        assert len(times) == len(beats) and times == sorted(times), beats
    assert lines[0] == "opforge: a long step" and 2 <= second - 1 <= 4, lines
    assert 1 <= len(lines) - second - 1 <= 3, lines


def test_opforge_quiet_silences_every_step():
    proc = subprocess.run(
        [sys.executable, "-c", STEPS], capture_output=True, text=True, env=_env(OPFORGE_QUIET="1"), timeout=120
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "done\n", "")


def test_on_a_terminal_the_step_shows_with_a_spinner():
    primary, secondary = pty.openpty()
    proc = subprocess.run(
        [sys.executable, "-c", STEPS], stdout=subprocess.PIPE, stderr=secondary, env=_env(), timeout=120
    )
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal's other end is closed: all is read
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    assert proc.returncode == 0 and proc.stdout == b"done\n"
    assert b"opforge: a long step" in shown and b"\x1b[" in shown  # drawn with terminal control codes
    assert b"opforge: a long step\n" not in shown.replace(b"\r\n", b"\n")  # not as a plain line


#: A stand-in for CMake (``tool("cmake")``): configuring writes build.ninja, building a target
#: writes its output, each after a pause, and every call is logged.
FAKE_CMAKE = """#!/bin/sh
echo "$@" >> "$OPFORGE_FAKE_CMAKE_LOG"
sleep 0.3
if [ "$1" = "-S" ]; then touch "$4/build.ninja"; exit 0; fi
case "$4" in
  opforge-runner) mkdir -p "$2/bin" && touch "$2/bin/opforge-runner" ;;
  *) mkdir -p "$2/lib" && touch "$2/lib/libopforge_torch.so" ;;
esac
"""

#: The runner's path in an installed opforge (the package made to look installed), built on first use.
BUILD_RUNNER = textwrap.dedent(
    """
    import sys
    from opforge import _adapter, _build, _paths

    _paths.installed = lambda: True
    _build.tool = lambda name: sys.argv[1]
    print(_adapter.built_path(_adapter.RUNNER))
    """
)


def _spellings() -> list[str]:
    """This interpreter under each name its folder gives it (python, python3, python3.11, ...)."""
    here = Path(sys.executable)
    same = [p for p in sorted(here.parent.glob("python*")) if p.is_file() and p.resolve() == here.resolve()]
    return [str(here)] + [str(p) for p in same if p != here]


def test_the_first_build_says_what_and_why_and_other_spellings_of_the_interpreter_reuse_it(tmp_path):
    cmake = tmp_path / "cmake"
    cmake.write_text(FAKE_CMAKE)
    cmake.chmod(0o755)
    log = tmp_path / "cmake.log"
    env = _env(OPFORGE_CACHE_DIR=str(tmp_path / "cache"), OPFORGE_FAKE_CMAKE_LOG=str(log))
    spellings = _spellings()
    first = subprocess.run(
        [spellings[0], "-c", BUILD_RUNNER, str(cmake)], capture_output=True, text=True, env=env, timeout=300
    )
    assert first.returncode == 0, first.stderr
    runner = Path(first.stdout.strip())
    folder = runner.parents[1]
    assert runner.exists() and folder.parent == tmp_path / "cache" / "adapter"
    assert folder.name.startswith(f"torch-{torch.__version__}-")
    assert first.stderr == (
        f"opforge: building the C++ runner for torch {torch.__version__} into {folder}: its first use here; "
        "once, a minute or so\n"
    )
    assert len(log.read_text().splitlines()) == 2  # configured and built once
    for spelling in spellings[-1:]:  # another spelling (or the same where there is none): built already
        again = subprocess.run(
            [spelling, "-c", BUILD_RUNNER, str(cmake)], capture_output=True, text=True, env=env, timeout=300
        )
        assert (again.returncode, again.stdout.strip(), again.stderr) == (0, str(runner), "")
    assert len(log.read_text().splitlines()) == 2


def test_a_new_build_replaces_the_one_an_earlier_opforge_made_for_this_environment(tmp_path):
    from opforge import _adapter
    from opforge._build import ENVIRONMENT_FILE

    cmake = tmp_path / "cmake"
    cmake.write_text(FAKE_CMAKE)
    cmake.chmod(0o755)
    adapters = tmp_path / "cache" / "adapter"
    earlier, other_python, unrecorded = (adapters / f"torch-{torch.__version__}-{d * 12}" for d in "012")
    for folder, environment in (
        (earlier, _adapter.environment()),
        (other_python, _adapter.environment() + "2"),
        (unrecorded, None),
    ):
        (folder / "bin").mkdir(parents=True)
        (folder / "bin" / "opforge-runner").touch()
        if environment is not None:
            (folder / ENVIRONMENT_FILE).write_text(environment)
    env = _env(OPFORGE_CACHE_DIR=str(tmp_path / "cache"), OPFORGE_FAKE_CMAKE_LOG=str(tmp_path / "cmake.log"))
    proc = subprocess.run(
        [sys.executable, "-c", BUILD_RUNNER, str(cmake)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    built = Path(proc.stdout.strip()).parents[1]
    assert sorted(adapters.iterdir()) == sorted([built, other_python, unrecorded])
    assert (built / ENVIRONMENT_FILE).read_text() == _adapter.environment()
    assert proc.stderr.splitlines()[-1] == f"opforge: removed {earlier}, built for this environment by another opforge"
