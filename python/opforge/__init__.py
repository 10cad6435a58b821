"""opforge: describe an operator once in C++, use it from every framework.

``import opforge`` loads the PyTorch adapter. Then::

    lib = opforge.load_library("build/lib/libsoftshrink.so")
    y = torch.ops.examples.softshrink(x, lambd=0.5)

Op libraries are built with :func:`opforge.build_library` (or the CMake function
``opforge_add_library``); AOTInductor packages that carry their op libraries are written by
:func:`opforge.aoti.package` and run by the C++ runner with :func:`opforge.aoti.run`.
"""

from ._build import BuildError, build_library
from ._core import OpforgeError
from ._doctor import DoctorReport, Finding, doctor, plot_timelines
from ._paths import build_dir, example_library
from ._torch import find_op, load_library, loaded_libraries, precompile, reload
from .description import Library, Op

__all__ = [
    "BuildError",
    "DoctorReport",
    "Finding",
    "Library",
    "Op",
    "OpforgeError",
    "build_dir",
    "build_library",
    "doctor",
    "example_library",
    "find_op",
    "load_library",
    "loaded_libraries",
    "plot_timelines",
    "precompile",
    "reload",
]
