"""Where opforge's files live: in an installed opforge (``pip install``) or in a repository checkout.

Installed, the package folder holds ``lib/`` (the core library and the op-library runtime
archives), ``include/``, ``cmake/`` (the CMake package) and ``_src/`` (the sources of the
PyTorch adapter and the C++ runner, which are built once per torch version on first use; see
:mod:`opforge._adapter`). In a checkout, everything is built by CMake into the build folder
(``$OPFORGE_BUILD_DIR``, default ``<repo>/build``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The package folder (``.../opforge``).
PACKAGE = Path(__file__).resolve().parent
#: The repository root of a checkout (this file is ``python/opforge/_paths.py`` there).
ROOT = PACKAGE.parents[1]


def installed() -> bool:
    """True in an installed opforge (the package carries its CMake package), False in a checkout."""
    return (PACKAGE / "cmake" / "opforge-config.cmake").exists()


def build_dir() -> Path:
    """A checkout's CMake build folder: ``$OPFORGE_BUILD_DIR`` if set, else ``<repo>/build``."""
    return Path(os.environ.get("OPFORGE_BUILD_DIR", ROOT / "build")).resolve()


def lib_dir() -> Path:
    """The folder of the core library and the op-library runtime archives."""
    return PACKAGE / "lib" if installed() else build_dir() / "lib"


def cmake_dir() -> Path:
    """The folder holding ``opforge-config.cmake`` (``find_package(opforge PATHS ...)``)."""
    return PACKAGE / "cmake" if installed() else ROOT / "cmake"


def include_dir() -> Path:
    """The folder holding ``opforge/op.h``."""
    return PACKAGE / "include" if installed() else ROOT / "include"


def runtime_dir() -> Path | None:
    """The folder of the prebuilt op-library runtime (``libopforge_oplib.a``), or None in a
    checkout not built yet (op libraries then build the runtime from its sources)."""
    d = lib_dir()
    return d if (d / "libopforge_oplib.a").exists() and (d / "libopforge_oplib_cuda.a").exists() else None


def core_path() -> Path:
    """``libopforge_core.so``, the framework-free core every adapter links."""
    return lib_dir() / "libopforge_core.so"


def example_library(op: str) -> Path:
    """The op library built from a checkout's ``examples/ops/<op>/`` (``lib<op>.so``).

    Raises:
        FileNotFoundError: if it has not been built (run ``make build``), or in an installed
            opforge (the examples ship with the repository, not the package).
    """
    if installed():
        raise FileNotFoundError(
            f"opforge: the example op {op!r} ships with the repository, not the installed package; "
            "build it with opforge.build_library or `opforge build examples/ops/<op>` in a checkout"
        )
    path = build_dir() / "lib" / f"lib{op}.so"
    if not path.exists():
        raise FileNotFoundError(f"opforge: {path} does not exist; build the examples with `make build`")
    return path
