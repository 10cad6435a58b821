"""opforge ops in ONNX and ONNX Runtime: the op libraries that serve PyTorch, exported as ONNX
nodes and run by ONNX Runtime.

::

    import torch, onnxruntime, opforge, opforge.onnx

    lib = opforge.load_library("build/lib/libsoftshrink.so")
    program = opforge.onnx.export(model, (x,), dynamic_shapes=...)  # torch.onnx.export(dynamo=True)
    program.save("model.onnx")
    sess = onnxruntime.InferenceSession("model.onnx", opforge.onnx.session_options([lib]))

Export: each call of an op becomes one node of the domain named by its namespace
(``examples.softshrink``, opset 1): tensor inputs in schema order (an optional one left out is an
empty input), parameters as attributes (int and bool as INT, float as FLOAT, which ONNX keeps in
float32, str as STRING, lists as INTS and FLOATS), outputs, then the value after the op of each
input it writes (ONNX has no mutation: Note [The ONNX node of an op] in
``src/ort/registration.cpp``). Each op's ONNX schema is registered with ``onnx.defs``, with a
shape-inference function that asks the core for the outputs' types from the inputs' (dims kept
symbolic), so ``onnx.checker.check_model(model, full_check=True)`` and
``onnx.shape_inference.infer_shapes(model, strict_mode=True)`` pass.

Run: :func:`session_options` registers the ONNX Runtime adapter (``libopforge_ort.so``), which
runs every call through the core's call protocol: the CPU reference on ONNX Runtime's CPU
execution provider, the CUDA kernel on its CUDA execution provider (ONNX Runtime's stream, scratch
memory from its allocator), every argument checked with the message PyTorch gives. Without Python,
``build/bin/opforge-onnx-runner`` runs the same model through ONNX Runtime's C API.

This module needs ``onnx``; :func:`translation_table` and :func:`export` need ``onnxscript`` and
torch, :func:`session_options` ``onnxruntime``; ``pip install 'opforge[onnx]'`` brings the three.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .. import _core
from .._extras import require
from ..description import Library, Op

require("onnx", "onnx", "opforge.onnx")
from . import _schemas  # noqa: E402
from ._runtime import adapter_path, session_options  # noqa: E402

__all__ = ["adapter_path", "export", "register_schemas", "session_options", "translation_table"]


def _ops(libraries: Iterable[str | Path | Library] | None) -> list[Op]:
    """The ops of ``libraries`` (paths or :class:`~opforge.Library`; None: every library loaded
    into torch by :func:`opforge.load_library`)."""
    if libraries is None:
        import opforge

        libraries = opforge.loaded_libraries()
    ops: list[Op] = []
    for lib in libraries:
        ops.extend((lib if isinstance(lib, Library) else _core.load_library(lib)).ops)
    return ops


def register_schemas(libraries: Iterable[str | Path | Library] | None = None) -> None:
    """Registers the ONNX schema of every op of ``libraries`` with ``onnx.defs`` (once per
    process), for ``onnx.checker`` and ONNX's shape inference. :func:`translation_table` does this
    too; a process that only checks or inspects a model calls it before."""
    _schemas.register(_ops(libraries))


def translation_table(libraries: Iterable[str | Path | Library] | None = None) -> dict:
    """torch.onnx's ``custom_translation_table`` for every op of ``libraries`` (default: every
    library loaded into torch), which must be loaded into torch (:func:`opforge.load_library`)::

        torch.onnx.export(model, args, dynamo=True, custom_translation_table=opforge.onnx.translation_table())
    """
    from . import _export

    return _export.translation_table(_ops(libraries))


def export(model, args, f=None, *, libraries: Iterable[str | Path | Library] | None = None, **kwargs):
    """``torch.onnx.export(model, args, f, dynamo=True, **kwargs)`` with the translation of every
    op of ``libraries`` (default: every library loaded into torch) added to any
    ``custom_translation_table`` given. Returns torch's ``ONNXProgram``."""
    import torch

    table = translation_table(libraries)
    table.update(kwargs.pop("custom_translation_table", None) or {})
    return torch.onnx.export(model, args, f, dynamo=True, custom_translation_table=table, **kwargs)
