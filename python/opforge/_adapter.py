"""Loading op libraries into PyTorch through the adapter library (libopforge_torch.so)."""

from __future__ import annotations

import ctypes
import json
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ._paths import adapter_path


class OpforgeError(RuntimeError):
    """An op library cannot be loaded (missing file, not an op library, wrong ABI version)."""


@dataclass(frozen=True)
class Library:
    """A loaded op library.

    Attributes:
        path: the shared object's resolved path.
        kernel_dir: the folder its run-time kernel sources are read from
            (``lib<name>.kernels/`` beside the shared object).
        ops: one dict per op, as the adapter describes it: ``name`` ("ns::op"), ``schema``,
            ``doc``, ``file`` and ``line`` of the declaration, ``args`` (name, type, dtypes,
            ranks, defaults, ranges; ``optional: True`` for a tensor the caller may leave out)
            and ``outputs``.
    """

    path: Path
    ops: list[dict] = field(default_factory=list)
    kernel_dir: Path | None = None

    @property
    def op_names(self) -> list[str]:
        """Qualified op names, e.g. ``["examples::softshrink"]``."""
        return [op["name"] for op in self.ops]


_lock = threading.Lock()
_adapter: ctypes.CDLL | None = None
_libraries: dict[Path, Library] = {}


def _load_adapter() -> ctypes.CDLL:
    global _adapter
    if _adapter is None:
        path = adapter_path()
        if not path.exists():
            raise OpforgeError(f"opforge: the torch adapter {path} is not built; run `make build`")
        torch.ops.load_library(str(path))  # libtorch is loaded by now, so its symbols resolve
        lib = ctypes.CDLL(str(path))
        lib.opforge_torch_load_library.argtypes = [
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.opforge_torch_load_library.restype = ctypes.c_int
        lib.opforge_torch_free.argtypes = [ctypes.c_void_p]
        lib.opforge_torch_reload.argtypes = []
        lib.opforge_torch_set_poison_outputs.argtypes = [ctypes.c_int]
        lib.opforge_torch_precompile.restype = ctypes.c_int
        lib.opforge_torch_precompile.argtypes = [
            ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64),
            ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_char_p), ctypes.c_char_p, ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_void_p),
        ]
        _adapter = lib
    return _adapter


def load_library(path: str | Path) -> Library:
    """Load an op library and register its ops with PyTorch.

    Each op ``ns::name`` becomes ``torch.ops.ns.name`` with a schema derived from its
    declaration and CPU (reference), CUDA (if declared) and Meta kernels, so it works in eager,
    ``torch.compile``, ``torch.export`` and AOTInductor; ops that name a backward op also get an
    Autograd kernel that runs it (Note [Backward ops] in ``opforge/op.h``), ops that declare a
    sharding kind DTensor sharding rules (:mod:`opforge.distributed`). Loading the same file twice returns the
    same :class:`Library`.

    Args:
        path: the op library (``lib<name>.so``).

    Returns:
        The loaded :class:`Library`.

    Raises:
        ValueError: the file is not an opforge op library, was built for another ABI version,
            has invalid declarations (each listed with its file:line), declares an op that is
            already registered, or names a backward op that it does not declare or whose
            arguments do not match (nothing is registered then).
        OpforgeError: the file cannot be opened or loaded, or the adapter is not built.
    """
    resolved = Path(path).resolve()
    with _lock:
        if resolved in _libraries:
            return _libraries[resolved]
        adapter = _load_adapter()
        out, err = ctypes.c_void_p(), ctypes.c_void_p()
        status = adapter.opforge_torch_load_library(str(resolved).encode(), ctypes.byref(out), ctypes.byref(err))
        try:
            if status != 0:
                message = ctypes.string_at(err.value).decode() if err.value else "unknown error"
                raise (ValueError if status == 1 else OpforgeError)(message)
            description = json.loads(ctypes.string_at(out.value).decode())
        finally:
            adapter.opforge_torch_free(out)
            adapter.opforge_torch_free(err)
        kernel_dir = Path(description["kernel_dir"]) if description.get("kernel_dir") else None
        lib = Library(path=resolved, ops=description["ops"], kernel_dir=kernel_dir)
        for spec in lib.ops:  # a missing run-time kernel source fails only at the first CUDA call: say so now
            for rk in spec.get("runtime_kernels", []):
                if kernel_dir is not None and not (kernel_dir / rk["source"]).is_file():
                    warnings.warn(f"opforge.load_library: {spec['name']}'s run-time kernel source {rk['source']} is "
                                  f"not in {kernel_dir} (name it in build_library(kernels=...) or "
                                  f"opforge_add_library(... KERNELS ...)); its CUDA calls will fail", stacklevel=2)
        from .distributed import register_sharding_rules

        register_sharding_rules(lib.ops)
        _libraries[resolved] = lib
        return lib


def loaded_libraries() -> list[Library]:
    """Every op library loaded in this process, in load order."""
    with _lock:
        return list(_libraries.values())


#: opforge's dtype codes (include/opforge/c_api.h, OpforgeDtype).
DTYPE_CODES = {
    torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int8: 4,
    torch.int16: 5, torch.int32: 6, torch.int64: 7, torch.uint8: 8, torch.bool: 9,
}


#: Shape-expression node codes of a description's "shape_nodes" (OpforgeExprOp in
#: include/opforge/c_api.h) that Python reads by name.
EXPR_DIM, EXPR_MULTIPLE_OF = 1, 10


def multiple_of_dims(arg: dict) -> dict[int, int]:
    """{dim: k} for each dim a tensor argument of a description declares ``multiple_of(k)``."""
    nodes = arg.get("shape_nodes", []) if arg["type"] == "Tensor" else []
    return {d: n[0][2] for d, n in enumerate(nodes) if n and n[0][0] == EXPR_MULTIPLE_OF}


def reload() -> None:
    """Forget every compiled run-time kernel, so the next call of each op re-reads its kernel
    source (and recompiles it, or finds the new version in the on-disk cache). The op names,
    schemas and anything exported or compiled that refers to them stay the same.
    """
    with _lock:
        _load_adapter().opforge_torch_reload()


def set_poison_outputs(enabled: bool) -> None:
    """Fill op outputs with NaN (integers: 123) before each kernel runs, so that elements a
    kernel never writes show up as mismatches. Used by :mod:`opforge.verify`."""
    _load_adapter().opforge_torch_set_poison_outputs(int(enabled))


def find_op(name: str) -> dict:
    """The description of loaded op ``name`` ("ns::op"), as :attr:`Library.ops` holds it.

    Raises:
        ValueError: no loaded library declares it.
    """
    for lib in _libraries.values():
        for op in lib.ops:
            if op["name"] == name:
                return op
    raise ValueError(f"opforge: no loaded op named {name!r}")


def parse_default(arg: dict) -> object:
    """The Python value of a parameter's declared default, from its library-JSON entry (``arg``
    has "type" and "default", the schema's text, e.g. ``"0.5"``, ``"True"``, ``"'fast'"``)."""
    text = arg["default"]
    kind = arg["type"]
    if kind == "bool":
        return text == "True"
    if kind == "str":
        return text[1:-1]
    if kind.endswith("[]"):
        inner = [t for t in text.strip("[]").split(",") if t.strip()]
        return [float(t) if kind == "float[]" else int(t) for t in inner]
    return float(text) if kind == "float" else int(text)


def precompile(
    op: str,
    dtypes: dict[str, torch.dtype],
    params: dict[str, object] | None = None,
    *,
    arch: str = "sm_90",
    cache_dir: str | Path | None = None,
) -> bool:
    """Compile the run-time kernels of ``op`` for one instantiation, without a GPU.

    The same lookup a launch does: the library's shipped cache, the user cache
    (``$OPFORGE_CACHE_DIR/kernels``, default ``~/.cache/opforge/kernels``), then NVRTC; the
    binary ends up in ``cache_dir`` (default: the user cache), compiled now or copied from the
    cache it was found in, so that a package built there carries it (a warning is printed if
    that folder cannot be written).

    Args:
        op: qualified op name, e.g. ``"examples::softshrink"``.
        dtypes: dtype of each tensor input, by name; an optional input left out (None in the
            call) is omitted.
        params: values of the op's parameters by name (those marked compile-time select the
            instantiation and default to their declared defaults; others may be omitted).
        arch: ``"sm_XX"`` for machine code, ``"compute_XX"`` for PTX.
        cache_dir: where a freshly compiled binary is stored.

    Returns:
        True if every binary was already cached, False if one was compiled now.

    Raises:
        ValueError: unknown op, missing tensor dtype, a dtype or compile-time value the
            description does not allow (checked as a call would), or the kernel source cannot
            be read.
        OpforgeError: NVRTC failed; the message holds its log with the source file and line.
    """
    spec = find_op(op)
    params = dict(params or {})
    for arg in spec["args"]:  # compile-time parameters left out take their defaults
        if arg.get("compile_time") and arg["name"] not in params:
            if "default" not in arg:
                raise ValueError(f"opforge.precompile({op}): no value given for the compile-time parameter "
                                 f"{arg['name']!r}, which has no default")
            params[arg["name"]] = parse_default(arg)
    n = len(spec["args"])
    codes = (ctypes.c_int32 * n)()
    ints = (ctypes.c_int64 * n)()
    floats = (ctypes.c_double * n)()
    strings = (ctypes.c_char_p * n)()
    for i, arg in enumerate(spec["args"]):
        name = arg["name"]
        if arg["type"] == "Tensor":
            if name not in dtypes and not arg.get("optional"):
                raise ValueError(f"opforge.precompile({op}): no dtype given for tensor input {name!r}")
            codes[i] = DTYPE_CODES[dtypes[name]] if name in dtypes else -1  # -1: absent
        elif name in params:
            value = params[name]
            if isinstance(value, str):
                strings[i] = value.encode()
            elif isinstance(value, float):
                floats[i] = value
            else:
                ints[i] = int(value)
    hit = ctypes.c_int32(0)
    err = ctypes.c_void_p()
    adapter = _load_adapter()
    status = adapter.opforge_torch_precompile(
        op.encode(), n, codes, ints, floats, strings, arch.encode(),
        str(cache_dir).encode() if cache_dir is not None else None, ctypes.byref(hit), ctypes.byref(err))
    if status != 0:
        message = ctypes.string_at(err.value).decode() if err.value else "unknown error"
        adapter.opforge_torch_free(err)
        raise (ValueError if status == 1 else OpforgeError)(message)
    return bool(hit.value)
