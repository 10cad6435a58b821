"""Building op libraries from Python, through the same CMake function C++ users call."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ._paths import ROOT


class BuildError(RuntimeError):
    """CMake or a compiler failed; the message holds their output."""


def _tool(name: str) -> str:
    """A build tool from this Python environment if it has one (pip's cmake and ninja), else PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        raise BuildError(f"opforge.build_library: {name} not found; install it (pip install {name})")
    return found


def build_library(
    name: str,
    sources: Sequence[str | Path],
    *,
    kernels: Sequence[str | Path] = (),
    build_dir: str | Path | None = None,
    cuda_architectures: str = "90",
    verbose: bool = False,
) -> Path:
    """Build an op library (``lib<name>.so``) from op files and CUDA sources.

    Generates a two-line CMake project that calls ``opforge_add_library`` (see
    ``cmake/opforge-config.cmake``) and builds it with Ninja; rebuilding after an edit
    recompiles only what changed.

    Args:
        name: the library's name (an identifier); the file is ``lib<name>.so``.
        sources: op files (``.cpp``) and ahead-of-time CUDA sources (``.cu``).
        kernels: run-time kernel sources (``.cu`` files named by ``.cuda_source()``), linked
            into the library's kernel folder ``lib<name>.kernels/``; not compiled here.
        build_dir: where to build; default ``~/.cache/opforge/build/<name>-<hash of sources>``.
        cuda_architectures: CMake CUDA architectures for ``.cu`` files ("90": sm_90 code and
            compute_90 PTX).
        verbose: print the build's output.

    Returns:
        Path of the built shared object.

    Raises:
        ValueError: ``name`` is not an identifier, or ``sources`` is empty or names a missing file.
        BuildError: the build failed (the message holds the compiler output).
    """
    if not name.isidentifier():
        raise ValueError(f"opforge.build_library: name must be an identifier, got {name!r}")
    paths = [Path(s).resolve() for s in sources]
    kernel_paths = [Path(k).resolve() for k in kernels]
    if not paths:
        raise ValueError("opforge.build_library: sources is empty")
    missing = [str(p) for p in paths + kernel_paths if not p.exists()]
    if missing:
        raise ValueError(f"opforge.build_library: missing source files: {', '.join(missing)}")
    if build_dir is None:
        key = hashlib.sha256("\n".join(map(str, paths + kernel_paths)).encode()).hexdigest()[:12]
        build_dir = (
            Path(os.environ.get("OPFORGE_CACHE_DIR", Path.home() / ".cache" / "opforge")) / "build" / f"{name}-{key}"
        )
    build_dir = Path(build_dir).resolve()
    project = build_dir / "project"
    project.mkdir(parents=True, exist_ok=True)
    languages = "CXX CUDA" if any(p.suffix == ".cu" for p in paths) else "CXX"
    listing = " ".join(f'"{p}"' for p in paths)
    if kernel_paths:
        listing += " KERNELS " + " ".join(f'"{k}"' for k in kernel_paths)
    cmakelists = (
        "cmake_minimum_required(VERSION 3.28)\n"
        f"project({name} LANGUAGES {languages})\n"
        f'find_package(opforge REQUIRED CONFIG PATHS "{ROOT / "cmake"}" NO_DEFAULT_PATH)\n'
        f"opforge_add_library({name} SOURCES {listing})\n"
    )
    target = project / "CMakeLists.txt"
    if not target.exists() or target.read_text() != cmakelists:
        target.write_text(cmakelists)
    cmake = _tool("cmake")
    configure = [
        cmake,
        "-S",
        str(project),
        "-B",
        str(build_dir / "out"),
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures}",
        f"-DOPFORGE_CUDA_ARCHITECTURES={cuda_architectures}",
        f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={build_dir}",
    ]
    if shutil.which("ccache"):
        configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    for cmd in (configure, [cmake, "--build", str(build_dir / "out")]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if verbose:
            print(proc.stdout, proc.stderr, sep="", file=sys.stderr)
        if proc.returncode != 0:
            raise BuildError(f"opforge.build_library({name!r}) failed:\n{proc.stdout}{proc.stderr}")
    return build_dir / f"lib{name}.so"
