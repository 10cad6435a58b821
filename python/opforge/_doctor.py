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

- ``cpu_fallback``: an operator that ran on CPU tensors while the model lives on CUDA (an op
  with only a CPU kernel, or a layer that moves its input to the host).
- ``copy``: an operator that copied a tensor between host and GPU (``.cpu()``, ``.numpy()``'s
  copy, ``.to("cuda")``), from the GPU timeline of one step under ``torch.profiler``.
- ``sync``: an operator that made the host wait for the GPU without such a copy (``.item()``,
  ``nonzero``, ``bool(tensor)``).
- ``gpu_idle``: a span of the step in which the GPU ran nothing, with what the host ran in it:
  an operator, or Python outside torch operators (NumPy, SciPy) between two of them (not a span
  at the step's start or end, where the caller's and the profiler's Python runs).

Cost: for a graph break, the time of one eager call of the model (each break costs a graph
boundary on every call); for a recompile, the slowest compiled call after the first; for an op
without a kernel, its own CPU time in one eager call under ``torch.profiler``; for a fallback, its
time on the host; for a copy or a synchronisation, the operator's host time (waiting included);
for an idle gap, the gap. Findings where a layer computes on the host carry an ``opforge new``
command line (``suggestion``) with the shape and dtype the layer was called with.
"""

from __future__ import annotations

import inspect
import os
import re
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ._extras import require
from ._timeline import (
    COPY_OPS,
    ModuleStack,
    Timeline,
    TimelineFinding,
    profile_step,
    timeline_findings,
    user_source,
)
from ._timeline import plot_timelines as _plot
from ._torch import find_op
from .description import TORCH_NAMESPACES


@dataclass
class Finding:
    """One problem: ``kind`` (see the module docstring), ``cost_ms`` (milliseconds, the measure
    the module docstring gives), ``module`` (the module path, "" for the model itself, None if
    unknown), ``source`` ("file:line", or None), ``op`` (the operator, or None), ``message``, and
    ``suggestion`` (the ``opforge new`` command for an op to write, or None)."""

    kind: str
    cost_ms: float
    module: str | None
    source: str | None
    message: str
    op: str | None = None
    suggestion: str | None = None


#: Timed eager calls of the model whose median is a report's ``step_ms``.
STEP_REPEATS = 3


@dataclass
class DoctorReport:
    """Findings, most costly first; ``step_ms``: the median wall time in milliseconds of
    :data:`STEP_REPEATS` eager calls of the model after a warm-up call, the GPU synchronised
    around each (the one step time to quote: the profiled step runs slower under the profiler);
    ``timeline``: the profiled step (:class:`opforge._timeline.Timeline`) and ``timeline_findings``
    the findings drawn on it, for :meth:`save_plot`."""

    step_ms: float
    findings: list[Finding] = field(default_factory=list)
    timeline: Timeline | None = None
    timeline_findings: list[TimelineFinding] = field(default_factory=list)

    def save_plot(self, path, title: str = "opforge doctor"):
        """Writes the step's GPU timeline as a PNG at `path` (see :func:`plot_timelines`); returns it."""
        return plot_timelines({title: self}, path)

    def to_dict(self) -> dict:
        """The report as plain data for :func:`json.dumps`: ``{"step_ms": float, "findings":
        [Finding's fields as a dict, ...]}``."""
        return {"step_ms": self.step_ms, "findings": [asdict(f) for f in self.findings]}

    def print_table(self) -> None:
        """The findings as a rich table on the terminal."""
        from rich.console import Console
        from rich.table import Table

        n = len(self.findings)
        step = f"eager step {self.step_ms:.2f} ms (median of {STEP_REPEATS})"
        table = Table(title=f"opforge doctor: {n} finding{'s' * (n != 1)}, {step}")
        for column in ("kind", "cost ms", "module", "source"):
            table.add_column(column, overflow="fold")
        table.add_column("finding", overflow="fold", min_width=48)
        for f in self.findings:
            module = "(unknown)" if f.module is None else f.module or "(the model)"
            message = f.message + (f"\nnext: {f.suggestion}" if f.suggestion else "")
            table.add_row(f.kind, f"{f.cost_ms:.3f}", module, _short(f.source), message)
        Console(width=max(Console().width, 160)).print(table)  # a pipe or file gets 160 columns, not 80


def plot_timelines(reports: dict[str, DoctorReport], path: str | os.PathLike):
    """Writes the profiled steps of `reports` (title -> report) as one PNG at `path`, one panel
    under the other on a common millisecond axis: the host's operators (the culprits of copy and
    sync findings in red), the GPU's kernels (blue) and copies (orange), and its idle gaps shaded
    and labelled with their source line. Returns the path.

    Raises:
        ImportError: matplotlib is not installed (the message names the extra that brings it).
    """
    require("matplotlib", "doctor", "opforge's timeline plot")
    return _plot([(title, r.timeline, r.timeline_findings) for title, r in reports.items()], path)


def _short(source: str | None) -> str:
    """A source location for the table: relative to the working folder where it lies in it."""
    if source is None:
        return "(unknown)"
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


@dataclass
class _Calls:
    """What the recorder saw of one operator at one source line: calls, host seconds, whether it
    returns a view, and its tensors' devices, the first one's sizes and dtype."""

    view: bool = False
    count: int = 0
    seconds: float = 0.0
    devices: set = field(default_factory=set)
    shape: list | None = None
    dtype: str | None = None


class _OpRecorder(TorchDispatchMode):
    """Records every operator called (name -> the user frame of its first call) and, per
    (operator, user frame, submodule path), its calls, host time and tensors' devices, sizes
    and dtypes."""

    def __init__(self, modules: ModuleStack):
        super().__init__()
        self.modules = modules
        self.calls: dict[str, tuple[str, int] | None] = {}
        self.sites: dict[tuple[str, tuple[str, int] | None, str | None], _Calls] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        where = user_source()
        self.calls.setdefault(name, where)
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        elapsed = time.perf_counter() - t0
        key = (name, where, self.modules.current())
        site = self.sites.setdefault(key, _Calls(view=any(r.alias_info for r in func._schema.returns)))
        site.count += 1
        site.seconds += elapsed
        tensors = [t for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        site.devices |= {t.device.type for t in tensors}
        if site.shape is None and tensors:
            site.shape, site.dtype = list(tensors[0].shape), str(tensors[0].dtype).removeprefix("torch.")
        return out


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


def _op_findings(recorder: _OpRecorder, locate) -> list[Finding]:
    cpu_ms: dict[str, float] = {}
    for (name, _, _), site in recorder.sites.items():
        cpu_ms[name] = cpu_ms.get(name, 0.0) + 1e3 * site.seconds
    findings = []
    for name, where in recorder.calls.items():
        if name.split("::")[0] in TORCH_NAMESPACES:
            continue
        source = f"{where[0]}:{where[1]}" if where else None
        module = _module_pattern({m for (n, _, m), _ in recorder.sites.items() if n == name})
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


#: Aten operators that move no data of their own (views, metadata, conversions from NumPy).
_NO_WORK = frozenset({"aten::lift_fresh", "aten::detach", "aten::alias", "aten::empty", "aten::empty_strided"})


def _suggestion(model: torch.nn.Module, module: str | None, shape: list | None, dtype: str | None) -> str | None:
    """The ``opforge new`` command for an op replacing the submodule at path `module` (named
    after its attribute, or its class where the attribute is an index), or None for the model
    itself or without a floating shape."""
    if not module or shape is None or dtype not in ("float32", "float64", "float16", "bfloat16"):
        return None
    name = module.split(".")[-1]
    if not name.isidentifier():
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", type(model.get_submodule(module)).__name__).lower()
    return f"opforge new my_ops::{name} --dtypes {dtype} --shape {','.join(map(str, shape))}"


def _fallback_findings(model, recorder: _OpRecorder) -> list[Finding]:
    """Operators whose every tensor (inputs and outputs) was on the CPU, not a view, a copy or a
    scalar, in a model that lives on CUDA."""
    findings = []
    for (name, where, module), site in recorder.sites.items():
        if site.devices != {"cpu"} or site.view or name in COPY_OPS or name in _NO_WORK or not site.shape:
            continue
        source = f"{where[0]}:{where[1]}" if where else None
        message = (
            f"{name} ran on the CPU ({site.count} call{'s' * (site.count != 1)}, {site.shape} {site.dtype}) while "
            "the model is on CUDA"
        )
        suggestion = _suggestion(model, module, site.shape, site.dtype)
        findings.append(Finding("cpu_fallback", 1e3 * site.seconds, module, source, message, name, suggestion))
    return findings


def _timeline_findings(model, report: DoctorReport, recorder: _OpRecorder) -> list[Finding]:
    """Copies, synchronisations and GPU idle gaps of the profiled step; for a copy, and a gap in
    which the host ran Python between two of the model's operators, the ``opforge new`` command
    from the sizes and dtype at its source. A gap at the step's start or end is no finding: the
    Python that ran in it is the caller's and the profiler's (the plot still shades it)."""
    sites = {(f"{w[0]}:{w[1]}", m): site for (_, w, m), site in recorder.sites.items() if w is not None}
    findings = []
    for f in report.timeline_findings:
        if f.kind == "gpu_idle" and f.at_edge:
            continue
        site = sites.get((f.source, f.module))
        host_layer = f.kind == "copy" or (f.kind == "gpu_idle" and f.op is None and not f.at_edge)
        suggestion = _suggestion(model, f.module, site.shape, site.dtype) if site and host_layer else None
        findings.append(Finding(f.kind, f.cost_ms, f.module, f.source, f.message, f.op, suggestion))
    return findings


#: dynamo's graph-break reasons, as the Python that causes them.
_BREAK_REASONS = {
    "generic_jump": "Python branches on a tensor's value (if/while/assert on a tensor), which needs it on the host",
}


def _module_pattern(modules: set) -> str | None:
    """One path for a set of submodule paths: the path if one, the paths with * where they differ
    if they have the same depth ("blocks.*.act"), else None (unknown)."""
    if None in modules or not modules:
        return None
    if len(modules) == 1:
        return next(iter(modules))
    parts = [m.split(".") for m in modules]
    if len({len(p) for p in parts}) != 1:
        return None
    return ".".join(p[0] if len(set(p)) == 1 else "*" for p in zip(*parts))


def _merged(findings: list[Finding]) -> list[Finding]:
    """One finding per (kind, source, op): a layer repeated in a loop or a list of blocks gives
    one line, its module paths joined with * where they differ ("blocks.*.act"), its cost the
    sum of its occurrences' (for a graph break or recompile, the largest) and its message the
    costliest one's with "(n times, t ms in all)"."""
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.kind, f.source, f.op), []).append(f)
    merged = []
    for group in groups.values():
        first = max(group, key=lambda f: f.cost_ms)
        if len(group) > 1:  # a graph break's or recompile's cost is one step's: not summed
            total = first.cost_ms if first.kind in ("graph_break", "recompile") else sum(f.cost_ms for f in group)
            module = _module_pattern({f.module for f in group})
            message = f"{first.message} ({len(group)} times, {total:.3f} ms in all)"
            first = replace(first, cost_ms=total, module=module, message=message)
        merged.append(first)
    return merged


def _summary(text: str) -> str:
    """dynamo's message in one line: its first line, and its "Explanation:" where it gives one
    (torch 2.6 and later), or its second line (the fake-kernel and user-code details)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    explanation = next((line for line in lines[1:] if line.startswith("Explanation:")), None)
    detail = explanation.removeprefix("Explanation:").strip() if explanation else (lines[1] if len(lines) > 1 else "")
    return f"{lines[0]}: {detail}" if detail and detail not in lines[0] else lines[0]


def _graph_break_findings(model, inputs, step_ms: float, locate) -> list[Finding]:
    """`locate(file, line)`: the submodule path that ran that line (see doctor)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.no_grad():  # as the eager runs: a failure here is torch.compile's, not the model's
            explained = torch._dynamo.explain(model)(*inputs)
    except Exception as e:  # noqa: BLE001 -- reported, never raised
        why = _summary(str(e)) or type(e).__name__
        return [Finding("compile_error", step_ms, "", None, f"torch.compile cannot trace the model: {why}")]
    findings = []
    for reason in explained.break_reasons:
        frame = reason.user_stack[-1] if reason.user_stack else None
        source = f"{frame.filename}:{frame.lineno}" if frame else None
        module = locate(frame.filename, frame.lineno) if frame else None
        why = _summary(reason.reason)
        for jargon, meaning in _BREAK_REASONS.items():
            if why.startswith(jargon):
                why = f"{meaning} (dynamo: {why})"
        findings.append(Finding("graph_break", step_ms, module, source, why))
    if not findings and explained.graph_break_count:
        # dynamo gave up on a whole frame (a break inside a loop, a skipped function): it runs
        # eagerly, and explain counts -1 breaks; the reasons are in its "unimplemented" counters
        reasons = list(dict.fromkeys(_summary(r) for r in counters["unimplemented"]))
        if not reasons and explained.graph_count == 0:
            return []  # a forward without torch operators: nothing to compile
        reasons = reasons or ["dynamo gives no reason"]
        where = re.findall(r"\(([^()]+) line (\d+)\)", " ".join(counters["unimplemented"]))
        source = f"{where[0][0]}:{where[0][1]}" if where else None
        module = locate(where[0][0], int(where[0][1])) if where else None
        skipped = explained.graph_break_count < 0 or explained.graph_count == 0
        head = "torch.compile runs this forward eagerly" if skipped else "dynamo breaks the graph without a location"
        findings.append(Finding("graph_break", step_ms, module, source, f"{head}: {'; '.join(reasons)}"))
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


def writable_file(path: str | os.PathLike, what: str, suffix: str | None = None) -> Path:
    """`path` as a Path, checked before any work: not a folder, in a folder that exists and can
    be written, ending in `suffix` if given.

    Raises:
        ValueError: naming `what` ("trace", "plot", ...) and the path.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"opforge.doctor: {what} {path} is a folder; give a file name")
    if not path.parent.is_dir():
        raise ValueError(f"opforge.doctor: cannot write the {what} {path}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"opforge.doctor: cannot write the {what} {path}: the folder {path.parent} is not writable")
    if suffix is not None and path.suffix.lower() != suffix:
        raise ValueError(f"opforge.doctor: the {what} must be a {suffix} file, got {path}")
    return path


def checked_plot_file(path: str | os.PathLike) -> Path:
    """`path` checked as the PNG a plot is written to, before any work: a writable .png file, and
    matplotlib installed.

    Raises:
        ValueError: `path` cannot be written or is not a .png (see :func:`writable_file`).
        ImportError: matplotlib is not installed (the message names the extra that brings it).
    """
    path = writable_file(path, "plot", ".png")
    require("matplotlib", "doctor", "opforge.doctor's plot")
    return path


def _lives_on_cuda(model: torch.nn.Module, inputs: Sequence[object]) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for t in pytree.tree_leaves(list(inputs)) if isinstance(t, torch.Tensor)]
    return any(t.device.type == "cuda" for t in tensors)


def doctor(
    model: torch.nn.Module,
    inputs: Sequence[object] | torch.Tensor,
    *,
    trace: str | os.PathLike | None = None,
    plot: str | os.PathLike | None = None,
    min_gap_us: float = 50.0,
) -> DoctorReport:
    """Runs `model(*inputs)` (`inputs` a tuple or list of positional arguments, or one tensor;
    the model runs about eleven times: eagerly four times (a warm-up, then the timed calls of
    ``step_ms``), under a dispatch recorder, under
    ``torch.profiler`` twice (a warm-up step, then the one reported), through
    ``torch._dynamo.explain`` and three times under ``torch.compile``) and returns its findings,
    most costly first (see the module docstring). GPU idle gaps shorter than `min_gap_us`
    microseconds are not reported. Writes the profiled step as a Chrome/Perfetto trace to
    `trace` and as a PNG timeline to `plot` when given. The model's own exceptions in eager mode
    propagate; a model that torch.compile cannot trace is a ``compile_error`` finding.

    Raises:
        TypeError: `model` is not an nn.Module, or `inputs` is neither a tensor nor a tuple/list.
        ValueError: `trace` or `plot` cannot be written (checked first), or `plot` is not a .png.
        ImportError: `plot` is given and matplotlib is not installed (checked first; the message
            names the extra that brings it).
    """
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):  # torch.compile(model): its model
        model = model._orig_mod
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"opforge.doctor: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(
            f"opforge.doctor: inputs must be a tensor or a tuple of the model's positional arguments, "
            f"got {type(inputs).__name__}"
        )
    trace = None if trace is None else writable_file(trace, "trace")
    plot = None if plot is None else checked_plot_file(plot)
    by_source = _module_locator(model)
    on_cuda = _lives_on_cuda(model, inputs)
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    times = []
    with torch.no_grad():
        model(*inputs)  # warm-up: lazy initialisation, run-time kernel compilation
        for _ in range(STEP_REPEATS):
            sync()
            t0 = time.perf_counter()
            model(*inputs)
            sync()
            times.append(1e3 * (time.perf_counter() - t0))
    report = DoctorReport(statistics.median(times))
    with ModuleStack(model) as modules, torch.no_grad(), _OpRecorder(modules) as recorder:
        model(*inputs)
    with warnings.catch_warnings():  # the profiler's notes on clearing events
        warnings.simplefilter("ignore")
        report.timeline = profile_step(model, inputs, trace, cuda=on_cuda)
    report.timeline_findings = timeline_findings(report.timeline, min_gap_us)

    def locate(filename: str, line: int) -> str | None:  # the submodules whose ops ran there, else by source
        ran = {m for (_, w, m), _ in recorder.sites.items() if w == (filename, line)}
        return _module_pattern(ran) if ran else by_source(filename, line)

    report.findings += _op_findings(recorder, locate)
    if on_cuda:
        report.findings += _fallback_findings(model, recorder)
    report.findings += _timeline_findings(model, report, recorder)
    report.findings += _graph_break_findings(model, inputs, report.step_ms, locate)
    report.findings += _recompile_findings(model, inputs, locate)
    report.findings = sorted(_merged(report.findings), key=lambda f: -f.cost_ms)
    if plot is not None:
        report.save_plot(plot)
    return report
