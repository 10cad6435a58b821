"""Loading op libraries into PyTorch through the adapter library (libopforge_torch.so)."""

from __future__ import annotations

import ctypes
import json
import threading
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
        ops: one dict per op, as the adapter describes it: ``name`` ("ns::op"), ``schema``,
            ``doc``, ``file`` and ``line`` of the declaration, ``args`` (name, type, dtypes,
            ranks, defaults, ranges) and ``outputs``.
    """

    path: Path
    ops: list[dict] = field(default_factory=list)

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
        _adapter = lib
    return _adapter


def load_library(path: str | Path) -> Library:
    """Load an op library and register its ops with PyTorch.

    Each op ``ns::name`` becomes ``torch.ops.ns.name`` with a schema derived from its
    declaration and CPU (reference), CUDA (if declared) and Meta kernels, so it works in eager,
    ``torch.compile``, ``torch.export`` and AOTInductor. Loading the same file twice returns the
    same :class:`Library`.

    Args:
        path: the op library (``lib<name>.so``).

    Returns:
        The loaded :class:`Library`.

    Raises:
        ValueError: the file is not an opforge op library, was built for another ABI version,
            has invalid declarations (each listed with its file:line), or declares an op that is
            already registered.
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
        lib = Library(path=resolved, ops=description["ops"])
        _libraries[resolved] = lib
        return lib


def loaded_libraries() -> list[Library]:
    """Every op library loaded in this process, in load order."""
    with _lock:
        return list(_libraries.values())
