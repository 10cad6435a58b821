"""AOTInductor packages that carry their op libraries, and the C++ runner that executes them.

An AOTInductor package (``.pt2``) records the names of the custom ops it calls, not their code.
:func:`package` compiles an exported program and places beside the ``model.pt2`` every op
library it needs plus a manifest, ``opforge_ops.txt`` (one ``<ns>::<op> <library file>`` per
line). The C++ runner (``opforge-runner``) reads the manifest, loads the libraries, checks that
every op is registered, and only then loads the model; a package without its libraries fails
with the names of the missing ops and libraries.

Packages are run in a separate process, in C++: loading them in Python with
``torch._inductor.aoti_load_package`` crashed on the GPU machine (see DESIGN.md), and the
runner is what a deployment uses anyway.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ._adapter import OpforgeError, loaded_libraries
from ._paths import runner_path

MANIFEST = "opforge_ops.txt"


def custom_ops(program: torch.export.ExportedProgram) -> dict[str, Path]:
    """The opforge ops a program calls, each mapped to the loaded library that declares it.

    Args:
        program: an exported program (``torch.export.export``).

    Returns:
        ``{"ns::op": library path}`` for every opforge op in the graph (and its submodules).
    """
    owners = {name: lib.path for lib in loaded_libraries() for name in lib.op_names}
    used: dict[str, Path] = {}
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
                name = target._schema.name
                if name in owners:
                    used[name] = owners[name]
    return used


def package(
    program: torch.export.ExportedProgram,
    package_dir: str | Path,
    *,
    inductor_configs: dict | None = None,
) -> Path:
    """AOTInductor-compile ``program`` into ``package_dir/model.pt2`` with its op libraries beside it.

    The device is that of the program's example inputs (compile on CUDA for a CUDA package).

    Args:
        program: an exported program whose graph may call opforge ops.
        package_dir: folder to write (created; existing files of the same names are replaced).
        inductor_configs: passed to ``torch._inductor.aoti_compile_and_package``.

    Returns:
        Path of ``model.pt2``.
    """
    package_dir = Path(package_dir)
    package_dir.mkdir(parents=True, exist_ok=True)
    pt2 = package_dir / "model.pt2"
    torch._inductor.aoti_compile_and_package(program, package_path=str(pt2), inductor_configs=inductor_configs or {})
    lines = []
    for name, lib in sorted(custom_ops(program).items()):
        shutil.copy2(lib, package_dir / lib.name)
        lines.append(f"{name} {lib.name}")
    (package_dir / MANIFEST).write_text("# op library for each custom op of model.pt2\n" + "\n".join(lines) + "\n")
    return pt2


@dataclass
class RunResult:
    """Outputs and timing of one runner invocation.

    Attributes:
        outputs: the model's outputs, on the CPU.
        latency_ms: per-run wall time in milliseconds (``median``, ``min``, ``max``), measured by
            the runner around ``AOTIModelPackageLoader::run`` plus a device synchronisation.
        device: the device the package ran on.
    """

    outputs: list[torch.Tensor]
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

    Args:
        package_path: ``model.pt2`` written by :func:`package`.
        inputs: the model's inputs (moved to ``device`` by the runner).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        warmup: untimed runs first.
        iters: timed runs.
        timeout: seconds before the runner is killed.

    Returns:
        A :class:`RunResult`.

    Raises:
        OpforgeError: the runner is not built, or it failed (the message holds its stderr, e.g.
            the missing ops and libraries).
    """
    runner = runner_path()
    if not runner.exists():
        raise OpforgeError(f"opforge: the C++ runner {runner} is not built; run `make build`")
    with tempfile.TemporaryDirectory(prefix="opforge-run-") as tmp:
        inp, out = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
        torch.save([t.detach().cpu().contiguous() for t in inputs], inp)
        cmd = [str(runner), str(package_path), "--inputs", str(inp), "--output", str(out), "--device", device,
               "--warmup", str(warmup), "--iters", str(iters)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise OpforgeError(f"opforge-runner failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        outputs = torch.load(out)
    return RunResult(outputs=list(outputs), latency_ms=report["latency_ms"], device=report["device"])
