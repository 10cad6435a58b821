"""The checks of one op: values against the CPU reference (or the description's torch
equivalent), opcheck, torch.compile without recompiles, Meta against real, gradcheck, and NVRTC
compilation of every run-time kernel instantiation on a machine without a GPU."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

import torch

from .._core import set_poison_outputs
from .._torch import find_op, precompile
from ..description import Op
from .cases import _FLOATING, SHAPES, Inputs, dtype_of, generate_cases, param_sets, tensor_dtype, without_optional
from .compare import TOLERANCES, compare_outputs
from .report import CaseResult, Report

#: Targets run-time kernels are compiled for on a machine without a GPU: Hopper (built as sm_90a,
#: where kernels may take wgmma paths) and Ampere (sm_80), which compiles their other paths.
CHECK_ARCHS = ("sm_90", "sm_80")


def op_handle(name: str):
    """``torch.ops.<ns>.<op>`` for "ns::op"."""
    ns, op = name.split("::")
    return getattr(getattr(torch.ops, ns), op)


def first_lines(e: BaseException, count: int = 6) -> str:
    """An exception as "Type: message", its first ``count`` lines (opforge's input errors put
    the op on the first line and each bad argument on one after it)."""
    return "\n".join(f"{type(e).__name__}: {e}".splitlines()[:count])


def to(args: list, device: str | None = None, dtype: torch.dtype | None = None) -> list:
    """``args`` with tensors moved to ``device`` and floating ones cast to ``dtype``."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            t = a.to(device) if device else a
            out.append(t.to(dtype) if dtype is not None and t.dtype.is_floating_point else t)
        else:
            out.append(a)
    return out


def keep_layout(a: torch.Tensor, device: str) -> torch.Tensor:
    """``a`` on ``device`` with the same sizes, strides and storage offset (``Tensor.to`` would
    make it dense)."""
    if not isinstance(a, torch.Tensor) or a.device.type == device:
        return a
    # The whole storage, element for element (an expanded view cannot be written through).
    flat = torch.empty(0, dtype=a.dtype).set_(
        a.untyped_storage(), 0, (a.untyped_storage().nbytes() // a.element_size(),)
    )
    return flat.to(device).as_strided(a.shape, a.stride(), a.storage_offset())


def fresh(args: list) -> list:
    """``args`` with every tensor copied in its exact layout (sizes, strides, storage offset: the
    whole storage is copied), so a call that writes its inputs leaves the originals alone."""

    def copy(a: torch.Tensor) -> torch.Tensor:
        storage = a.untyped_storage().clone()
        return torch.empty(0, dtype=a.dtype, device=a.device).set_(storage, a.storage_offset(), a.shape, a.stride())

    return [copy(a) if isinstance(a, torch.Tensor) else a for a in args]


def results(op: Op, handle, args: list) -> tuple:
    """What a call computes: its outputs, then the final values of its mutated inputs, in
    declaration order (those left out as None are skipped). The call writes into ``args``."""
    out = handle(*args)
    outs = () if out is None else tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return outs + tuple(args[a.index] for a in op.mutated if args[a.index] is not None)


def unwritten(op: Op, before: list, after: list) -> str:
    """ "" if every tensor input the op does not declare mutated holds the same bits after a call
    as before it, else which one was written."""
    for a in op.tensors:
        b, c = before[a.index], after[a.index]
        if a.mutated or b is None:
            continue
        same = (
            (b.cpu() == c.cpu()) | (b.cpu().isnan() & c.cpu().isnan()) if b.is_floating_point() else b.cpu() == c.cpu()
        )
        if not bool(same.all()):
            return f"wrote the input {a.name}, which is not declared opforge::mutated"
    return ""


def reference_dtype(op: Op, dtype: str) -> torch.dtype | None:
    """float64 if every floating tensor input of the case accepts float64, else None (the CPU
    reference then runs in the case's own dtypes)."""
    for a in op.tensors:
        if tensor_dtype(op, a, dtype) in _FLOATING and "float64" not in a.dtypes:
            return None
    return torch.float64


def check_values(op: Op, dtype: str, device: str, seed: int, report: Report) -> None:
    """Every case of :func:`generate_cases`: the device kernel against the CPU reference (in
    float64 where the op accepts it), or on the CPU the reference against ``op.equivalent``;
    outputs and the final values of mutated inputs (:func:`results`; an equivalent expression of
    an op that writes its inputs gives its outputs, then those values), and no other input
    written."""
    handle = op_handle(op.name)
    ref_dtype = reference_dtype(op, dtype)
    names = [a.name for a in op.args]
    if device == "cpu" and not op.equivalent:
        report.results.append(
            CaseResult(
                op.name,
                "values",
                dtype,
                "all",
                "skip",
                message="no device kernel on cpu and no .equivalent() expression",
            )
        )
        return
    for case in generate_cases(op, dtype, seed):
        result = CaseResult(
            op.name, "values", dtype, case.label, "pass", tolerance=TOLERANCES.get(dtype), repro=case.repro()
        )
        try:
            args = [keep_layout(a, device) for a in fresh(case.args)]
            out = results(op, handle, args)
            if device == "cpu":
                # One namespace, so that lambdas and comprehensions in the expression see the arguments.
                scope = {"torch": torch, **dict(zip(names, fresh(to(case.args, dtype=torch.float64))))}
                ref = eval(op.equivalent, scope)  # noqa: S307 -- the author's own expression
            else:
                ref = results(op, handle, fresh(to(case.args, dtype=ref_dtype) if ref_dtype is not None else case.args))
            ok, result.max_abs_error, result.error_vs_tolerance, why = compare_outputs(out, ref, dtype)
            why = why or unwritten(op, case.args, args)
            if why:
                result.status, result.message = "FAIL", why
        except Exception as e:  # noqa: BLE001 -- reported as a failed case
            result.status, result.message = "FAIL", first_lines(e)
        report.results.append(result)


def check_structure(op: Op, dtype: str, device: str, seed: int, report: Report) -> None:
    """opcheck, compile without recompiles over three batch sizes, and Meta against real; for an
    op with optional tensor inputs, once with them and once without."""
    cases = generate_cases(op, dtype, seed)
    for suffix in dict.fromkeys(["", without_optional(op)]):
        _check_structure_of(op, dtype, device, report, cases, suffix)


def _check_structure_of(op: Op, dtype: str, device: str, report: Report, cases: list[Inputs], suffix: str) -> None:
    name = op.name
    handle = op_handle(name)
    base = next(c for c in cases if c.label == "shape 3x37" + suffix)
    args = to(base.args, device)

    def record(check: str, fn: Callable[[], str | None], run_dtype: str = dtype) -> None:
        repro = base.repro()
        for a in repro.get("args", []) if run_dtype != dtype else []:  # gradcheck: floating tensors in float64
            if isinstance(a, dict) and a.get("dtype") in _FLOATING:
                a["dtype"] = run_dtype
        try:
            why = fn()
            report.results.append(
                CaseResult(
                    name, check, run_dtype, base.label, "FAIL" if why else "pass", message=why or "", repro=repro
                )
            )
        except Exception as e:  # noqa: BLE001
            report.results.append(
                CaseResult(name, check, run_dtype, base.label, "FAIL", message=first_lines(e), repro=repro)
            )

    def opcheck():
        results = torch.library.opcheck(handle.default, tuple(args))
        failed = {k: v for k, v in results.items() if v != "SUCCESS"}
        return f"opcheck: {failed}" if failed else None

    def meta():
        real = results(op, handle, fresh(args))
        fakes = results(op, handle, [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
        reals = real
        for k, (f, r) in enumerate(zip(fakes, reals)):
            got, want = (f.shape, f.dtype, f.stride()), (r.shape, r.dtype, r.stride())
            if got != want:
                return (f"output {k}: " if len(reals) > 1 else "") + f"meta {got} != real {want}"
        return None

    def compile_check():
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: results(op, handle, list(a)), fullgraph=True, dynamic=True)
        labels = {f"shape {lead}x{last}{suffix}" for lead, last in SHAPES[1:4]}
        batches = [c for c in cases if c.label in labels]
        compiled(*fresh(to(batches[0].args, device)))
        with torch._dynamo.config.patch(error_on_recompile=True):
            for c in batches[1:]:
                a = to(c.args, device)
                ok, _, _, why = compare_outputs(compiled(*fresh(a)), results(op, handle, fresh(a)), dtype)
                if not ok:
                    return f"compiled result differs: {why}"
        return None

    def out_overload():
        outs = results(op, handle, fresh(args))
        buffers = {
            o.name: torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, 123)
            for o, t in zip(op.outputs, outs)
        }
        returned = handle.out(*fresh(args), **buffers)
        returned = returned if isinstance(returned, tuple) else (returned,)
        if any(r is not b for r, b in zip(returned, buffers.values())):
            return "the out= overload did not return its out tensors"
        ok, _, _, why = compare_outputs(tuple(buffers.values()), outs, dtype)
        return None if ok else f"out= differs from the op: {why}"

    def gradcheck():
        targets = op.backward_targets  # the arguments the backward op returns gradients for
        inputs = [
            a.detach().requires_grad_(i in targets) if isinstance(a, torch.Tensor) else a
            for i, a in enumerate(to(base.args, device, dtype=torch.float64))
        ]
        torch.autograd.gradcheck(lambda *a: handle(*a), tuple(inputs), fast_mode=True)
        return None

    record("opcheck", opcheck)
    record("meta", meta)
    record("compile", compile_check)
    if op.out_schema:
        record("out", out_overload)
    if op.backward and reference_dtype(op, dtype) == torch.float64:
        record("gradcheck", gradcheck, "float64")
    elif op.backward:
        report.results.append(
            CaseResult(
                name,
                "gradcheck",
                "float64",
                base.label,
                "skip",
                message="a floating input does not accept float64, which gradcheck needs",
            )
        )


def check_kernels_compile(op: Op, dtypes: Sequence[str], seed: int, report: Report) -> None:
    """Without a GPU the run-time kernels never run, so compile every instantiation (each dtype x
    each combination of the compile-time parameter values the cases use) with NVRTC for each of
    :data:`CHECK_ARCHS`: a source that does not compile fails here, with NVRTC's log."""
    compile_time = [a for a in op.params if a.compile_time]
    sets = param_sets(op, random.Random(seed))
    choices = [list(dict.fromkeys(p[a.index] for p in sets)) for a in compile_time]
    for dtype in dtypes:
        for combination in itertools.product(*choices):  # every combination, not one at a time
            values = {a.name: v for a, v in zip(compile_time, combination)}
            tensors = {a.name: dtype_of(tensor_dtype(op, a, dtype)) for a in op.tensors}
            for arch in CHECK_ARCHS:
                label = ", ".join([f"{k}={v}" for k, v in values.items()] + [arch])
                result = CaseResult(
                    op.name,
                    "nvrtc",
                    dtype,
                    label,
                    "pass",
                    repro={
                        "dtypes": {k: str(v).removeprefix("torch.") for k, v in tensors.items()},
                        "params": values,
                        "arch": arch,
                    },
                )
                try:
                    precompile(op.name, tensors, values, arch=arch)
                except Exception as e:  # noqa: BLE001 -- reported as a failed case
                    result.status, result.message = "FAIL", first_lines(e, 8)
                report.results.append(result)


def verify_op(
    name: str,
    *,
    device: str | None = None,
    seed: int | None = None,
    dtypes: Sequence[str] | None = None,
    report: Report | None = None,
) -> Report:
    """Verify one loaded op (see :mod:`opforge.verify`).

    Args:
        name: qualified op name, e.g. ``"examples::softshrink"`` (its library must be loaded).
        device: ``"cuda"`` (default when a GPU is present) or ``"cpu"``.
        seed: the run's seed (default: random); every case derives its own from it.
        dtypes: dtypes to check (default: every floating dtype the first input with floating
            dtypes accepts, or the first input's first dtype).
        report: a report to append to.

    Returns:
        The :class:`~opforge.verify.Report`; ``report.ok`` is False if any case failed.

    Raises:
        ValueError: no loaded op is called ``name``.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    seed = random.randrange(2**31) if seed is None else seed
    report = report or Report(seed=seed, device=device)
    op = find_op(name)
    # The floating dtypes of the first input that takes any (an index input may come first), else
    # the first input's first dtype; each other input takes the case's dtype where it allows it.
    first = next((a for a in op.tensors if any(d in _FLOATING for d in a.dtypes)), op.tensors[0])
    dtypes = list(dtypes or [d for d in first.dtypes if d in _FLOATING] or first.dtypes[:1])
    set_poison_outputs(True)
    try:
        for k, dtype in enumerate(dtypes):
            check_values(op, dtype, device, seed + k, report)
        if device == "cpu" and op.runtime_kernels:
            check_kernels_compile(op, dtypes, seed, report)
        check_structure(op, "float32" if "float32" in dtypes else dtypes[0], device, seed, report)
    finally:
        set_poison_outputs(False)
    return report
