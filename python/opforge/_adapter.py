"""Building the PyTorch adapter and the C++ runner of an installed opforge, once per torch.

An installed opforge ships the adapter's sources (``opforge/_src``), not a binary: the adapter
links libtorch's C++ API, which changes between torch releases, while op libraries link no
framework and serve every torch the adapter supports. The first use under a given torch
builds the adapter (and, when asked for, the runner) into
``~/.cache/opforge/adapter/torch-<version>-<key>/`` (``$OPFORGE_CACHE_DIR`` replaces
``~/.cache/opforge``); later uses find it there. The key holds what the build depends on: torch's
version, C++ ABI and installation, the interpreter (its real file: ``python``, ``python3`` and
``python3.11`` of one environment share a build), this opforge and its sources. A new build
removes the one an earlier opforge made for the same torch and interpreter (an upgrade).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from . import _paths
from ._build import cache_dir, cache_key, cmake_build

#: The target of the adapter, and of the runner.
ADAPTER, RUNNER = "opforge_torch", "opforge-runner"


def _outputs(target: str) -> Path:
    return Path("lib") / "libopforge_torch.so" if target == ADAPTER else Path("bin") / "opforge-runner"


@functools.cache
def environment() -> str:
    """What the adapter is built for apart from opforge: torch (version, C++ ABI, installation)
    and the interpreter's real file, a line each."""
    import torch

    return "\n".join(
        [
            f"torch {torch.__version__}",
            f"cxx11abi={int(torch.compiled_with_cxx11_abi())}",
            os.path.realpath(Path(torch.__file__).parent),
            os.path.realpath(sys.executable),
        ]
    )


@functools.cache
def build_folder() -> Path:
    """The folder the adapter and runner for this Python's torch are built in (not created), keyed
    by :func:`environment`, this opforge and the sources built."""
    import torch

    return cache_dir() / "adapter" / f"torch-{torch.__version__}-{cache_key(environment())}"


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
        environment(),
    )


def built_path(target: str, *, build: bool = True) -> Path:
    """The adapter (``target`` :data:`ADAPTER`, ``libopforge_torch.so``) or the C++ runner
    (:data:`RUNNER`, ``opforge-runner``): in a checkout, in its build folder; installed, built
    for this torch on first use, unless ``build`` is False (the path is then returned whether
    or not it exists).

    Raises:
        BuildError: building it failed (installed opforge only).
    """
    if not _paths.installed():
        folder = _paths.build_dir()
    else:
        folder = ensure_built(target) if build else build_folder()
    return folder / _outputs(target)


def adapter_path() -> Path:
    """``libopforge_torch.so``, the PyTorch adapter (see :func:`built_path`)."""
    return built_path(ADAPTER)


def runner_path() -> Path:
    """``opforge-runner``, the C++ AOTInductor runner (see :func:`built_path`)."""
    return built_path(RUNNER)
