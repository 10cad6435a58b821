"""Building with CMake from Python: op libraries, through the same CMake functions C++ users call,
and the adapters an installed opforge builds on first use (:func:`cmake_build`, used by
``opforge._adapter`` for torch and ``opforge.jax._adapter`` for JAX)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import _paths
from ._progress import note, status


class BuildError(RuntimeError):
    """CMake or a compiler failed; the message holds their output."""


#: Where the cmake and ninja packages keep their executables (a module attribute of each).
_PACKAGE_BIN_DIRS = {"cmake": "CMAKE_BIN_DIR", "ninja": "BIN_DIR"}


def tool(name: str) -> str:
    """A build tool from this Python environment if it has one (pip's cmake and ninja: the
    interpreter's folder, else the package's own, as where a .pth file adds them), else PATH."""
    local = Path(sys.executable).parent / name
    if not local.exists() and name in _PACKAGE_BIN_DIRS:
        try:
            local = Path(getattr(importlib.import_module(name), _PACKAGE_BIN_DIRS[name])) / name
        except ImportError:
            pass
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        raise BuildError(f"opforge.build_library: {name} not found; install it (pip install {name})")
    return found


def cache_dir() -> Path:
    """opforge's cache folder: ``$OPFORGE_CACHE_DIR``, default ``~/.cache/opforge``."""
    return Path(os.environ.get("OPFORGE_CACHE_DIR", Path.home() / ".cache" / "opforge"))


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


@contextlib.contextmanager
def _locked(folder: Path, what: str) -> Iterator[None]:
    """Holds ``folder``'s lock (``<folder>/.lock``, an flock) while the block runs, so that
    processes building into one folder (torchrun ranks, pytest-xdist workers, two notebooks) take
    turns: the first builds, the others then find its result. A process that waits says so, naming
    ``what`` it waits for. The lock goes with the process (closing the file releases it), also
    when the process dies."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with status(f"opforge: waiting for another process building {what} in {folder}"):
                fcntl.flock(lock, fcntl.LOCK_EX)
        yield


#: What an adapter build folder was built for (cmake_build's ``environment``), written in it.
ENVIRONMENT_FILE = "environment.txt"


def _remove_replaced(folder: Path, environment: str) -> None:
    """Removes the sibling folders of ``folder`` built for the same ``environment`` (the same
    interpreter and framework) by another opforge: an upgrade's adapter replaces the one before
    it instead of adding a few hundred MB to the cache with each version. A folder whose lock
    another process holds (it is building there) is left alone."""
    for sibling in folder.parent.iterdir():
        record = sibling / ENVIRONMENT_FILE
        if sibling == folder or not record.is_file() or record.read_text() != environment:
            continue
        with open(sibling / ".lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(sibling, ignore_errors=True)
        note(f"opforge: removed {sibling}, built for this environment by another opforge")


def cmake_build(
    source: Path, folder: Path, target: str, output: Path, defines: list[str], what: str, environment: str
) -> Path:
    """Configure (once) the CMake project ``source`` in ``folder`` and build ``target`` unless
    ``folder / output`` exists, one builder at a time per folder; returns ``folder``.

    ``environment`` names what the build is for apart from opforge itself (the interpreter, the
    framework's version and installation); a new build removes the folders beside it built for
    the same environment by another opforge (:data:`ENVIRONMENT_FILE` records it).

    Raises:
        BuildError: CMake or the compiler failed (the message holds their output and the
            folder to remove to try again).
    """
    if (folder / output).exists():
        return folder
    with _locked(folder, what):
        if (folder / output).exists():  # built by another process meanwhile
            return folder
        cmake = tool("cmake")
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
                    f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}",
                    f"-DOPFORGE_CMAKE_DIR={_paths.cmake_dir()}",
                    *defines,
                ]
            )
        steps.append([cmake, "--build", str(folder), "--target", target])
        # Said at once, on any stream: a build of a minute that the user did not ask for.
        with status(f"opforge: building {what} into {folder}: its first use here; once, a minute or so", after_s=0):
            for cmd in steps:
                proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CLICOLOR_FORCE": "0"})
                if proc.returncode != 0:
                    raise BuildError(
                        f"opforge: building {what} failed (remove {folder} to start over):\n{proc.stdout}{proc.stderr}"
                    )
        (folder / ENVIRONMENT_FILE).write_text(environment)
    _remove_replaced(folder, environment)
    return folder


def build_library(
    name: str,
    sources: Sequence[str | Path] = (),
    *,
    kernels: Sequence[str | Path] = (),
    folder: str | Path | None = None,
    build_dir: str | Path | None = None,
    cuda_architectures: str = "90",
    verbose: bool = False,
) -> Path:
    """Build an op library (``lib<name>.so``) from op files and CUDA sources, or from an op folder.

    Generates a CMake project of a few lines that calls ``opforge_add_library`` (or, with
    ``folder``, ``opforge_add_op_folder``; see ``cmake/opforge-config.cmake``) and builds it with
    Ninja, linking the prebuilt op-library runtime. Rebuilding after an edit recompiles only
    what changed and does not configure again. Processes that build into one folder at once
    (torchrun ranks, pytest-xdist workers) take turns through a file lock in it.

    Args:
        name: the library's name (an identifier); the file is ``lib<name>.so``.
        sources: op files (``.cpp``) and ahead-of-time CUDA sources (``.cu``).
        kernels: run-time kernel sources (``.cu`` files named by ``.cuda_source()``, ``.py``
            files named by ``.triton_source()``, and folders of Python modules those import) and
            prebuilt kernels (``.cubin``, ``.fatbin`` and ``.ptx`` files named by
            ``.cuda_binary()``), linked into the library's kernel folder ``lib<name>.kernels/``;
            not compiled here.
        folder: an op folder instead of ``sources`` and ``kernels``: its ``*.cpp`` and ``*.cu``
            are the sources, its ``kernels/*.cu``, ``kernels/*.py``, ``kernels/*.cubin``,
            ``*.fatbin``, ``*.ptx`` and the folders in ``kernels/`` the run-time kernels.
        build_dir: where to build; default ``~/.cache/opforge/build/<name>-<hash of the inputs>``
            (``$OPFORGE_CACHE_DIR`` replaces ``~/.cache/opforge``).
        cuda_architectures: CMake CUDA architectures for ``.cu`` files ("90": sm_90 code and
            compute_90 PTX).
        verbose: print the build's output.

    Returns:
        Path of the built shared object.

    Raises:
        ValueError: ``name`` is not an identifier; neither or both of ``sources`` and ``folder``
            are given; a source file or the folder does not exist.
        BuildError: CMake or a compiler failed (the message holds their output), or none of
            the op files declares an op or class (``OPFORGE_OP``/``OPFORGE_CLASS``: the message
            names the files).
    """
    if not name.isidentifier():
        raise ValueError(f"opforge.build_library: name must be an identifier, got {name!r}")
    if (folder is None) == (not sources):
        raise ValueError("opforge.build_library: give either sources (op files) or folder (an op folder)")
    if folder is not None:
        root = Path(folder).resolve()
        if not root.is_dir():
            raise ValueError(f"opforge.build_library: {root} is not a folder")
        inputs = [root]
        has_cuda = any(root.glob("*.cu"))
        body = f'opforge_add_op_folder("{root}" NAME {name})\n'
    else:
        paths = [Path(s).resolve() for s in sources]
        kernel_paths = [Path(k).resolve() for k in kernels]
        missing = [str(p) for p in paths + kernel_paths if not p.exists()]
        if missing:
            raise ValueError(f"opforge.build_library: missing source files: {', '.join(missing)}")
        inputs = paths + kernel_paths
        has_cuda = any(p.suffix == ".cu" for p in paths)
        listing = " ".join(f'"{p}"' for p in paths)
        if kernel_paths:
            listing += " KERNELS " + " ".join(f'"{k}"' for k in kernel_paths)
        body = f"opforge_add_library({name} SOURCES {listing})\n"
    if build_dir is None:
        key = hashlib.sha256("\n".join(map(str, inputs)).encode()).hexdigest()[:12]
        build_dir = cache_dir() / "build" / f"{name}-{key}"  # built_libraries finds it there
    build_dir = Path(build_dir).resolve()
    runtime = _paths.runtime_dir()
    # Every setting is in the generated file, so a change of any of them configures again.
    cmakelists = (
        "cmake_minimum_required(VERSION 3.28)\n"
        "set(CMAKE_BUILD_TYPE Release)\n"
        f"set(CMAKE_CUDA_ARCHITECTURES {cuda_architectures})\n"
        f"set(OPFORGE_CUDA_ARCHITECTURES {cuda_architectures})\n"
        f'set(CMAKE_LIBRARY_OUTPUT_DIRECTORY "{build_dir}")\n'
        + (f'set(OPFORGE_RUNTIME_DIR "{runtime}")\n' if runtime else "")
        + f"project({name} LANGUAGES {'CXX CUDA' if has_cuda else 'CXX'})\n"
        f'find_package(opforge REQUIRED CONFIG PATHS "{_paths.cmake_dir()}" NO_DEFAULT_PATH)\n' + body
    )
    with _locked(build_dir, f"lib{name}.so"):
        _configure_and_build(name, build_dir, cmakelists, verbose)
        (build_dir / SOURCES_FILE).write_text("".join(f"{p}\n" for p in inputs))  # for built_from
    return build_dir / f"lib{name}.so"


#: What build_library writes beside a library it built: its op folder, or its source files, a line each.
SOURCES_FILE = "sources.txt"


def built_from(library: Path) -> list[str]:
    """The op folder (or the op files and kernels) that :func:`build_library` built ``library``
    from, as absolute paths; empty for a library it did not build (or built before it recorded
    them)."""
    record = Path(library).parent / SOURCES_FILE
    return record.read_text().splitlines() if record.is_file() else []


def built_libraries(name: str) -> list[Path]:
    """The op libraries ``lib<name>.so`` that :func:`build_library` built into its default folders
    (``<cache_dir>/build/<name>-<12 hex digits>/``, one per set of inputs), newest first."""
    found = cache_dir().glob(f"build/{name}-{'[0-9a-f]' * 12}/lib{name}.so")
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _configure_and_build(name: str, build_dir: Path, cmakelists: str, verbose: bool) -> None:
    """Writes the generated project into ``build_dir``, configures it if it changed, and builds
    it with Ninja; the caller holds the folder's lock."""
    project = build_dir / "project"
    project.mkdir(parents=True, exist_ok=True)
    target = project / "CMakeLists.txt"
    out = build_dir / "out"
    cmake = tool("cmake")
    steps = []
    if not (out / "build.ninja").exists() or not target.exists() or target.read_text() != cmakelists:
        target.write_text(cmakelists)
        configure = [cmake, "-S", str(project), "-B", str(out), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}"]
        steps.append(("configuring", configure))
    steps.append(("compiling", [cmake, "--build", str(out)]))
    for what, cmd in steps:
        with status(f"opforge: {what} lib{name}.so"):
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if verbose:
            print(proc.stdout, proc.stderr, sep="", file=sys.stderr)
        if proc.returncode != 0:
            raise BuildError(f"opforge.build_library({name!r}) failed:\n{proc.stdout}{proc.stderr}")
