"""Loading op libraries into PyTorch through the torch adapter (libopforge_torch.so)."""

from __future__ import annotations

import ctypes
import json
import threading
import warnings
from pathlib import Path

import torch

from . import _compile_caches, _core
from ._adapter import adapter_path
from ._classes import register_fake_classes
from ._core import OpforgeError
from ._fake import register_data_dependent_fakes
from ._vmap import register_batching_rules
from .description import Library, Op, library_from_json
from .distributed import register_sharding_rules

_lock = threading.Lock()
_adapter: ctypes.CDLL | None = None


_libraries: dict[Path, Library] = {}


def _load_adapter() -> ctypes.CDLL:
    global _adapter
    if _adapter is None:
        path = adapter_path()
        if not path.exists():
            raise OpforgeError(f"opforge: the torch adapter {path} is not built; run `make build`")
        stamp = path.with_suffix(".torch-version")
        built_for = stamp.read_text().strip() if stamp.exists() else None
        if built_for != torch.__version__:
            raise OpforgeError(
                f"opforge: the torch adapter {path} was built for torch {built_for}, but this is torch "
                f"{torch.__version__}; rebuild it (`make build`, with this Python as OPFORGE_PYTHON)"
            )
        torch.ops.load_library(str(path))  # libtorch is loaded by now, so its symbols resolve
        lib = ctypes.CDLL(str(path))
        lib.opforge_torch_load_library.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.opforge_torch_load_library.restype = ctypes.c_int
        lib.opforge_torch_aoti_shim.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.opforge_torch_aoti_shim.restype = ctypes.c_int
        lib.opforge_torch_aoti_prelude.restype = ctypes.c_char_p
        _adapter = lib
    return _adapter


def load_library(path: str | Path) -> Library:
    """Load an op library and register its ops with PyTorch.

    Each op ``ns::name`` becomes ``torch.ops.ns.name`` with a schema derived from its
    declaration and CPU (reference), CUDA (if declared) and Meta kernels, so it works in eager,
    ``torch.compile``, ``torch.export`` and AOTInductor; ops that name a backward op also get an
    Autograd kernel that runs it (Note [Backward ops] in ``opforge/op_builder.h``), ops that declare a
    sharding kind DTensor sharding rules (:mod:`opforge.distributed`). Loading the same file
    twice returns the same :class:`~opforge.description.Library`.

    Args:
        path: the op library (``lib<name>.so``).

    Returns:
        The loaded library's description.

    Raises:
        ValueError: the file is not an opforge op library, was built for another ABI version,
            has invalid declarations, names a backward op that it does not declare or whose
            arguments do not match, or declares an op that is already registered (every
            problem on its own line, "file:line: ns::op: ..."; nothing is registered then).
        OpforgeError: the file cannot be opened or loaded, or the adapter is not built.
    """
    resolved = Path(path).resolve()
    with _lock:
        if resolved in _libraries:
            return _libraries[resolved]
        adapter = _load_adapter()
        description = _core.call(adapter.opforge_torch_load_library, str(resolved))
        lib = library_from_json(resolved, description)
        for op in lib.ops:  # a missing run-time kernel source fails only at the first CUDA call: say so now
            for rk in op.runtime_kernels:
                if lib.kernel_dir is not None and not (lib.kernel_dir / rk.source).is_file():
                    warnings.warn(
                        f"opforge.load_library: {op.name}'s run-time kernel source {rk.source} is "
                        f"not in {lib.kernel_dir} (name it in build_library(kernels=...) or "
                        f"opforge_add_library(... KERNELS ...)); its CUDA calls will fail",
                        stacklevel=2,
                    )
        register_sharding_rules(lib.ops)
        register_data_dependent_fakes(lib.ops)
        register_batching_rules(lib.ops)
        register_fake_classes(lib.classes)
        _libraries[resolved] = lib
        _compile_caches.add_library(str(resolved), json.dumps(description, sort_keys=True))
        return lib


def loaded_libraries() -> list[Library]:
    """Every op library loaded in this process, in load order."""
    with _lock:
        return list(_libraries.values())


def find_op(name: str) -> Op:
    """The declaration of loaded op ``name`` ("ns::op").

    Raises:
        ValueError: no loaded library declares it.
    """
    for lib in loaded_libraries():
        for op in lib.ops:
            if op.name == name:
                return op
    raise ValueError(f"opforge: no loaded op named {name!r}")


def reload() -> None:
    """Forget every compiled run-time kernel, so the next call of each op re-reads its kernel
    source (and recompiles it, or finds the new version in the on-disk cache). The op names,
    schemas and anything exported or compiled that refers to them stay the same.
    """
    _core.reload()


def precompile(
    op: str,
    dtypes: dict[str, torch.dtype],
    params: dict[str, object] | None = None,
    *,
    arch: str = "sm_90",
    cache_dir: str | Path | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
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
            call) is omitted, and so may be one whose dtype the description fixes
            (``same_dtype``, or a single allowed dtype).
        params: values of the op's parameters by name (those marked compile-time select the
            instantiation and default to their declared defaults; others may be omitted).
        arch: ``"sm_XX"`` for machine code, ``"compute_XX"`` for PTX.
        cache_dir: where a freshly compiled binary is stored.
        shapes: the shape of each tensor input of one call, by name (dense layouts), for kernels
            whose variants depend on sizes: a Triton kernel's grid function sets constants and
            Triton specialises on sizes (Note [Triton kernels] in ``opforge/op_launch.h``); its
            variant for these shapes is compiled, and the general one that serves any call. The
            call's checks apply to them.

    A prebuilt kernel (``.cuda_binary()``) compiles nothing: its file is checked (code that runs on
    ``arch``, the symbol, the parameters' sizes; Note [Prebuilt kernels] in
    ``opforge/op_launch.h``) and counts as cached.

    Returns:
        True if every binary was already cached, False if one was compiled now.

    Raises:
        ValueError: unknown op, or a request a call would refuse: a missing tensor dtype, a
            dtype or compile-time value the description does not allow (every problem on its
            own line).
        OpforgeError: NVRTC failed (the message holds its log with the source file and line),
            the kernel source cannot be read, or a prebuilt kernel's file does not hold what
            the op passes its kernel.
    """
    find_op(op)  # loaded by this adapter
    names = {name: str(dtype).removeprefix("torch.") for name, dtype in dtypes.items()}
    return _core.precompile_request(
        op,
        names,
        dict(params or {}),
        arch,
        str(cache_dir) if cache_dir is not None else None,
        {name: list(shape) for name, shape in shapes.items()} if shapes is not None else None,
    )
