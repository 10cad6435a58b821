"""``opforge.doctor(model, inputs)``: what keeps a model out of the compiled graph or leaves its
custom ops incomplete, ranked by the time it costs, each finding with the module path and
source line that caused it.

Findings (:class:`Finding`, ``kind``):

- ``graph_break``: where ``torch.compile`` (dynamo, through ``torch._dynamo.explain``) splits
  the model's graph, with dynamo's reason; a model dynamo cannot trace at all is reported as one
  finding of kind ``compile_error`` with the exception, never raised.
- ``recompile``: a guard of the compiled model that failed when it was called again with the same
  inputs (Python state the model changes or reads, such as a counter attribute), with the guard
  and the line it came from (``torch._dynamo.utils.guard_failures``).
- ``missing_cuda_kernel``, ``missing_fake_kernel``, ``missing_backward``: custom operators (any
  namespace but torch's own) that the model calls and that lack a CUDA kernel, a Meta/fake
  kernel (needed by ``torch.compile`` and ``torch.export``), or a derivative: for opforge ops from
  the description, for ``torch.library.custom_op`` ops from their registrations, for others from
  the dispatcher's kernels.

Cost: for a graph break, the time of one eager call of the model (each break costs a graph
boundary on every call); for a recompile, the slowest compiled call after the first; for an op,
its own CPU time in one eager call under ``torch.profiler``. The GPU timeline findings (CPU
fallbacks, host-device copies, synchronisations and idle gaps) are not measured yet.
"""

from __future__ import annotations

import inspect
import os
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._torch import TORCH_NAMESPACES, find_op


@dataclass
class Finding:
    """One problem: ``kind`` (see the module docstring), ``cost_ms`` (milliseconds, the measure
    the module docstring gives), ``module`` (the module path, "" for the model itself, None if
    unknown), ``source`` ("file:line", or None), ``op`` (the operator, or None) and ``message``."""

    kind: str
    cost_ms: float
    module: str | None
    source: str | None
    message: str
    op: str | None = None


@dataclass
class DoctorReport:
    """Findings, most costly first; ``step_ms``: one eager call of the model (wall time)."""

    step_ms: float
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"step_ms": self.step_ms, "findings": [asdict(f) for f in self.findings]}

    def print_table(self) -> None:
        """The findings as a rich table on the terminal."""
        from rich.console import Console
        from rich.table import Table

        n = len(self.findings)
        table = Table(title=f"opforge doctor: {n} finding{'s' * (n != 1)}, one eager step {self.step_ms:.2f} ms")
        for column in ("kind", "cost ms", "module", "source", "finding"):
            table.add_column(column, no_wrap=column != "finding", overflow="fold")
        for f in self.findings:
            module = "?" if f.module is None else f.module or "(the model)"
            table.add_row(f.kind, f"{f.cost_ms:.3f}", module, _short(f.source), f.message)
        Console().print(table)


def _short(source: str | None) -> str:
    """A source location for the table: relative to the working folder where it lies in it."""
    if source is None:
        return "?"
    path, _, line = source.rpartition(":")
    try:
        path = os.path.relpath(path)
    except ValueError:
        pass
    return f"{path}:{line}"


def _module_locator(model: torch.nn.Module):
    """A function (filename, line) -> module path of the first submodule whose forward's source
    holds that line, or None."""
    spans = []
    for path, module in model.named_modules():
        forward = type(module).forward
        try:
            lines, first = inspect.getsourcelines(forward)
            spans.append((inspect.getsourcefile(forward), first, first + len(lines) - 1, path))
        except (OSError, TypeError):
            continue

    def locate(filename: str, line: int) -> str | None:
        inner = [s for s in spans if s[0] == filename and s[1] <= line <= s[2]]
        return min(inner, key=lambda s: s[2] - s[1])[3] if inner else None

    return locate


class _OpRecorder(TorchDispatchMode):
    """Records the name of every operator called, with the user frame (file, line) calling it."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, tuple[str, int] | None] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name not in self.calls:
            frame = next(
                (
                    f
                    for f in inspect.stack(context=0)[1:]
                    if "/torch/" not in f.filename and "/opforge/" not in f.filename
                ),
                None,
            )
            self.calls[name] = (frame.filename, frame.lineno) if frame else None
        return func(*args, **(kwargs or {}))


def _has_kernel(name: str, *keys: str) -> bool:
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in keys)


def _coverage(name: str) -> tuple[bool, bool, bool]:
    """(CUDA kernel, Meta/fake kernel, backward) of custom op `name`: from the description for an
    opforge op; from its definition for a ``torch.library.custom_op`` (whose Meta and Autograd
    kernels exist but raise without ``register_fake`` / ``register_autograd``); else from the
    dispatcher's kernels."""
    from torch._library.custom_ops import OPDEFS

    try:
        op = find_op(name)
        return "cuda" in op.devices, True, op.backward is not None
    except ValueError:
        pass
    if name in OPDEFS:
        d = OPDEFS[name]
        return (
            "cuda" in d._backend_fns or None in d._backend_fns,
            d._abstract_fn is not None,
            d._backward_fn is not None,
        )
    composite = _has_kernel(name, "CompositeImplicitAutograd")
    fake = _has_kernel(name, "Meta") or torch._library.simple_registry.singleton.find(name).fake_impl.kernel is not None
    return (
        composite or _has_kernel(name, "CUDA", "CompositeExplicitAutograd"),
        composite or fake,
        composite or _has_kernel(name, "Autograd", "AutogradCUDA"),
    )


def _op_findings(model, inputs, locate) -> list[Finding]:
    recorder = _OpRecorder()
    with torch.no_grad(), recorder:
        model(*inputs)
    with warnings.catch_warnings():  # the profiler's notes on clearing events
        warnings.simplefilter("ignore")
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(*inputs)
    cpu_ms = {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()}
    findings = []
    for name, where in recorder.calls.items():
        if name.split("::")[0] in TORCH_NAMESPACES:
            continue
        source = f"{where[0]}:{where[1]}" if where else None
        module = locate(*where) if where else None
        cost = cpu_ms.get(name, 0.0)
        cuda, fake, backward = _coverage(name)
        checks = [
            ("missing_cuda_kernel", cuda,
             "has no CUDA kernel: on a CUDA model it fails, or its inputs must be moved to the CPU and back"),
            ("missing_fake_kernel", fake, "has no Meta/fake kernel: torch.compile and torch.export cannot trace it"),
            ("missing_backward", backward, "has no backward: gradients cannot flow through it"),
        ]  # fmt: skip
        for kind, present, why in checks:
            if not present:
                findings.append(Finding(kind, cost, module, source, f"{name} {why}", op=name))
    return findings


def _graph_break_findings(model, inputs, step_ms: float, locate) -> list[Finding]:
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(model)(*inputs)
    except Exception as e:  # noqa: BLE001 -- reported, never raised
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [Finding("compile_error", step_ms, "", None, f"torch.compile cannot trace the model: {first}")]
    findings = []
    for reason in explained.break_reasons:
        frame = reason.user_stack[-1] if reason.user_stack else None
        source = f"{frame.filename}:{frame.lineno}" if frame else None
        module = locate(frame.filename, frame.lineno) if frame else None
        findings.append(Finding("graph_break", step_ms, module, source, reason.reason.splitlines()[0]))
    if not findings and explained.graph_break_count:  # e.g. a print inside a nested submodule
        n = explained.graph_break_count
        findings.append(
            Finding(
                "graph_break", step_ms, None, None, f"dynamo reports {n} graph break(s) without a reason or location"
            )
        )
    return findings


def _recompile_findings(model, inputs, locate, calls: int = 3) -> list[Finding]:
    """Calls the compiled model `calls` times with the same inputs (backend "eager": dynamo's
    guards only) and reports each guard that failed, i.e. each recompile, with the guard and the
    line it came from; cost: the wall time of the slowest call after the first (the recompile)."""
    from torch._dynamo.utils import guard_failures

    torch._dynamo.reset()
    guard_failures.clear()
    compiled = torch.compile(model, backend="eager")
    times = []
    try:
        with torch.no_grad():
            for _ in range(calls):
                t0 = time.perf_counter()
                compiled(*inputs)
                times.append(1e3 * (time.perf_counter() - t0))
    except Exception:  # noqa: BLE001 -- a model dynamo cannot trace is _graph_break_findings' compile_error
        return []
    cost = max(times[1:], default=0.0)
    findings = []
    for failures in guard_failures.values():
        for failure in failures:
            guard = failure.splitlines()[0].split("#")[0].strip()
            where = re.findall(r'File "([^"]+)", line (\d+)', failure)  # the user stack: full paths
            source = f"{where[-1][0]}:{where[-1][1]}" if where else None
            module = locate(where[-1][0], int(where[-1][1])) if where else None
            findings.append(Finding("recompile", cost, module, source, f"recompiled: guard {guard} failed"))
    torch._dynamo.reset()
    return findings


def doctor(model: torch.nn.Module, inputs: Sequence[object] | torch.Tensor) -> DoctorReport:
    """Runs `model(*inputs)` (`inputs` a tuple or list of positional arguments, or one tensor;
    the model runs about six times: eagerly, under a dispatch recorder and ``torch.profiler``, and
    once through ``torch._dynamo.explain``) and returns its findings, most costly first (see the
    module docstring). The model's own exceptions in eager mode propagate; a model that
    torch.compile cannot trace is a ``compile_error`` finding.

    Raises:
        TypeError: `model` is not an nn.Module, or `inputs` is neither a tensor nor a tuple/list.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"opforge.doctor: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(
            f"opforge.doctor: inputs must be a tensor or a tuple of the model's positional arguments, "
            f"got {type(inputs).__name__}"
        )
    locate = _module_locator(model)
    with torch.no_grad():
        model(*inputs)  # warm-up: lazy initialisation, run-time kernel compilation
        t0 = time.perf_counter()
        model(*inputs)
        step_ms = 1e3 * (time.perf_counter() - t0)
    report = DoctorReport(step_ms)
    report.findings += _op_findings(model, inputs, locate)
    report.findings += _graph_break_findings(model, inputs, step_ms, locate)
    report.findings += _recompile_findings(model, inputs, locate)
    report.findings.sort(key=lambda f: -f.cost_ms)
    return report
