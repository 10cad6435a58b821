"""The checks of one op: values against the CPU reference (or the description's torch
equivalent), opcheck, torch.compile without recompiles, Meta against real, gradcheck, and, on a
machine without a GPU, compilation of every run-time kernel instantiation (NVRTC) and of every
Triton kernel variant the cases would use (Triton, for a target it is given)."""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Callable, Sequence
from functools import partial

import torch

from .._torch import find_op, precompile
from ..description import Op
from .cases import (
    _FLOATING,
    CaseBuilder,
    DtypeCase,
    Inputs,
    dtype_cases,
    dtype_of,
    exact_float8,
    floating_as,
    generate_cases,
    op_handle,
    param_sets,
    without_optional,
)
from .compare import FLOAT8, TOLERANCES, compare_outputs, equivalent_bound
from .poison import poisoning, rerun_where_hidden
from .report import CaseResult, Report
from .sweep import compile_cases

#: Targets run-time kernels are compiled for on a machine without a GPU: Hopper (built as sm_90a,
#: where kernels may take wgmma paths) and Ampere (sm_80), which compiles their other paths.
CHECK_ARCHS = ("sm_90", "sm_80")


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


def as_dtypes(op: Op, args: list, dtypes: dict[str, str]) -> list:
    """``args`` (in ``op``'s schema order) with each tensor cast to its input's dtype in ``dtypes``."""
    return [
        a.to(dtype_of(dtypes[arg.name])) if isinstance(a, torch.Tensor) and arg.name in dtypes else a
        for arg, a in zip(op.args, args, strict=True)
    ]


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


def results_on(op: Op, handle, args: list, device: str) -> tuple:
    """:func:`results` of a call on copies of ``args`` (CPU tensors) on ``device``, in their layouts."""
    return results(op, handle, [keep_layout(a, device) for a in fresh(args)])


def out_results(op: Op, handle, args: list, like: tuple) -> tuple:
    """What a call of the out= overload of ``handle`` (the op's ``torch.ops`` packet) computes,
    as :func:`results` does: its outputs, given as fresh dense tensors of the shapes, dtypes and
    devices of ``like``'s first ``len(op.outputs)`` (an earlier call's results; while poisoning
    is on the core fills them before the kernel runs), then the final values of the mutated
    inputs. The call writes into ``args``.

    Raises:
        RuntimeError: the overload returned other tensors than the out tensors it was given.
    """
    buffers = [
        None if t is None else torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in like[: len(op.outputs)]
    ]
    returned = handle.out(*args, **{o.name: b for o, b in zip(op.outputs, buffers) if b is not None})
    returned = returned if isinstance(returned, (tuple, list)) else (returned,)
    if any(b is not None and r is not b for r, b in zip(returned, buffers)):
        raise RuntimeError("the out= overload did not return its out tensors")
    return tuple(buffers) + tuple(args[a.index] for a in op.mutated if args[a.index] is not None)


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


#: Float32 gradcheck, for ops that take no float64: central differences with this step, compared
#: at these tolerances (float32 rounding of ~1e-7 |f| divided by 2 eps gives ~5e-5 |f| of noise),
#: over the whole Jacobian: fast mode compares one projection v^T J u of unit vectors, whose value
#: (~1 / sqrt(numel)) falls under such an atol, so a gradient off by a factor of 2 passed it.
FLOAT32_GRADCHECK = {"eps": 1e-3, "atol": 1e-3, "rtol": 1e-2, "fast_mode": False}


def check_values(op: Op, case: DtypeCase, device: str, seed: int, report: Report) -> None:
    """Every case of :func:`generate_cases` for one dtype combination: the device kernel against
    the CPU reference (in float64 where the op accepts that combination with float64 for every
    floating input, else in the case's own dtypes), or on the CPU the reference against
    ``op.equivalent``; outputs and the final values of mutated inputs (:func:`results`; an
    equivalent expression of an op that writes its inputs gives its outputs, then those
    values), and no other input written. Compared at ``case.tolerance``'s tolerances, or for a
    device kernel the op's own for that dtype (``.tolerance()``, :attr:`Op.tolerances`: the
    kernels' arithmetic; the CPU reference and the equivalent keep the defaults). A device
    kernel's floating output that misses those passes still within ``op.tolerance_vs_equivalent``
    times the error of ``op.equivalent`` run on the device in the case's dtypes, where the
    reference is float64 (:func:`equivalent_bound`; the case's ``error_vs_tolerance`` then
    counts its error over that bound, and its message names such outputs). Where an output's
    reference holds the poison, the case runs again with the alternate poison (Note [Poison
    that equals the reference] in :mod:`.poison`); device cases include
    :data:`~.cases.DEVICE_SHAPES`."""
    handle = op_handle(op.name)
    declared = op.tolerances.get(case.tolerance) if device != "cpu" else None
    float8_declared = {d: t for d, t in op.tolerances.items() if d in FLOAT8} if device != "cpu" else None
    exact = exact_float8(op, case)  # float8 results compared bit for bit: the reference in the case's dtypes
    wide = None if exact else floating_as(op, case, "float64", keep_fixed=True)
    # FlashAttention's criterion measures both errors against float64: not against a reference
    # run in the case's own dtypes.
    bound_by_equivalent = device != "cpu" and wide is not None and bool(op.tolerance_vs_equivalent)
    names = [a.name for a in op.args]
    if device not in op.devices:  # an op without a .reference() has no CPU kernel (Note [Equivalent-only ops])
        report.results.append(
            CaseResult(
                op.name,
                "values",
                case.label,
                "all",
                "skip",
                message=f"no {device} kernel (its device kernels are verified against .equivalent() on their device)",
            )
        )
        return
    if device == "cpu" and not op.equivalent:
        report.results.append(
            CaseResult(
                op.name,
                "values",
                case.label,
                "all",
                "skip",
                message="no device kernel on cpu and no .equivalent() expression",
            )
        )
        return
    for inputs in generate_cases(op, case.dtypes, seed, device=device, pinned=case.params):
        result = CaseResult(
            op.name,
            "values",
            case.label,
            inputs.label,
            "pass",
            tolerance=declared or TOLERANCES.get(case.tolerance),
            repro=inputs.repro(),
        )
        try:
            args = [keep_layout(a, device) for a in fresh(inputs.args)]  # kept: unwritten() reads them
            out = results(op, handle, args)
            if device == "cpu" or "cpu" not in op.devices:
                # The equivalent in float64 on the CPU: the reference of an op without a C++ one.
                # One namespace, so that lambdas and comprehensions in the expression see the arguments.
                given = to(inputs.args, "cpu") if exact else to(inputs.args, "cpu", dtype=torch.float64)
                scope = {"torch": torch, **dict(zip(names, fresh(given)))}
                ref = eval(op.equivalent, scope)  # noqa: S307 -- the author's own expression
            else:
                ref_args = as_dtypes(op, inputs.args, wide) if wide is not None else inputs.args
                ref = results(op, handle, fresh(ref_args))
            passed: list[int] = []
            beyond = _equivalent_bound(op, inputs.args, device, passed) if bound_by_equivalent else None
            ok, result.max_abs_error, result.error_vs_tolerance, why = compare_outputs(
                out, ref, case.tolerance, declared, beyond, float8_declared
            )
            if ok:  # Note [Poison that equals the reference]
                why = rerun_where_hidden(
                    op,
                    partial(results_on, op, handle, inputs.args, device),
                    out,
                    tuple(ref) if isinstance(ref, (tuple, list)) else (ref,),
                    partial(
                        compare_outputs,
                        ref=ref,
                        dtype=case.tolerance,
                        tolerance=declared,
                        beyond=beyond,
                        float8_tolerances=float8_declared,
                    ),
                )
                ok = not why
            if ok and passed:
                which = ", ".join(map(str, dict.fromkeys(passed)))
                bound = f"output {which}: within {op.tolerance_vs_equivalent:g} x the equivalent's error"
                result.message = "; ".join(filter(None, [bound, result.message]))
            why = why or unwritten(op, inputs.args, args)
            if why:
                result.status, result.message = "FAIL", why
        except Exception as e:  # noqa: BLE001 -- reported as a failed case
            result.status, result.message = "FAIL", first_lines(e)
        report.results.append(result)


def _equivalent_bound(op: Op, args: list, device: str, passed: list[int]) -> Callable:
    """:func:`equivalent_bound` at ``op.tolerance_vs_equivalent`` with ``op.equivalent`` run on
    ``device`` with the case's arguments (``args``: CPU tensors in the case's dtypes and
    layouts); the outputs it passes are appended to ``passed``."""

    def equivalent():
        scope = {"torch": torch, **dict(zip((a.name for a in op.args), [keep_layout(a, device) for a in fresh(args)]))}
        return eval(op.equivalent, scope)  # noqa: S307 -- the author's own expression

    return equivalent_bound(equivalent, op.tolerance_vs_equivalent, passed)


def check_structure(op: Op, case: DtypeCase, device: str, seed: int, report: Report) -> None:
    """opcheck, compile without recompiles over the sizes of :func:`~.sweep.compile_cases`, Meta
    against real, the out= overload and gradcheck, in one dtype combination; for an op with
    optional tensor inputs, once with them and once without. Not on a device the op has no
    kernel for (an op without a .reference() has no CPU kernel)."""
    if device not in op.devices:
        return
    cases = generate_cases(op, case.dtypes, seed, pinned=case.params)
    for suffix in dict.fromkeys(["", without_optional(op)]):
        _check_structure_of(op, case, device, report, cases, suffix)
        builder = CaseBuilder(op, case.dtypes, seed, pinned=case.params)
        sweep = compile_cases(op, builder, builder.params[0], omit_optional=bool(suffix), suffix=suffix)
        check_compile(op, case, device, sweep, report)


def check_compile(op: Op, case: DtypeCase, device: str, sweep, report: Report) -> None:
    """``torch.compile(fullgraph=True, dynamic=True)`` of the op over ``sweep``'s cases (a
    :class:`~.sweep.Sweep`): compiled on the first, then no recompile on the others (torch's
    ``error_on_recompile``), and each compiled result equal to the op's in eager; reported as not
    applicable (skip) with ``sweep.why`` where the sweep has no cases."""
    if not sweep.cases:
        report.results.append(CaseResult(op.name, "compile", case.label, sweep.label, "skip", message=sweep.why))
        return
    import torch._dynamo

    handle = op_handle(op.name)
    result = CaseResult(
        op.name, "compile", case.label, sweep.label, "pass", repro={"cases": [c.repro() for c in sweep.cases]}
    )
    try:
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: results(op, handle, list(a)), fullgraph=True, dynamic=True)
        compiled(*fresh(to(sweep.cases[0].args, device)))
        with torch._dynamo.config.patch(error_on_recompile=True):
            for c in sweep.cases[1:]:
                a = to(c.args, device)
                ok, _, _, why = compare_outputs(compiled(*fresh(a)), results(op, handle, fresh(a)), case.tolerance)
                if not ok:
                    result.status, result.message = "FAIL", f"{c.label}: compiled result differs: {why}"
                    break
    except Exception as e:  # noqa: BLE001 -- reported as a failed check
        result.status, result.message = "FAIL", first_lines(e)
    report.results.append(result)


def _gradcheck_dtype(op: Op, case: DtypeCase, device: str) -> tuple[torch.dtype, dict, str] | None:
    """The dtype gradcheck runs in, its settings and its device: float64 where the op takes it
    for every floating input, else float32 with :data:`FLOAT32_GRADCHECK`; None if it takes
    neither. The device is ``device`` where its kernel takes that combination, else the CPU
    (whose reference takes every combination: Note [Kernel dtypes])."""
    for dtype, settings in (("float64", {}), ("float32", FLOAT32_GRADCHECK)):
        combination = floating_as(op, case, dtype)
        if combination is not None:
            on = device if {**combination, **case.params} in op.dtype_combinations_on.get(device, ()) else "cpu"
            return getattr(torch, dtype), settings, on
    return None


def _check_structure_of(op: Op, case: DtypeCase, device: str, report: Report, cases: list[Inputs], suffix: str) -> None:
    dtype = case.label
    name = op.name
    handle = op_handle(name)
    # the 3x37 case, else (rules such as K % 64 == 0 that no size near 37 meets) the first shape case
    shaped = [
        c
        for c in cases
        if c.label.startswith("shape ") and (c.label.endswith(suffix) if suffix else " without " not in c.label)
    ]
    base = next((c for c in shaped if c.label == "shape 3x37" + suffix), shaped[0] if shaped else None)
    if base is None:
        report.results.append(
            CaseResult(
                name, "structure", dtype, "shape" + suffix, "FAIL", message="no input shape meets the op's rules"
            )
        )
        return
    args = to(base.args, device)
    float8_args = any(isinstance(a, torch.Tensor) and str(a.dtype).removeprefix("torch.") in FLOAT8 for a in args)

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
        # torch's test_schema compares each tensor before and after the call with torch.allclose,
        # which has no float8 kernel: a case with float8 tensors runs opcheck's other tests.
        utils = [u for u in torch.library._OPCHECK_DEFAULT_UTILS if u != "test_schema" or not float8_args]
        results = torch.library.opcheck(handle.default, tuple(args), test_utils=tuple(utils))
        failed = {k: v for k, v in results.items() if v != "SUCCESS"}
        return f"opcheck: {failed}" if failed else None

    def meta():
        real = results(op, handle, fresh(args))
        fakes = results(op, handle, [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
        reals = real
        for k, (f, r) in enumerate(zip(fakes, reals)):
            got, want = [None if t is None else (t.shape, t.dtype, t.stride()) for t in (f, r)]
            if got != want:
                return (f"output {k}: " if len(reals) > 1 else "") + f"meta {got} != real {want}"
        return None

    def out_overload():
        # the out= call's poisoned outputs against the op's results: an element it does not
        # write differs in one of the two modes (Note [Poison that equals the reference])
        outs = results(op, handle, fresh(args))
        got = out_results(op, handle, fresh(args), outs)
        ok, _, _, why = compare_outputs(got, outs, case.tolerance)
        if ok:
            why = rerun_where_hidden(
                op,
                lambda: out_results(op, handle, fresh(args), outs),
                got,
                outs,
                lambda again: compare_outputs(again, outs, case.tolerance),
            )
        return f"out= differs from the op: {why}" if why else None

    grad = _gradcheck_dtype(op, case, device) if op.backward else None

    def gradcheck():
        targets = op.backward_targets  # the arguments the backward op returns gradients for
        grad_dtype, settings, grad_device = grad
        inputs = [
            a.detach().requires_grad_(i in targets) if isinstance(a, torch.Tensor) else a
            for i, a in enumerate(to(base.args, grad_device, dtype=grad_dtype))
        ]
        with warnings.catch_warnings():  # float32 on purpose (FLOAT32_GRADCHECK)
            warnings.filterwarnings("ignore", message=r"Input #\d+ requires gradient and is not a double precision")
            # the outputs and the written inputs' final values, the op writing copies of the latter
            # (an input that requires grad cannot be written in place)
            mutated = {a.index for a in op.mutated}

            def call(*a):
                return results(
                    op, handle, [t.clone() if i in mutated and t is not None else t for i, t in enumerate(a)]
                )

            torch.autograd.gradcheck(call, tuple(inputs), **{"fast_mode": True, **settings})
        return None

    record("opcheck", opcheck)
    record("meta", meta)
    if op.out_schema:
        record("out", out_overload)
    if grad is not None:
        record("gradcheck", gradcheck, str(grad[0]).removeprefix("torch."))
    elif op.backward:
        report.results.append(
            CaseResult(
                name,
                "gradcheck",
                dtype,
                base.label,
                "skip",
                message="no floating input takes float64 or float32, which gradcheck needs",
            )
        )


def check_kernels_compile(op: Op, cases: Sequence[DtypeCase], seed: int, report: Report) -> None:
    """Without a GPU the run-time kernels never run, so compile every instantiation (each dtype
    combination x each combination of the compile-time parameter values the cases use) with
    NVRTC for each of :data:`CHECK_ARCHS`: a source that does not compile fails here, with
    NVRTC's log. An op whose kernels are prebuilt binaries (check "binary") has each file
    checked instead (Note [Prebuilt kernels] in opforge/op_launch.h): its symbol and parameter
    sizes fail here, and an architecture the file holds no code for is skipped, with the
    message naming what it holds (the author chose the GPUs it runs on)."""
    prebuilt = all(k.backend == "binary" for k in op.runtime_kernels)
    compile_time = [a for a in op.params if a.compile_time]
    sets = param_sets(op, random.Random(seed))
    choices = [list(dict.fromkeys(p[a.index] for p in sets)) for a in compile_time]
    for case in cases:
        # A compile-time parameter whose value selects the case's dtype rule takes that value only.
        mine = [[case.params[a.name]] if a.name in case.params else c for a, c in zip(compile_time, choices)]
        for combination in itertools.product(*mine):  # every combination, not one at a time
            values = {**case.params, **{a.name: v for a, v in zip(compile_time, combination)}}
            tensors = {k: dtype_of(v) for k, v in case.dtypes.items()}
            for arch in CHECK_ARCHS:
                label = ", ".join([f"{k}={v}" for k, v in values.items()] + [arch])
                result = CaseResult(
                    op.name,
                    "binary" if prebuilt else "nvrtc",
                    case.label,
                    label,
                    "pass",
                    repro={"dtypes": dict(case.dtypes), "params": values, "arch": arch},
                )
                try:
                    precompile(op.name, tensors, values, arch=arch)
                except Exception as e:  # noqa: BLE001 -- reported as a failed case
                    # The core's refusal of a binary without code for `arch` (pinned by test_binary_ops.py).
                    absent = prebuilt and f" and no code that runs on {arch} " in str(e)
                    result.status, result.message = "skip" if absent else "FAIL", first_lines(e, 8)
                report.results.append(result)


#: The calls per instantiation whose Triton variants the check "triton" compiles: each compile
#: is a Triton compile of its own, and an instantiation's cases make tens of distinct calls.
MAX_TRITON_CALLS = 4


def _spread(items: list, k: int) -> list:
    """At most ``k`` of ``items``, evenly spaced, the first and the last included."""
    if len(items) <= k:
        return items
    return [items[i] for i in sorted({round(j * (len(items) - 1) / (k - 1)) for j in range(k)})]


def check_triton_compile(op: Op, cases: Sequence[DtypeCase], seed: int, report: Report) -> None:
    """Without a GPU the Triton kernels never run, so compile them for each of
    :data:`CHECK_ARCHS` (Triton compiles for a target it is given) for the calls the value cases
    of ``cases`` would make on a device from ``seed`` (the ``k``-th combination's from ``seed +
    k``, as :func:`verify_op` runs them): of each instantiation's distinct calls, in case order,
    :data:`MAX_TRITON_CALLS` spread from the first to the last, each call's shapes and
    parameters, the variant Triton specialises for them and the general one (Note [Triton
    kernels] in ``opforge/op_launch.h``). One result per dtype combination, compile-time
    parameter values and target; the first call that fails to compile fails it with Triton's
    message (the op, the variant, file and line) and the call's case, and the calls after it are
    not tried."""
    compile_time = {a.name for a in op.params if a.compile_time}
    for k, case in enumerate(cases):
        groups: dict[tuple, dict[str, tuple]] = {}  # compile-time values -> distinct calls
        for inputs in generate_cases(op, case.dtypes, seed + k, device="cuda", pinned=case.params):
            given = {a.name: v for a, v in zip(op.args, inputs.args, strict=True) if v is not None}
            tensors = {n: v for n, v in given.items() if isinstance(v, torch.Tensor)}
            params = {n: v for n, v in given.items() if n not in tensors}
            call = (
                {n: t.dtype for n, t in tensors.items()},
                params,
                {n: tuple(t.shape) for n, t in tensors.items()},
            )
            values = tuple((n, repr(v)) for n, v in params.items() if n in compile_time)
            groups.setdefault(values, {}).setdefault(repr(call), (inputs.label, call))
        for values, calls in groups.items():
            chosen = _spread(list(calls.values()), MAX_TRITON_CALLS)
            for arch in CHECK_ARCHS:
                label = ", ".join([f"{n}={v}" for n, v in values] + [arch, f"{len(chosen)} of {len(calls)} calls"])
                result = CaseResult(op.name, "triton", case.label, label, "pass", repro={"arch": arch})
                for case_label, (dtypes, params, shapes) in chosen:
                    try:
                        precompile(op.name, dtypes, params, arch=arch, shapes=shapes)
                    except Exception as e:  # noqa: BLE001 -- reported as a failed case
                        result.status, result.message = "FAIL", f"{case_label}: {first_lines(e, 16)}"
                        result.repro.update(
                            case=case_label,
                            dtypes={n: str(d).removeprefix("torch.") for n, d in dtypes.items()},
                            params=params,
                            shapes={n: list(s) for n, s in shapes.items()},
                        )
                        break
                report.results.append(result)


def verify_op(
    name: str,
    *,
    device: str | None = None,
    seed: int | None = None,
    dtypes: Sequence[str] | None = None,
    report: Report | None = None,
) -> Report:
    """Verify one loaded op (see :mod:`opforge.verify`) in every dtype combination its rules
    accept (``op.dtype_combinations``, from the core).

    Args:
        name: qualified op name, e.g. ``"examples::softshrink"`` (its library must be loaded).
        device: ``"cuda"`` (default when a GPU is present) or ``"cpu"``.
        seed: the run's seed (default: random); every case derives its own from it.
        dtypes: check only the combinations whose primary input (the first tensor input that
            takes a floating dtype, else the first tensor input) has one of these dtypes.
        report: a report to append to.

    Returns:
        The :class:`~opforge.verify.Report`; ``report.ok`` is False if any case failed.

    Raises:
        ValueError: no loaded op is called ``name``, or ``dtypes`` selects no combination.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    seed = random.randrange(2**31) if seed is None else seed
    report = report or Report(seed=seed, device=device)
    op = find_op(name)
    only = list(dtypes) if dtypes else None
    cases = dtype_cases(op, only, device)
    # The structural checks run once, in the first combination of one dtype throughout (float32
    # if it is one), else the first combination.
    uniform = [c for c in cases if len({*c.dtypes.values()} & set(_FLOATING)) <= 1]
    structure = next((c for c in uniform if c.primary == "float32"), (uniform or cases)[0])
    with poisoning(1):  # every check that runs a kernel: Note [Poison that equals the reference]
        for k, case in enumerate(cases):
            check_values(op, case, device, seed + k, report)
        if device == "cpu" and op.runtime_kernels:
            compiled = [c for c in dtype_cases(op, None, "cuda") if only is None or c.primary in only]
            backends = {k.backend for k in op.runtime_kernels}
            if backends & {"nvrtc", "binary"}:
                check_kernels_compile(op, compiled, seed, report)
            if "triton" in backends:
                check_triton_compile(op, compiled, seed, report)
        check_structure(op, structure, device, seed, report)
    return report
