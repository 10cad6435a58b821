"""libopforge_core through ctypes: loading op libraries, precompile, and the rules the core
evaluates for Python (example input sizes, output shapes). No torch here: any framework's
Python side uses this module.

Every entry point returns an OpforgeStatus and a JSON text (include/opforge/core.h); a failure's
JSON names its kind, which :func:`call` raises as :class:`ValueError` ("invalid_argument", the
caller's fault) or :class:`OpforgeError` ("internal": a library that cannot be loaded, a kernel
that does not compile or whose source is missing).
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
from pathlib import Path

from ._paths import core_path
from .description import Library, library_from_json


class OpforgeError(RuntimeError):
    """opforge could not do what was asked for reasons other than the arguments: an op library
    that cannot be opened or loaded, a kernel that fails to compile, a missing kernel source, a
    missing build artifact."""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_ERRORS = {"invalid_argument": ValueError, "internal": OpforgeError}


def _core() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            path = core_path()
            if not path.exists():
                raise OpforgeError(f"opforge: {path} is not built; run `make build`")
            lib = ctypes.CDLL(str(path))
            for name in ("load_library", "precompile", "example_shapes", "output_shapes", "admission"):
                fn = getattr(lib, f"opforge_core_{name}")
                fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
                fn.restype = ctypes.c_int
            lib.opforge_core_free.argtypes = [ctypes.c_void_p]
            lib.opforge_core_reload.argtypes = []
            lib.opforge_core_set_poison_outputs.argtypes = [ctypes.c_int]
            lib.opforge_core_set_device_value_checks.argtypes = [ctypes.c_int]
            lib.opforge_core_poison_outputs.restype = ctypes.c_int
            lib.opforge_core_poison_byte.argtypes = [ctypes.c_char_p, ctypes.c_int]
            lib.opforge_core_poison_byte.restype = ctypes.c_int
            _lib = lib
        return _lib


def call(fn, argument: str, lib: ctypes.CDLL | None = None) -> dict:
    """Calls a C entry point of opforge/core.h's shape (``status fn(const char*, char** out)``),
    here or in an adapter library ``lib``, and returns its JSON response.

    Raises:
        ValueError, OpforgeError: as the error JSON says.
    """
    out = ctypes.c_void_p()
    status = fn(argument.encode(), ctypes.byref(out))
    try:
        text = ctypes.string_at(out.value).decode() if out.value else "{}"
    finally:
        _core().opforge_core_free(out)
    response = json.loads(text)
    if status != 0:
        raise _ERRORS.get(response.get("status"), OpforgeError)(response.get("message", "unknown error"))
    return response


def load_library(path: str | Path) -> Library:
    """Load and validate the op library at ``path`` (no framework registration; see
    :func:`opforge.load_library` for PyTorch). Loading it again returns an equal description.

    Raises:
        ValueError: not a valid op library (every problem on its own line, "file:line: ns::op: ...").
        OpforgeError: the file cannot be opened or loaded.
    """
    resolved = Path(path).resolve()
    return library_from_json(resolved, call(_core().opforge_core_load_library, str(resolved)))


def _jsonable(value):
    """``value`` with the floats JSON cannot hold (inf, nan) as the strings the core reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _request(name: str, request: dict) -> dict:
    return call(getattr(_core(), f"opforge_core_{name}"), json.dumps(_jsonable(request), allow_nan=False))


def precompile_request(
    op: str,
    dtypes: dict[str, str],
    params: dict[str, object],
    arch: str,
    cache_dir: str | None,
    shapes: dict[str, list[int]] | None = None,
) -> bool:
    """Compile one instantiation of ``op``'s run-time kernels (dtypes by tensor name as dtype
    names; ``shapes`` by tensor name, for kernels whose variants depend on sizes); True if every
    binary was already cached. See :func:`opforge.precompile`."""
    request = {"op": op, "dtypes": dtypes, "params": params, "arch": arch, "cache_dir": cache_dir}
    if shapes is not None:
        request["shapes"] = {name: [int(s) for s in shape] for name, shape in shapes.items()}
    return _request("precompile", request)["cache_hit"]


def example_shapes(
    op: str, lead: int, last: int, params: dict[str, object], leading: int = 1, omit_optional: bool = False
) -> dict:
    """Input shapes that satisfy ``op``'s shape rules, from two free sizes
    (``opforge::core::example_shapes``: ``lead`` for first dims, ``last`` for last dims,
    multiples where a dim is declared ``multiple_of``, ``leading`` leading dims for an input
    declared ``shape({leading_dims, ...})``, those of x for one declared
    ``shape({leading_dims_of("x"), ...})``), and the facts a generator needs besides:
    ``{"shapes": {tensor: sizes}, "bounds": {input with a value domain: [low, high]},
    "rule_problems": [cross-argument rules these shapes break, for calls that give the optional
    tensor inputs, or with ``omit_optional`` leave them out]}``."""
    request = {"op": op, "lead": lead, "last": last, "leading": leading, "params": params}
    return _request("example_shapes", {**request, "omit_optional": omit_optional})


def output_shapes(op: str, args: dict[str, object]) -> list[dict]:
    """The outputs' names, dtypes and shapes for a call, evaluated by the core from the op's
    rules: ``args`` by name, a tensor as ``{"dtype": "float32", "shape": [2, 3], "device": "cpu"}``
    (None for an optional one left out), a parameter as its value (left out: its default).

    Raises:
        ValueError: the call's own check fails (the same message a call raises).
    """
    return _request("output_shapes", {"op": op, "args": args})["outputs"]


def admission(op: str, arg: str, dtype: str, shape: list[int], strides: list[int], offset_bytes: int) -> str:
    """How a view (``shape``, ``strides`` in elements, its data pointer ``offset_bytes`` past a
    16-byte boundary) of tensor input ``arg`` reaches ``op``'s kernel, by the core's layout rule:
    "as_is", "dense_copy", or "refuse" (a mutated input whose layout would need a copy)."""
    return _request(
        "admission",
        {"op": op, "arg": arg, "dtype": dtype, "shape": shape, "strides": strides, "offset_bytes": offset_bytes},
    )["admission"]


def reload() -> None:
    """Forget every compiled run-time kernel of every loaded library (see :func:`opforge.reload`)."""
    _core().opforge_core_reload()


def set_poison_outputs(mode: bool | int) -> None:
    """Fill op outputs with poison before each kernel runs, so that elements a kernel never
    writes show up as mismatches: ``True`` or ``1`` the primary pattern (every byte 0xff: NaN for
    floating types; 0x7b for integers, 123 in int8; True for bool), ``2`` the alternate one (0x5a:
    finite values; False for bool), ``False`` or ``0`` none. Used by :mod:`opforge.verify`; the
    environment variable ``OPFORGE_POISON_OUTPUTS`` (1 or 2) sets it for a whole process (Note
    [The call protocol] in ``src/core/call.h``)."""
    _core().opforge_core_set_poison_outputs(int(mode))


def poison_outputs() -> int:
    """The poison mode outputs get now: 0 (none), 1 or 2 (see :func:`set_poison_outputs`)."""
    return int(_core().opforge_core_poison_outputs())


def poison_byte(dtype: str, mode: int) -> int:
    """The byte repeated over an output of ``dtype`` (opforge's name, e.g. ``"float16"``) in poison
    mode ``mode`` (1 or 2): the core's choice, which every adapter fills with."""
    byte = int(_core().opforge_core_poison_byte(dtype.encode(), int(mode)))
    if byte < 0:
        raise ValueError(f"opforge: no dtype named {dtype!r}")
    return byte


def set_device_value_checks(enabled: bool) -> None:
    """Check declared value domains of device calls on the device (the default) or not; the
    environment variable ``OPFORGE_DEVICE_VALUE_CHECKS=0`` turns it off for a whole process
    (Note [Device value checks] in ``src/core/device_checks.h``)."""
    _core().opforge_core_set_device_value_checks(int(enabled))
