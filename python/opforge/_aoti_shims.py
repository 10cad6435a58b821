"""C shims that let an AOTInductor package call opforge ops directly (Note [AOTInductor C shims]
in src/torch/aoti_shims.cpp): the shim library for a program's ops, and the inductor configs that
make the generated model call and link it.

The torch adapter writes each shim from the op's registered schema; this module only collects
them, compiles them into one shared library with AOTInductor's own C++ compiler, and leaves out
ops whose shim name libtorch already exports or another op of the program takes (AOTInductor
drops the namespace from the name).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import _core
from ._adapter import adapter_path
from ._core import OpforgeError
from ._torch import _load_adapter


@dataclass
class ShimLibrary:
    """The C shims of a program's ops.

    Attributes:
        path: the shim library (``libopforge_shims_<hash>.so``), linked by the model.
        declarations: ``{op overload: [prototype]}`` for ``aot_inductor.custom_ops_to_c_shims``.
        skipped: ``{"ns::op": reason}`` for ops that keep AOTInductor's proxy executor.
    """

    path: Path
    declarations: dict = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def link_name(self) -> str:
        """The name ``-l`` takes: ``opforge_shims_<hash>``."""
        return self.path.name.removeprefix("lib").removesuffix(".so")

    def inductor_configs(self) -> dict:
        """The AOTInductor configs that make a compiled model call these shims."""
        return {
            "aot_inductor.custom_ops_to_c_shims": dict(self.declarations),
            "aot_inductor.custom_op_libs": [self.link_name],
        }


@functools.cache
def _torch_exports(device: str) -> ctypes.CDLL:
    name = "libtorch_cuda.so" if device == "cuda" else "libtorch_cpu.so"
    return ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / name))


def build(ops: Iterable[tuple[str, torch._ops.OpOverload]], device: str, folder: Path) -> ShimLibrary | None:
    """Compiles the C shims of ``ops`` on ``device`` into a shared library in ``folder``.

    Args:
        ops: ``(name "ns::op", overload)`` pairs (repeats are fine).
        device: ``"cpu"`` or ``"cuda"``: the device whose kernels the shims call.
        folder: where the library is written (created).

    Returns:
        The library, or None when no op has a shim (every op keeps the proxy executor).

    Raises:
        OpforgeError: the C++ compiler failed (its output in the message).
    """
    from torch._inductor.cpp_builder import get_cpp_compiler

    adapter = _load_adapter()
    definitions, declarations, skipped, functions = [], {}, {}, {}
    for name, overload in dict(ops).items():
        try:
            shim = _core.call(adapter.opforge_torch_aoti_shim, f"{name} {device}")
        except ValueError as err:  # a type C shims cannot carry, no kernel for the device
            skipped[name] = str(err)
            continue
        if hasattr(_torch_exports(device), shim["function"]):
            skipped[name] = f"libtorch exports a shim of the same name, {shim['function']}"
            continue
        if shim["function"] in functions:  # the same op name in two namespaces
            skipped[name] = f"{functions[shim['function']]}'s shim has the same name, {shim['function']}"
            continue
        functions[shim["function"]] = name
        declarations[overload] = [shim["declaration"]]
        definitions.append(shim["definition"])
    if not definitions:
        return None
    source = adapter.opforge_torch_aoti_prelude().decode() + "\n" + "\n".join(definitions)
    adapter_dir = adapter_path().parent
    digest = hashlib.sha256(f"{source}\n{adapter_dir}".encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    src, lib = folder / f"opforge_shims_{digest}.cpp", folder / f"libopforge_shims_{digest}.so"
    src.write_text(source)
    cmd = [get_cpp_compiler(), "-shared", "-fPIC", "-O2", str(src), "-o", str(lib), f"-Wl,-soname,{lib.name}"]
    cmd += [f"-L{adapter_dir}", "-lopforge_torch", f"-Wl,-rpath,{adapter_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    src.unlink()
    if proc.returncode != 0:
        raise OpforgeError(f"opforge: compiling the C shims failed ({' '.join(cmd)}):\n{proc.stderr}")
    return ShimLibrary(lib, declarations, skipped)
