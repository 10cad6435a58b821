"""The JAX adapter library (``libopforge_jax.so``, src/jax): where it is, building it in an
installed opforge, and registering its XLA FFI handlers as each op's custom-call target.

The adapter is compiled against the FFI headers of jaxlib (``jax.ffi.include_dir()``) and links
nothing of jaxlib: its handlers reach XLA through the versioned C API of the call frame. In a
checkout, ``make build`` builds it when the build's Python has jax; an installed opforge builds it
on first use into ``~/.cache/opforge/adapter/jax-<jaxlib version>-<key>/``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from pathlib import Path

import jax
import jaxlib

from .. import _paths
from .._build import cache_dir, cache_key, cmake_build
from .._core import OpforgeError
from ..description import Op

_OUTPUT = Path("lib") / "libopforge_jax.so"
_lock = threading.Lock()
_registered: set[str] = set()


def target_name(op: Op) -> str:
    """The custom-call target of ``op`` ("ns::name" -> "ns.name")."""
    return op.name.replace("::", ".")


@functools.cache
def adapter() -> ctypes.CDLL:
    """``libopforge_jax.so``, loaded (built first in an installed opforge).

    Raises:
        OpforgeError: a checkout whose build has no JAX adapter.
        BuildError: building it failed (installed opforge only).
    """
    if _paths.installed():
        include = jax.ffi.include_dir()
        environment = "\n".join([f"jaxlib {jaxlib.__version__}", include, os.path.realpath(sys.executable)])
        folder = cache_dir() / "adapter" / f"jax-{jaxlib.__version__}-{cache_key(environment)}"
        path = (
            cmake_build(
                _paths.PACKAGE / "_src" / "src" / "jax",
                folder,
                "opforge_jax",
                _OUTPUT,
                [f"-DOPFORGE_JAX_INCLUDE_DIR={include}"],
                f"the JAX adapter for jaxlib {jaxlib.__version__}",
                environment,
            )
            / _OUTPUT
        )
    else:
        path = _paths.build_dir() / _OUTPUT
        if not path.exists():
            raise OpforgeError(
                f"opforge: the JAX adapter {path} is not built; run `make build` with a Python that has jax "
                "(OPFORGE_PYTHON)"
            )
    return ctypes.CDLL(str(path))


def register(ops: list[Op]) -> None:
    """Registers each op of ``ops`` (once per process) as the XLA FFI target :func:`target_name`:
    the host handler for the platform "cpu", the CUDA handler for "CUDA" where the op has a CUDA
    kernel (jaxlib keeps that registration for a CUDA plugin that loads later)."""
    lib = adapter()
    handlers = {
        "cpu": jax.ffi.pycapsule(lib.opforge_jax_cpu),
        "CUDA": jax.ffi.pycapsule(lib.opforge_jax_cuda),
    }
    with _lock:
        for op in ops:
            name = target_name(op)
            if name in _registered:
                continue
            jax.ffi.register_ffi_target(name, handlers["cpu"], platform="cpu")
            if "cuda" in op.devices:
                jax.ffi.register_ffi_target(name, handlers["CUDA"], platform="CUDA")
            _registered.add(name)
