"""opforge: describe an operator once in C++, use it from every framework.

From PyTorch::

    lib = opforge.load_library("build/lib/libsoftshrink.so")
    y = torch.ops.examples.softshrink(x, lambd=0.5)

From JAX (:mod:`opforge.jax`, which imports no torch)::

    ops = opforge.jax.load_library("build/lib/libsoftshrink.so")
    y = ops.examples.softshrink(x, lambd=0.5)

Op libraries are built with :func:`opforge.build_library` (or the CMake function
``opforge_add_library``); AOTInductor packages that carry their op libraries are written by
:func:`opforge.aoti.package` and run by the C++ runner with :func:`opforge.aoti.run`. The
PyTorch names below, and the submodules (``opforge.aoti``, ``opforge.verify``, ``opforge.jax``,
...), are imported on first use, as torch's submodules are: ``import opforge`` imports no torch,
so ``import opforge.jax`` does not either, and ``opforge.aoti.package`` works after a plain
``import opforge``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

from . import _logging  # noqa: F401 -- torch's log filters, installed before torch logs
from ._build import BuildError, build_library
from ._core import OpforgeError, set_device_value_checks, set_poison_outputs
from ._paths import build_dir, example_library
from .description import Library, Op

# Op libraries compile Triton kernels in a worker process of this interpreter (Note [Triton
# kernels] in opforge/op_launch.h); a process that never imports opforge (the C++ runner) has
# neither variable and uses the kernels its packages carry.
os.environ.setdefault("OPFORGE_TRITON_PYTHON", sys.executable)
os.environ.setdefault("OPFORGE_TRITON_WORKER", str(Path(__file__).resolve().parent / "_triton_worker.py"))

#: Names of the PyTorch side, each from its module, imported when first used.
_TORCH = {
    "DoctorReport": "._doctor",
    "Finding": "._doctor",
    "doctor": "._doctor",
    "plot_timelines": "._doctor",
    "checked_plot_file": "._doctor",
    "find_op": "._torch",
    "load_library": "._torch",
    "loaded_libraries": "._torch",
    "precompile": "._torch",
    "reload": "._torch",
    "missing_device": "._device",
}


def _version() -> str:
    """This opforge's version: pyproject.toml's ``version``, from the installed package's metadata,
    or in a checkout from the file itself."""
    from . import _paths

    if _paths.installed():
        from importlib.metadata import version

        return version("opforge")
    text = (_paths.ROOT / "pyproject.toml").read_text()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)[1]


def __getattr__(name: str):
    if name in _TORCH:
        value = getattr(importlib.import_module(_TORCH[name], __name__), name)
    elif name == "__version__":
        value = _version()
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a submodule: opforge.aoti, opforge.jax, ...
    else:
        raise AttributeError(f"module 'opforge' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "BuildError",
    "DoctorReport",
    "Finding",
    "Library",
    "Op",
    "OpforgeError",
    "build_dir",
    "build_library",
    "checked_plot_file",
    "doctor",
    "example_library",
    "find_op",
    "load_library",
    "loaded_libraries",
    "missing_device",
    "plot_timelines",
    "precompile",
    "reload",
    "set_device_value_checks",
    "set_poison_outputs",
]
