"""Where opforge's built artifacts live."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (this file is python/opforge/_paths.py).
ROOT = Path(__file__).resolve().parents[2]


def build_dir() -> Path:
    """The CMake build folder: ``$OPFORGE_BUILD_DIR`` if set, else ``<repo>/build``."""
    return Path(os.environ.get("OPFORGE_BUILD_DIR", ROOT / "build")).resolve()


def core_path() -> Path:
    """``libopforge_core.so``, the framework-free core every adapter links."""
    return build_dir() / "lib" / "libopforge_core.so"


def adapter_path() -> Path:
    """``libopforge_torch.so``, the PyTorch adapter."""
    return build_dir() / "lib" / "libopforge_torch.so"


def runner_path() -> Path:
    """``opforge-runner``, the C++ AOTInductor runner."""
    return build_dir() / "bin" / "opforge-runner"


def example_library(op: str) -> Path:
    """The op library built from ``examples/ops/<op>/`` (``lib<op>.so`` in the build folder).

    Raises:
        FileNotFoundError: if it has not been built (run ``make build``).
    """
    path = build_dir() / "lib" / f"lib{op}.so"
    if not path.exists():
        raise FileNotFoundError(f"opforge: {path} does not exist; build the examples with `make build`")
    return path
