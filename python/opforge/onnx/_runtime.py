"""The ONNX Runtime adapter library (``libopforge_ort.so``, src/ort): where it is, and session
options that register it with the op libraries it serves."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Iterable
from pathlib import Path

from .. import _paths
from .._core import OpforgeError
from .._extras import require
from ..description import Library

_NAME = "libopforge_ort.so"
#: The session configuration entry naming the op libraries the adapter serves (src/ort/registration.cpp).
LIBRARIES_KEY = "opforge.op_libraries"


def adapter_path() -> Path:
    """``libopforge_ort.so``, the custom-op library ONNX Runtime loads.

    Raises:
        OpforgeError: it is not built (a checkout without ``make build``).
    """
    path = _paths.lib_dir() / _NAME
    if not path.exists():
        raise OpforgeError(f"opforge: the ONNX Runtime adapter {path} is not built; run `make build`")
    return path


@functools.cache
def adapter() -> ctypes.CDLL:
    """``libopforge_ort.so``, loaded into this process (for its output-types entry)."""
    return ctypes.CDLL(str(adapter_path()))


def library_paths(libraries: Iterable[str | Path | Library]) -> list[str]:
    """The resolved paths of op libraries given as paths or :class:`~opforge.Library` objects.

    Raises:
        ValueError: none given, or a path with ``os.pathsep`` in it (the separator of the list).
    """
    paths = [str(Path(lib.path if isinstance(lib, Library) else lib).resolve()) for lib in libraries]
    if not paths:
        raise ValueError("opforge.onnx: session_options needs at least one op library")
    for p in paths:
        if os.pathsep in p:
            raise ValueError(f"opforge.onnx: an op library path may not contain {os.pathsep!r}: {p}")
    return paths


def libraries_serving(model, libraries: Iterable[Library]) -> list[Library]:
    """The libraries of ``libraries`` that declare an op a node of ``model`` (an
    ``onnx.ModelProto``, its graph and its functions) calls, domain ``ns`` and op type ``name``
    for ``ns::name``: what :func:`session_options` needs for it, and no library it does not (one
    loaded earlier whose file is gone fails the session)."""
    nodes = [*model.graph.node, *(node for function in model.functions for node in function.node)]
    called = {f"{node.domain}::{node.op_type}" for node in nodes if node.domain}
    return [lib for lib in libraries if any(op.name in called for op in lib.ops)]


def session_options(libraries: Iterable[str | Path | Library], options=None):
    """``onnxruntime.SessionOptions`` (``options``, or new ones) with the opforge adapter
    registered to serve every op of ``libraries`` (paths or loaded :class:`~opforge.Library`
    objects): the CPU execution provider runs each op's CPU reference, the CUDA execution provider
    (where the installed onnxruntime has it) its CUDA kernel on ONNX Runtime's stream. Every call
    is checked by the core; a bad input fails the run with the op's message (the op, each bad
    argument, expected and given)::

        sess = onnxruntime.InferenceSession("model.onnx", opforge.onnx.session_options([lib]))

    Raises:
        ValueError: no op library given.
        OpforgeError: the adapter is not built.
        ImportError: onnxruntime is not installed (the message names the extra that brings it).
    """
    onnxruntime = require("onnxruntime", "onnx", "opforge.onnx.session_options")
    options = onnxruntime.SessionOptions() if options is None else options
    options.add_session_config_entry(LIBRARIES_KEY, os.pathsep.join(library_paths(libraries)))
    options.register_custom_ops_library(str(adapter_path()))
    return options
