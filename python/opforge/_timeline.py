"""One step of a model under ``torch.profiler``: the host's operators and the GPU's activity on
one clock, what keeps the GPU idle, and a picture of it. Used by :func:`opforge.doctor`.

:func:`profile_step` records the step (operators with their input shapes and source lines,
CUDA runtime calls, kernels and memory copies) and can write it as a Chrome/Perfetto trace;
:func:`timeline_findings` turns it into findings; :func:`plot_timelines` draws one or more
steps as a PNG, GPU busy and idle with the culprits labelled.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile, record_function

#: The record_function range the profiled step runs in.
STEP = "opforge.doctor step"
#: CUDA runtime calls that block the host until the GPU has caught up.
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
#: What a person wrote, for operators whose synchronisation is a Python call's.
SYNC_CALLERS = {
    "aten::item": ".item()",
    "aten::_local_scalar_dense": ".item()",
    "aten::is_nonzero": "bool(tensor)",
    "aten::nonzero": "nonzero()",
    "aten::equal": "torch.equal",
    "aten::tolist": ".tolist()",
}
#: Operators that copy between devices (`.cpu()`, `.to()`, `.cuda()`, `copy_`).
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu", "aten::cuda"})


@dataclass
class HostOp:
    """A top-level operator of the step on the host: ``name``, ``start_us``/``end_us`` (profiler
    microseconds), ``source`` ("file:line" of the user code that called it, or None), ``shapes``
    (its inputs' sizes), ``copies`` (kinds of memory copy it launched: "DtoH", "HtoD", ...),
    ``sync_us`` (microseconds it spent blocked in CUDA synchronisations) and ``kernels`` (the
    number of kernels it launched) and ``module`` (the path of the submodule whose forward called
    it, "" for the model itself, or None)."""

    name: str
    start_us: float
    end_us: float
    source: str | None
    shapes: list
    copies: list[str] = field(default_factory=list)
    sync_us: float = 0.0
    kernels: int = 0
    module: str | None = None

    @property
    def ms(self) -> float:
        return (self.end_us - self.start_us) / 1e3


@dataclass
class Timeline:
    """One profiled step: its window (``start_us``/``end_us``, from the step's start to the end
    of its last host operator or GPU activity, whichever is later), the top-level ``host``
    operators in order, and the GPU's ``device`` activity as (name, start_us, end_us), kernels
    and copies, in order; ``cuda``: whether the GPU was profiled."""

    start_us: float
    end_us: float
    host: list[HostOp]
    device: list[tuple[str, float, float]]
    cuda: bool

    @property
    def ms(self) -> float:
        return (self.end_us - self.start_us) / 1e3

    def idle_gaps(self, min_us: float) -> list[tuple[float, float]]:
        """The spans of the window at least `min_us` long in which the GPU ran nothing (kernels
        and copies merged), in order; [] if the GPU was not profiled."""
        if not self.cuda:
            return []
        gaps, cursor = [], self.start_us
        for _, start, end in sorted(self.device, key=lambda d: d[1]):
            if start - cursor >= min_us:
                gaps.append((cursor, start))
            cursor = max(cursor, end)
        if self.end_us - cursor >= min_us:
            gaps.append((cursor, self.end_us))
        return gaps


#: Prefix of the record_function ranges that name the user's source line of each torch call.
SOURCE = "@"


#: The folders of the packages whose frames are library code, not the user's: torch's and
#: opforge's, where this process imported them from and where links there lead.
_LIBRARY_DIRS = tuple(
    {
        os.path.join(os.path.dirname(path), "")
        for module in (torch.__file__, __file__)
        for path in (module, os.path.realpath(module))
    }
)


@functools.lru_cache(maxsize=4096)
def _library_file(name: str) -> bool:
    """Whether the code file ``name`` (a frame's ``co_filename``) is torch's or opforge's own:
    inside one of :data:`_LIBRARY_DIRS`, or frozen. Decided by the packages' real locations, so a
    user's own files in a folder that happens to be called ``opforge`` or ``torch`` (a clone) stay
    the user's."""
    if name.startswith("<frozen"):
        return True
    return name.startswith(_LIBRARY_DIRS) or os.path.realpath(name).startswith(_LIBRARY_DIRS)


def user_source() -> tuple[str, int] | None:
    """(file, line) of the innermost Python frame outside torch's and opforge's packages (and
    Python's frozen modules), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _library_file(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


class ModuleStack:
    """While entered, ``current()`` is the path of the innermost submodule of `model` whose
    forward is running ("" for the model itself, None outside it), kept by global module
    forward hooks (torch.nn.modules.module.register_module_forward_pre_hook)."""

    def __init__(self, model: torch.nn.Module):
        self.names = {id(m): path for path, m in model.named_modules()}
        self.stack: list[str] = []

    def current(self) -> str | None:
        return self.stack[-1] if self.stack else None

    def __enter__(self) -> ModuleStack:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        def enter(module, args):
            if id(module) in self.names:
                self.stack.append(self.names[id(module)])

        def leave(module, args, output):
            if id(module) in self.names and self.stack:
                self.stack.pop()

        self.handles = [
            register_module_forward_pre_hook(enter),
            register_module_forward_hook(leave, always_call=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()


class _SourceRanges(TorchFunctionMode):
    """Runs each outermost torch call inside a record_function range named ``@module|file:line``
    after the module and the user code that made it (the profiler's own Python stacks give
    functions' first lines)."""

    def __init__(self, modules: ModuleStack):
        super().__init__()
        self.modules = modules

    def __torch_function__(self, func, types, args=(), kwargs=None):
        where = user_source()
        if where is None:
            return func(*args, **(kwargs or {}))
        module = self.modules.current()
        with record_function(f"{SOURCE}{'' if module is None else module}|{where[0]}:{where[1]}"):
            return func(*args, **(kwargs or {}))


def profile_step(
    model: torch.nn.Module, inputs: Sequence[object], trace: str | Path | None = None, cuda: bool = True
) -> Timeline:
    """Runs ``model(*inputs)`` twice under ``torch.profiler`` (CPU, and CUDA when `cuda` and a
    GPU is available; input shapes recorded, each torch call in a range named after its module
    and source line), the GPU synchronised before and after each, and returns the :class:`Timeline`
    of the second (the first warms the profiler up);
    writes the Chrome/Perfetto trace to `trace` if given (open it in https://ui.perfetto.dev)."""
    cuda = cuda and torch.cuda.is_available()
    if not torch.cuda.is_available():  # kineto logs "gpuGetDeviceCount failed" on a machine without a GPU
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # read when the profiler first starts in a process
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    recorded = []

    def ready(prof) -> None:  # the active step's events, and its trace
        recorded.append(prof.events())
        if trace is not None:
            prof.export_chrome_trace(str(trace))

    # One warm-up step under the profiler first (torch.profiler.schedule), so that the profiler's
    # own start-up (CUPTI's first kernel records) is not counted in the step it reports.
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    with profile(activities=activities, record_shapes=True, schedule=schedule, on_trace_ready=ready) as prof:
        for _ in range(2):
            with torch.no_grad(), record_function(STEP), ModuleStack(model) as modules, _SourceRanges(modules):
                model(*inputs)
            if cuda:
                torch.cuda.synchronize()
            prof.step()
    return _timeline(recorded[-1], cuda)


def _timeline(events, cuda: bool) -> Timeline:
    from torch.autograd import DeviceType

    step = next(e for e in events if e.name == STEP)

    def is_op(e) -> bool:
        return e.device_type == DeviceType.CPU and "::" in e.name and not e.name.startswith(SOURCE)

    def top_level(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if is_op(parent):
                return False
            parent = parent.cpu_parent
        return True

    def module_and_source(e) -> tuple[str | None, str | None]:
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith(SOURCE):
            parent = parent.cpu_parent
        if parent is None:
            return None, None
        module, _, source = parent.name[len(SOURCE) :].partition("|")
        return module, source

    def within_step(e) -> bool:
        return step.time_range.start <= e.time_range.start <= step.time_range.end

    host = []
    for e in events:
        if not (is_op(e) and within_step(e) and top_level(e)):
            continue
        module, source = module_and_source(e)
        op = HostOp(e.name, e.time_range.start, e.time_range.end, source, list(e.input_shapes), module=module)
        todo = list(e.cpu_children)
        while todo:
            child = todo.pop()
            todo += child.cpu_children
            if child.name in SYNC_CALLS:
                op.sync_us += child.time_range.end - child.time_range.start
            for k in child.kernels:
                if k.name.startswith("Memcpy "):
                    op.copies.append(k.name.split()[1])
                elif not k.name.startswith("Memset"):
                    op.kernels += 1
        host.append(op)
    host.sort(key=lambda o: o.start_us)
    device = sorted(
        (e.name, e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA and e.time_range.start >= step.time_range.start
    )
    end = max([step.time_range.end] + [d[2] for d in device])
    return Timeline(step.time_range.start, end, host, device, cuda)


@dataclass
class TimelineFinding:
    """What :func:`timeline_findings` found: ``kind`` ("copy", "sync", "gpu_idle"), ``cost_ms``,
    ``source``, ``message``, ``op`` (the operator, or None: Python outside torch operators),
    ``span_us`` (where on the timeline), ``shapes`` (the operator's input sizes, or None) and
    ``module`` (the submodule's path, or None); ``at_edge``: a gap whose Python ran at the step's
    start or end, where the caller's and the profiler's own work run too."""

    kind: str
    cost_ms: float
    source: str | None
    message: str
    op: str | None
    span_us: tuple[float, float]
    shapes: list | None = None
    module: str | None = None
    at_edge: bool = False


def timeline_findings(tl: Timeline, min_gap_us: float = 50.0) -> list[TimelineFinding]:
    """Copies between host and GPU (each operator that launched one; cost: its host time, which
    includes waiting for the GPU), synchronisations that are not such copies (``.item()``,
    ``nonzero``; cost: the same), and GPU idle gaps of at least `min_gap_us` microseconds (cost:
    the gap), each with what the host ran in it: the operator that covered most of it, or the
    Python between two operators where none did."""
    found = []
    for op in tl.host:
        span = (op.start_us, op.end_us)
        host_copies = [c for c in op.copies if c in ("DtoH", "HtoD")]
        if host_copies and op.name not in SYNC_CALLERS:
            what = " and ".join(dict.fromkeys({"DtoH": "GPU to host", "HtoD": "host to GPU"}[c] for c in host_copies))
            wait = f", {op.sync_us / 1e3:.3f} ms of it waiting for the GPU" if op.sync_us else ""
            shape = op.shapes[0] if op.shapes else None
            message = f"{op.name} copied {list(shape) if shape else 'a tensor'} {what}{wait}"
            found.append(TimelineFinding("copy", op.ms, op.source, message, op.name, span, op.shapes, op.module))
        elif op.sync_us > 0:
            caller = SYNC_CALLERS.get(op.name, op.name)
            message = f"{caller} ({op.name}) made the host wait {op.sync_us / 1e3:.3f} ms for the GPU"
            found.append(TimelineFinding("sync", op.ms, op.source, message, op.name, span, op.shapes, op.module))
    for g0, g1 in tl.idle_gaps(min_gap_us):
        found.append(_gap_finding(tl, g0, g1))
    return found


def _gap_finding(tl: Timeline, g0: float, g1: float) -> TimelineFinding:
    inside = [o for o in tl.host if o.start_us < g1 and o.end_us > g0]
    overlap = {id(o): min(o.end_us, g1) - max(o.start_us, g0) for o in inside}
    gap_ms = (g1 - g0) / 1e3
    head = f"GPU idle {gap_ms:.3f} ms ({100 * (g1 - g0) / max(tl.end_us - tl.start_us, 1e-9):.0f}% of the step)"
    # the longest stretch of the gap without any host operator: Python (NumPy, SciPy, ...) running
    cursor, best = g0, (g0, g0)
    for o in sorted(inside, key=lambda o: o.start_us):
        if o.start_us - cursor > best[1] - best[0]:
            best = (cursor, o.start_us)
        cursor = max(cursor, o.end_us)
    if g1 - cursor > best[1] - best[0]:
        best = (cursor, g1)
    busiest = max(inside, key=lambda o: overlap[id(o)], default=None)
    if busiest is not None and overlap[id(busiest)] >= best[1] - best[0]:
        message = f"{head}: the host ran {busiest.name} for {overlap[id(busiest)] / 1e3:.3f} ms of it"
        return TimelineFinding(
            "gpu_idle", gap_ms, busiest.source, message, busiest.name, (g0, g1), busiest.shapes, busiest.module
        )
    before = [o for o in tl.host if o.end_us <= best[0] + 1e-3]
    after = [o for o in tl.host if o.start_us >= best[1] - 1e-3]
    prev, nxt = (before[-1] if before else None), (after[0] if after else None)

    def at(o: HostOp | None) -> str:
        return "the step's start or end" if o is None else o.name + (f" at {o.source}" if o.source else "")

    message = (
        f"{head}: the host ran Python outside torch operators for {(best[1] - best[0]) / 1e3:.3f} ms, "
        f"between {at(prev)} and {at(nxt)}"
    )
    culprit = prev if prev is not None and prev.source else nxt
    return TimelineFinding(
        "gpu_idle",
        gap_ms,
        culprit.source if culprit else None,
        message,
        None,
        (g0, g1),
        culprit.shapes if culprit is not None else None,
        culprit.module if culprit is not None else None,
        prev is None or nxt is None,
    )


def plot_timelines(steps: Sequence[tuple[str, Timeline, Sequence[TimelineFinding]]], path: str | Path) -> Path:
    """Draws each (title, timeline, findings) as one panel of a PNG at `path`, one panel under
    the other on a common millisecond axis: the host's operators (culprits of findings in red),
    the GPU's kernels and copies, and its idle gaps shaded and labelled with their cause.
    Returns `path`. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max((tl.ms for _, tl, _ in steps), default=1.0)
    fig, axes = plt.subplots(len(steps), 1, figsize=(12, 2.6 * len(steps)), squeeze=False, sharex=True)
    for ax, (title, tl, findings) in zip(axes[:, 0], steps):
        culprits = {(f.span_us, f.op) for f in findings if f.kind != "gpu_idle"}

        def ms(t: float, tl=tl) -> float:
            return (t - tl.start_us) / 1e3

        for o in tl.host:
            red = ((o.start_us, o.end_us), o.name) in culprits
            ax.broken_barh([(ms(o.start_us), max(o.ms, width / 2000))], (1.1, 0.8), color="tab:red" if red else "0.6")
        for name, start, end in tl.device:
            color = "tab:orange" if name.startswith("Memcpy") else "tab:blue"
            ax.broken_barh([(ms(start), max((end - start) / 1e3, width / 2000))], (0.1, 0.8), color=color)
        gaps = sorted((f for f in findings if f.kind == "gpu_idle"), key=lambda f: -f.cost_ms)
        for rank, f in enumerate(gaps):
            g0, g1 = ms(f.span_us[0]), ms(f.span_us[1])
            ax.axvspan(g0, g1, ymin=0.0, ymax=0.5, color="tab:red", alpha=0.25)
            if rank >= 6 or g1 - g0 < width / 30:  # the largest gaps get a label; the rest stay shaded
                continue
            where = Path(f.source.rpartition(":")[0]).name + ":" + f.source.rpartition(":")[2] if f.source else "?"
            ax.text((g0 + g1) / 2, 0.5, f"idle {f.cost_ms:.2f} ms\n{where}", ha="center", va="center", fontsize=8)
        ax.set_yticks([0.5, 1.5], ["GPU", "host"])
        ax.set_ylim(0, 2)
        busy = tl.ms - sum(g1 - g0 for g0, g1 in tl.idle_gaps(0.0)) / 1e3
        gpu = f", GPU busy {busy:.2f} ms ({100 * busy / max(tl.ms, 1e-9):.0f}%)" if tl.cuda else ", GPU not profiled"
        ax.set_title(f"{title}: the profiled step {tl.ms:.2f} ms{gpu}", fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("ms since the step's start")
    axes[-1, 0].set_xlim(0, width)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
