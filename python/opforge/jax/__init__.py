"""opforge ops from JAX: the op libraries that serve PyTorch, called through XLA's FFI.

::

    import jax, opforge.jax

    opforge.jax.load_library("build/lib/libsoftshrink.so")
    y = jax.jit(opforge.jax.ops.examples.softshrink)(x, lambd=0.5)

Each op of a loaded library is ``opforge.jax.ops.<ns>.<op>``, a JAX function with the op's
schema as its signature (:class:`~opforge.jax._call.JaxOp`): its output shapes and dtypes come
from the description's rules, evaluated by the core when JAX traces the call, so a bad argument
raises the error a PyTorch call raises (the op, each bad argument, expected and given); it works
under ``jax.jit``, ``jax.vmap`` and ``jax.grad`` (through the op's backward op), and in
``jax.export`` (pass :func:`disabled_checks` to it; a process that deserializes the export loads
the library first). The kernels run on the stream XLA gives, with scratch memory from XLA's
allocator; run-time kernels compile on first use (NVRTC, or Triton in a worker process for a
Triton kernel), as from PyTorch, and :func:`reload` re-reads edited kernel sources. This package
imports no torch.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from .._extras import require

jax = require("jax", "jax", "opforge.jax")

#: The oldest jax opforge.jax runs on: jax.ffi (ffi_call with input_output_aliases and
#: vmap_method), jax.export's DisabledSafetyCheck and jax.custom_batching.custom_vmap.
MIN_JAX = (0, 5, 0)
if tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit()) < MIN_JAX:
    raise ImportError(
        f"opforge.jax needs jax >= {'.'.join(map(str, MIN_JAX))} (jax.ffi, jax.export); this is jax {jax.__version__}"
    )

from .. import _core  # noqa: E402
from ..description import Library  # noqa: E402
from . import _adapter  # noqa: E402
from ._call import JaxOp  # noqa: E402

__all__ = ["JaxOp", "disabled_checks", "load_library", "ops", "reload"]


class _Namespace(SimpleNamespace):
    """Loaded ops by name; a name not loaded raises AttributeError saying what to load."""

    def __init__(self, path: str) -> None:
        super().__init__()
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        what = f"an op {self._path}.{name}" if self._path else f"an op namespace {name!r}"
        raise AttributeError(
            f"opforge.jax: no loaded op library declares {what}; load it first with opforge.jax.load_library(path)"
        )


#: The loaded ops: ``ops.<ns>.<op>`` is a :class:`JaxOp`.
ops = _Namespace("")
_lock = threading.Lock()
_ops: dict[str, JaxOp] = {}


def _resolve(name: str) -> JaxOp:
    return _ops[name]


def load_library(path: str | Path) -> Library:
    """Load and validate the op library at ``path`` (the same file PyTorch loads), register its
    ops as XLA FFI targets and add them to :data:`ops`. Loading it again is a no-op.

    Returns:
        The library's description.

    Raises:
        ValueError: not a valid op library (every problem on its own line), or one with an op
            JAX cannot call (a parameter named like the call frame's attributes); then none of its
            ops is added.
        OpforgeError: the file cannot be loaded, or the JAX adapter is not built.
    """
    lib = _core.load_library(path)
    made = {op.name: JaxOp(op, _resolve) for op in lib.ops}  # every op checked before any is added
    _adapter.register(list(lib.ops))
    with _lock:
        for name, jop in made.items():
            if name in _ops:
                continue
            ns, short = name.split("::")
            if ns not in vars(ops):
                setattr(ops, ns, _Namespace(ns))
            _ops[name] = jop
            setattr(vars(ops)[ns], short, jop)
    return lib


def disabled_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The safety checks ``jax.export.export`` must skip for the loaded ops: one per custom-call
    target (jax.export accepts only the targets it knows to be stable unless told otherwise)::

        exported = jax.export.export(jax.jit(f), disabled_checks=opforge.jax.disabled_checks())(x)
    """
    return [jax.export.DisabledSafetyCheck.custom_call(_adapter.target_name(j.op)) for j in _ops.values()]


def reload() -> None:
    """Forget every compiled run-time kernel, so the next call of each op re-reads its kernel
    source (as ``opforge.reload()`` does for PyTorch; both share the one cache)."""
    _core.reload()
