"""Building the PyTorch adapter and the C++ runner of an installed opforge, once per torch.

An installed opforge ships the adapter's sources (``opforge/_src``), not a binary: the adapter
links libtorch's C++ API, which changes between torch releases, while op libraries link no
framework and serve every torch the adapter supports. The first use under a given torch
builds the adapter (and, when asked for, the runner) into
``~/.cache/opforge/adapter/torch-<version>-<key>/`` (``$OPFORGE_CACHE_DIR`` replaces
``~/.cache/opforge``), keyed by the torch version, the torch and opforge installations and the
Python interpreter; later uses find it there.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from . import _paths
from ._build import BuildError, _cache_dir, _tool
from ._progress import status

#: The target of the adapter, and of the runner.
ADAPTER, RUNNER = "opforge_torch", "opforge-runner"


def _outputs(target: str) -> Path:
    return Path("lib") / "libopforge_torch.so" if target == ADAPTER else Path("bin") / "opforge-runner"


@functools.cache
def sources_digest() -> str:
    """The SHA-256 of an installed opforge's adapter and runner sources (``opforge/_src``),
    hashed once per process."""
    sources = _paths.PACKAGE / "_src"
    digest = hashlib.sha256()
    for path in sorted(p for p in sources.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(sources)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(*parts: str) -> str:
    """12 hex digits that change with any of ``parts``, this opforge or its sources."""
    text = "\n".join([*parts, str(_paths.PACKAGE), sources_digest()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.cache
def build_folder() -> Path:
    """The folder the adapter and runner for this Python's torch are built in (not created), keyed
    by torch (version and installation), this opforge, the interpreter and the sources built."""
    import torch

    key = cache_key(torch.__version__, str(Path(torch.__file__).parent), sys.executable)
    return _cache_dir() / "adapter" / f"torch-{torch.__version__}-{key}"


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One builder at a time per folder (parallel test workers, two notebooks)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cmake_build(source: Path, folder: Path, target: str, output: Path, defines: list[str], what: str) -> Path:
    """Configure (once) the CMake project ``source`` in ``folder`` and build ``target`` unless
    ``folder / output`` exists, one builder at a time per folder; returns ``folder``.

    Raises:
        BuildError: CMake or the compiler failed (the message holds their output and the
            folder to remove to try again).
    """
    if (folder / output).exists():
        return folder
    with _locked(folder):
        if (folder / output).exists():  # built by another process meanwhile
            return folder
        cmake = _tool("cmake")
        steps = []
        if not (folder / "build.ninja").exists():
            steps.append(
                [
                    cmake,
                    "-S",
                    str(source),
                    "-B",
                    str(folder),
                    "-G",
                    "Ninja",
                    f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
                    f"-DOPFORGE_CMAKE_DIR={_paths.cmake_dir()}",
                    *defines,
                ]
            )
        steps.append([cmake, "--build", str(folder), "--target", target])
        with status(f"opforge: building {what} (once)"):
            for cmd in steps:
                proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CLICOLOR_FORCE": "0"})
                if proc.returncode != 0:
                    raise BuildError(
                        f"opforge: building {what} failed (remove {folder} to start over):\n{proc.stdout}{proc.stderr}"
                    )
    return folder


def ensure_built(target: str = ADAPTER) -> Path:
    """Build ``target`` (:data:`ADAPTER` or :data:`RUNNER`) for this torch unless it is built.

    Returns:
        The build folder (the adapter is ``lib/libopforge_torch.so`` in it, the runner
        ``bin/opforge-runner``).

    Raises:
        BuildError: CMake or the compiler failed (see :func:`cmake_build`).
    """
    import torch

    what = "the PyTorch adapter" if target == ADAPTER else "the C++ runner"
    return cmake_build(
        _paths.PACKAGE / "_src" / "src" / "torch",
        build_folder(),
        target,
        _outputs(target),
        [f"-DPython3_EXECUTABLE={sys.executable}"],
        f"{what} for torch {torch.__version__}",
    )


def built_path(target: str) -> Path:
    """The adapter (``target`` :data:`ADAPTER`, ``libopforge_torch.so``) or the C++ runner
    (:data:`RUNNER`, ``opforge-runner``): in a checkout, in its build folder; installed, built
    for this torch on first use.

    Raises:
        BuildError: building it failed (installed opforge only).
    """
    folder = ensure_built(target) if _paths.installed() else _paths.build_dir()
    return folder / _outputs(target)


def adapter_path() -> Path:
    """``libopforge_torch.so``, the PyTorch adapter (see :func:`built_path`)."""
    return built_path(ADAPTER)


def runner_path() -> Path:
    """``opforge-runner``, the C++ AOTInductor runner (see :func:`built_path`)."""
    return built_path(RUNNER)
