"""AOTInductor packages that carry their op libraries, and the C++ runner that executes them.

An AOTInductor package (``.pt2``) records the names of the custom ops it calls, not their code.
:func:`package` compiles an exported program and places beside the ``model.pt2`` every op
library it needs plus a manifest, ``opforge_ops.txt`` (one ``<ns>::<op> <library file>`` per
line, and ``class <ns>::<Class> <library file>`` for each custom class whose objects the model
holds: AOTInductor pickles them into the package). The C++ runner (``opforge-runner``) reads the
manifest, loads the libraries, checks that every op and class is registered, and only then loads
the model; a package without its libraries fails with the names of the missing ops, classes and
libraries.

Packages are run in a separate process, in C++: loading them in Python with
``torch._inductor.aoti_load_package`` crashed on the GPU machine (see DESIGN.md), and the
runner is what a deployment uses anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, size_hint

from . import _aoti_shims
from ._adapter import runner_path
from ._core import OpforgeError
from ._progress import status
from ._torch import loaded_libraries, precompile

MANIFEST = "opforge_ops.txt"


@contextlib.contextmanager
def _library_path(folder: Path | None) -> Iterator[None]:
    """LIBRARY_PATH with ``folder`` first while AOTInductor links the model (its C++ compiler
    finds ``aot_inductor.custom_op_libs`` there); absolute, as the compiler runs in a folder of
    its own."""
    if folder is None:
        yield
        return
    old = os.environ.get("LIBRARY_PATH")
    os.environ["LIBRARY_PATH"] = str(folder.resolve()) + (os.pathsep + old if old else "")
    try:
        yield
    finally:
        if old is None:
            del os.environ["LIBRARY_PATH"]
        else:
            os.environ["LIBRARY_PATH"] = old


def _opforge_nodes(program: torch.export.ExportedProgram):
    """(op name, library, node) for every call of an opforge op in the program's graphs."""
    owners = {name: lib for lib in loaded_libraries() for name in lib.op_names}
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
                name = target._schema.name
                if name in owners:
                    yield name, owners[name], node


def custom_ops(program: torch.export.ExportedProgram) -> dict[str, Path]:
    """The opforge ops a program calls, each mapped to the loaded library that declares it.

    Args:
        program: an exported program (``torch.export.export``).

    Returns:
        ``{"ns::op": library path}`` for every opforge op in the graph (and its submodules).
    """
    return {name: lib.path for name, lib, _ in _opforge_nodes(program)}


def custom_classes(program: torch.export.ExportedProgram) -> dict[str, Path]:
    """The opforge custom classes whose objects a program holds (its torchbind constants), each
    mapped to the loaded library that declares it: ``{"ns::Class": library path}``."""
    owners = {c.qualified_name: lib for lib in loaded_libraries() for c in lib.classes}
    found = {}
    for value in program.constants.values():
        if isinstance(value, torch.ScriptObject):
            ns, name = value._type().qualified_name().removeprefix("__torch__.torch.classes.").split(".", 1)
            if f"{ns}::{name}" in owners:
                found[f"{ns}::{name}"] = owners[f"{ns}::{name}"].path
    return found


def _example_shape(value: torch.Tensor) -> tuple[int, ...] | None:
    """The sizes of a graph value (a fake tensor) in the program's example call: a dynamic dim
    takes the example inputs' size (its symbol's hint); None where a size has no example (one
    that depends on data)."""
    try:
        return tuple(size_hint(d) for d in value.shape)
    except GuardOnDataDependentSymNode:  # an unbacked symbol: no example value
        return None


def _instantiations(program: torch.export.ExportedProgram):
    """(op name, tensor dtypes, parameter values, tensor shapes) of each call of an op with
    run-time kernels; the shapes (by input name, the example call's) only for an op with a Triton
    kernel, whose variants depend on sizes (Note [Triton kernels]), else None."""
    seen = set()
    for name, lib, node in _opforge_nodes(program):
        spec = next(op for op in lib.ops if op.name == name)
        if not spec.runtime_kernels:
            continue
        triton = any(k.backend == "triton" for k in spec.runtime_kernels)
        dtypes, params, shapes = {}, {}, {} if triton else None
        for i, arg in enumerate(node.target._schema.arguments):
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name, arg.default_value)
            if isinstance(value, torch.fx.Node):
                dtypes[arg.name] = value.meta["val"].dtype
                if shapes is not None:
                    shapes[arg.name] = _example_shape(value.meta["val"])
            elif value is not None or not isinstance(arg.type, torch.OptionalType):  # None: an absent tensor
                params[arg.name] = value
        if shapes is not None and None in shapes.values():
            warnings.warn(
                f"opforge.aoti.package: a call of {name} has an input whose size depends on data, so the "
                "package carries no compiled variant of its Triton kernels for it: the C++ runner will fail on "
                "that call unless its cache holds one",
                stacklevel=3,
            )
            shapes = None
        key = (name, *(tuple(sorted(d.items(), key=str)) for d in (dtypes, params, shapes or {})))
        if key not in seen:
            seen.add(key)
            yield name, dtypes, params, shapes


def _device_archs(program: torch.export.ExportedProgram) -> list[str]:
    """``sm_XX`` of the CUDA devices the program's example inputs live on."""
    archs = set()
    for node in program.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(val.device)
            archs.add(f"sm_{major}{minor}")
    return sorted(archs)


def package(
    program: torch.export.ExportedProgram,
    package_dir: str | Path,
    *,
    archs: list[str] | None = None,
    inductor_configs: dict | None = None,
    c_shims: bool = False,
) -> Path:
    """AOTInductor-compile ``program`` into ``package_dir/model.pt2`` with its op libraries beside it.

    Also copied: each library's run-time kernel folder (``lib<name>.kernels/``; its sources, which
    the build folder links, as files), with the kernels the graph instantiates compiled ahead of
    time for ``archs`` into its ``cache/``, so the deployed package compiles nothing on first
    inference on those GPUs (NVRTC remains the fallback for others). The device is that of the
    program's example inputs. A Triton kernel (Note [Triton kernels] in ``opforge/op_launch.h``)
    is compiled for each call's shapes in the example inputs (dynamic dims take their example
    sizes): the variant Triton specialises for them and the general variant that serves any
    other sizes, with the function's description, so that the runner, which has no Python,
    needs nothing else; Triton itself must be installed where the package is made. An autotuned
    Triton kernel is carried with every config compiled, and with the tuning choice for the
    call's tuning key where one is in the kernel cache (tuning needs a GPU: run the model there
    once, at the shapes to ship, before packaging). To ship more shapes, precompile them into the
    package's ``lib<name>.kernels/cache`` after this call (:func:`opforge.precompile` with
    ``shapes`` and ``cache_dir``).

    With ``c_shims``, the model calls the opforge ops through C shims generated from their
    schemas (``aot_inductor.custom_ops_to_c_shims``; Note [AOTInductor C shims] in
    src/torch/aoti_shims.cpp) instead of AOTInductor's proxy executor: the shim library
    (``libopforge_shims_<hash>.so``) is linked by the model, carried beside it and listed in the
    manifest (``shims <file>``), which the runner loads before the model. Ops whose arguments
    C shims cannot carry, and calls of out= overloads, keep the proxy executor (a warning names
    them and says why).

    Args:
        program: an exported program whose graph may call opforge ops.
        package_dir: folder to write (created; existing files of the same names are replaced,
            and the libraries a previous package's manifest there listed that this package
            does not use are removed).
        archs: GPU architectures to precompile run-time kernels for, e.g. ``["sm_90"]``;
            default: those of the CUDA devices the program was exported on (none for CPU).
        inductor_configs: passed to ``torch._inductor.aoti_compile_and_package``.
        c_shims: call the opforge ops through generated C shims (above).

    Returns:
        The absolute path of ``model.pt2``.

    Raises:
        ValueError: ``package_dir`` names a ``.pt2`` file instead of the folder to write.
        OpforgeError: a run-time kernel fails to compile (the message holds NVRTC's log, or
            Triton's message with the op, the variant and the file).
    """
    package_dir = Path(package_dir).absolute()
    if package_dir.suffix == ".pt2":
        raise ValueError(
            f"opforge.aoti.package: package_dir {package_dir} names a .pt2 file; give the folder to write "
            f"model.pt2 and its op libraries into (e.g. {package_dir.with_suffix('')})"
        )
    package_dir.mkdir(parents=True, exist_ok=True)
    pt2 = package_dir / "model.pt2"
    configs, shims = dict(inductor_configs or {}), None
    # The runner has AOTInductor check each run's inputs against the program (dtypes, static
    # sizes, strides, devices, dynamic sizes within their export bounds), all but the lower bound
    # of dynamic sizes, which Inductor raises to 2 where export allowed 0 and 1 (a batch of one
    # runs correctly and must pass).
    configs.setdefault("aot_inductor.check_lowerbound", False)
    if c_shims:
        device = "cuda" if _device_archs(program) else "cpu"
        # Shims are generated from an op's default overload: an out= call keeps the proxy executor.
        nodes = [(name, node.target) for name, _, node in _opforge_nodes(program)]
        shims = _aoti_shims.build([(n, t) for n, t in nodes if t._overloadname == "default"], device, package_dir)
        kept = {n: "its out= overload is called" for n, t in nodes if t._overloadname != "default"}
        kept.update(shims.skipped if shims is not None else {})
        if kept:
            warnings.warn(
                "opforge: these ops keep AOTInductor's proxy executor:\n"
                + "\n".join(f"  {name}: {why}" for name, why in sorted(kept.items())),
                stacklevel=2,
            )
    if shims is not None:  # added to the caller's own shims and libraries, if any
        for key, value in shims.inductor_configs().items():
            given = configs.get(key)
            configs[key] = ({**given, **value} if isinstance(value, dict) else [*given, *value]) if given else value
    with (
        status(f"opforge: AOTInductor-compiling {pt2} (tens of seconds)"),
        warnings.catch_warnings(),
        _library_path(shims.path.parent if shims else None),
    ):
        # Inductor deep-copies graphs that hold pytree LeafSpecs, whose isinstance check torch's
        # own pytree module deprecates (torch 2.11): a warning from torch to torch, printed on
        # every package, that the caller cannot act on.
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
        torch._inductor.aoti_compile_and_package(program, package_path=str(pt2), inductor_configs=configs)
    lines, libraries = set(), {}
    for name, lib, _ in _opforge_nodes(program):
        libraries[lib.path] = lib
        lines.add(f"{name} {lib.path.name}")
    for name, path in custom_classes(program).items():
        libraries[path] = next(lib for lib in loaded_libraries() if lib.path == path)
        lines.add(f"class {name} {path.name}")
    for lib in libraries.values():
        shutil.copy2(lib.path, package_dir / lib.path.name)
        if lib.kernel_dir is not None and lib.kernel_dir.is_dir():
            target = package_dir / lib.kernel_dir.name
            shutil.rmtree(target, ignore_errors=True)
            # The kernel folder links its sources: the package gets their contents, less caches.
            ignore = shutil.ignore_patterns("cache", "__pycache__")
            shutil.copytree(lib.kernel_dir, target, symlinks=False, ignore=ignore)
    for arch in _device_archs(program) if archs is None else archs:
        for name, dtypes, params, shapes in _instantiations(program):
            lib = next(lib for lib in libraries.values() if name in lib.op_names)
            cache = package_dir / lib.kernel_dir.name / "cache"
            with status(f"opforge: compiling {name}'s run-time kernels for {arch}"):
                precompile(name, dtypes, params, arch=arch, cache_dir=cache, shapes=shapes)
    if shims is not None:
        lines.add(f"shims {shims.path.name}")
    stale = _manifest_files(package_dir) - _manifest_files(package_dir, lines)
    (package_dir / MANIFEST).write_text(
        "# op library for each custom op of model.pt2\n" + "\n".join(sorted(lines)) + "\n"
    )
    for name in stale:  # a previous package's libraries that this one does not use
        path = package_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return pt2


def _manifest_files(package_dir: Path, lines: Iterable[str] | None = None) -> set[str]:
    """The files and folders a package's manifest accounts for (``lines``, else the manifest
    already in ``package_dir``): each op library with its run-time kernel folder, and the C shim
    library."""
    if lines is None:
        manifest = package_dir / MANIFEST
        lines = manifest.read_text().splitlines() if manifest.is_file() else []
    files = set()
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        name = line.split()[-1]
        if Path(name).name != name:  # a manifest names files of its own folder only
            continue
        files.add(name)
        if line.split()[0] != "shims":
            files.add(Path(name).with_suffix(".kernels").name)
    return files


@dataclass
class RunResult:
    """Outputs and timing of one runner invocation.

    Attributes:
        outputs: the model's outputs, on the CPU (None where the model returns None, as an op's
            output that exists only with an optional input it was not given).
        inputs_after: the inputs after the first run, on the CPU: a model that writes its inputs
            in place (ops with ``opforge::mutated`` inputs, a KV cache) left its writes there.
        latency_ms: per-run wall time in milliseconds (``median``, ``min``, ``max``), measured by
            the runner around ``AOTIModelPackageLoader::run`` plus a device synchronisation.
        device: the device the package ran on.
    """

    outputs: list[torch.Tensor | None]
    inputs_after: list[torch.Tensor]
    latency_ms: dict[str, float]
    device: str


def run(
    package_path: str | Path,
    inputs: Sequence[torch.Tensor],
    *,
    device: str = "cpu",
    warmup: int = 1,
    iters: int = 1,
    timeout: float = 600,
) -> RunResult:
    """Run an AOTInductor package in the C++ runner, in a fresh process with no Python.

    The first run works on the inputs as given (its outputs and the inputs after it are
    returned); warm-up and timed runs start from fresh copies of the original inputs. As in a
    deployment, the runner cannot compile Triton kernels (its environment has no
    ``OPFORGE_TRITON_PYTHON``): it runs the variants the package carries.

    Args:
        package_path: ``model.pt2`` written by :func:`package`, or the folder it was written to.
        inputs: the model's inputs (moved to ``device`` by the runner).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        warmup: untimed runs first (0 or more).
        iters: timed runs (1 or more).
        timeout: seconds before the runner is killed.

    Returns:
        A :class:`RunResult`.

    Raises:
        OpforgeError: the runner is not built, or it failed (the message holds its stderr, e.g.
            the missing ops and libraries, an input whose dtype, device, strides or sizes the
            package was not compiled for, a Triton kernel variant the package does not carry, or
            a flag value it refused such as ``iters=0``).
    """
    runner = runner_path()
    if not runner.exists():
        raise OpforgeError(f"opforge: the C++ runner {runner} is not built; run `make build`")
    with tempfile.TemporaryDirectory(prefix="opforge-run-") as tmp:
        inp, out, after = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt", Path(tmp) / "after.pt"
        # libtorch's pickle format both ways (torch::pickle_save / pickle_load in the runner), which
        # holds float8 tensors; torch.save's _rebuild_tensor_v3 for them is unknown to libtorch.
        inp.write_bytes(torch._C._pickle_save(tuple(t.detach().cpu().contiguous() for t in inputs)))
        cmd = [
            str(runner),
            str(package_path),
            "--inputs",
            str(inp),
            "--output",
            str(out),
            "--inputs-after",
            str(after),
            "--device",
            device,
            "--warmup",
            str(warmup),
            "--iters",
            str(iters),
        ]
        # As in a deployment, the runner has no Python to compile Triton kernels with: it runs the
        # variants the package carries (Note [Triton kernels]).
        env = {k: v for k, v in os.environ.items() if k not in ("OPFORGE_TRITON_PYTHON", "OPFORGE_TRITON_WORKER")}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode < 0:  # a signal: a library or package file the loader mapped is damaged, or a crash
            name = signal.Signals(-proc.returncode).name
            raise OpforgeError(
                f"opforge-runner was killed by {name} running {package_path} (a damaged library or package file "
                f"beside it, one the runner's checks let through, can give SIGBUS):\n{proc.stderr.strip()}"
            )
        if proc.returncode != 0:
            raise OpforgeError(f"opforge-runner failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        outputs, inputs_after = (torch._C._pickle_load_obj(p.read_bytes()) for p in (out, after))
    return RunResult(
        outputs=list(outputs), inputs_after=list(inputs_after), latency_ms=report["latency_ms"], device=report["device"]
    )
