"""The sources keep their style: the Python sources the rules of ruff.toml (`ruff check` and `ruff
format --check` over the clone, with the ruff that requirements.txt pins), the C++ and CUDA sources
the layout of .clang-format (`clang-format --dry-run --Werror`, with clang-format 14)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The folders that hold opforge's C++ and CUDA sources (third_party/ is vendored as it came).
CXX_FOLDERS = ("bench", "examples", "include", "runner", "src", "tests", "tools")
CXX_SUFFIXES = {".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh"}
#: clang-format's major version whose layout .clang-format was written for: other versions lay out
#: some constructs differently, so their verdict would not be this style's.
CLANG_FORMAT_MAJOR = 14

needs_ruff = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed in this Python (requirements.txt pins it; a python3 of the GPU machine has none)",
)


def cxx_sources() -> list[Path]:
    """Every C++ and CUDA source of the clone outside third_party/, sorted."""
    return sorted(
        p for folder in CXX_FOLDERS for p in (ROOT / folder).rglob("*") if p.suffix in CXX_SUFFIXES and p.is_file()
    )


def clang_format_major(executable: str) -> int | None:
    """The major version `executable --version` reports ("Debian clang-format version 14.0.6"), or
    None if it reports none."""
    run = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30)
    found = re.search(r"clang-format version (\d+)\.", run.stdout)
    return int(found.group(1)) if found else None


@needs_ruff
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


@pytest.fixture(scope="module")
def clang_format() -> str:
    """The clang-format requirements.txt pins (beside this Python), else the one on PATH, if it is
    version 14 (skips otherwise, saying why)."""
    beside = Path(sys.executable).parent / "clang-format"
    executable = str(beside) if beside.exists() else shutil.which("clang-format")
    if executable is None:
        pytest.skip(f"clang-format is not on PATH (.clang-format's layout is clang-format {CLANG_FORMAT_MAJOR}'s)")
    major = clang_format_major(executable)
    if major != CLANG_FORMAT_MAJOR:
        pytest.skip(f"{executable} is version {major}; .clang-format's layout is clang-format {CLANG_FORMAT_MAJOR}'s")
    return executable


def deviating(clang_format: str, folder: Path, files: list[Path]) -> list[str]:
    """Those of ``files`` (relative to ``folder``, whose .clang-format applies) that clang-format
    would lay out otherwise."""
    run = subprocess.run(
        [clang_format, "--dry-run", "--Werror", *map(str, files)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = sorted({line.split(":", 1)[0] for line in run.stderr.splitlines() if ": error: " in line})
    assert found or run.returncode == 0, run.stderr
    return found


def test_clang_format(clang_format):
    sources = [p.relative_to(ROOT) for p in cxx_sources()]
    assert len(sources) > 50, f"expected opforge's C++ sources under {ROOT}, found {len(sources)}"
    bad = deviating(clang_format, ROOT, sources)
    assert not bad, "laid out otherwise than .clang-format says (`clang-format -i` fixes them):\n" + "\n".join(bad)


def test_clang_format_finds_a_file_laid_out_otherwise(clang_format, tmp_path):
    (tmp_path / ".clang-format").write_text((ROOT / ".clang-format").read_text())
    (tmp_path / "good.cpp").write_text("int add(int a, int b) { return a + b; }\n")
    (tmp_path / "bad.cpp").write_text("int add( int a,int b )\n{\n  return a+b;\n}\n")
    assert deviating(clang_format, tmp_path, [Path("good.cpp"), Path("bad.cpp")]) == ["bad.cpp"]
