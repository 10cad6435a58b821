"""``opforge verify``: device kernels against the CPU reference, per op and per model.

Op level (:func:`verify_op`): inputs are generated from the op's description (dtype sets, ranks,
shape rules, parameter ranges): random sizes, sizes that straddle vector and block boundaries,
strided views (permuted, sliced, expanded, storage-offset, and padded or permuted rows that stay
16-byte aligned), empty tensors and NaN/Inf values. Dims declared ``multiple_of(k)`` get
multiples of k.
Optional tensor inputs (``Tensor? name=None``) are given in every case, and the shape and empty
cases are repeated with all of them left out (None).
Each case runs the device kernel with its outputs poisoned (NaN) beforehand and compares it
with the CPU reference run on float64 copies of the inputs where the op accepts float64, with
tolerances by dtype (:data:`TOLERANCES`). On a machine without a GPU, the CPU reference is
compared with the description's ``.equivalent()`` torch expression instead (a reference
compared with itself proves nothing), and each run-time kernel instantiation the cases would use
is compiled with NVRTC for sm_90 and sm_80 (check "nvrtc"), so a kernel source that does not
compile fails there too, on either side of an architecture-specific path. Parameters: defaults, the bounds of ranges and a point inside, a random value
for unranged floats, every choice. Every case draws fresh random data from a seed that the
report prints. Each op also gets ``torch.library.opcheck``, a ``torch.compile(fullgraph=True,
dynamic=True)`` no-recompile check over three batch sizes, and a Meta-versus-real check of
shape, dtype and strides (with and without its optional tensor inputs, if it has any). An op that
names a backward op (Note [Backward ops]) and accepts float64 also gets
``torch.autograd.gradcheck`` in float64 (check "gradcheck"): the gradients its backward op
computes against finite differences of the op itself.

Model level (:func:`verify_model`): export, AOTInductor-compile, run the package in the C++
runner on the device, and compare each output with the model run in eager on the CPU.

CLI: ``python -m opforge verify LIBRARY_OR_OP... [--device cuda] [--seed N] [--json FILE]``.
"""

from __future__ import annotations

import itertools
import math
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import aoti
from ._adapter import DTYPE_CODES, EXPR_MULTIPLE_OF, find_op, multiple_of_dims, parse_default as _parse_default
from ._adapter import precompile, set_poison_outputs

#: (atol, rtol) against a float64 reference, by dtype. tf32 is listed for ops whose kernels use
#: TF32 tensor-core math on float32 inputs.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-5),
    "tf32": (5e-4, 5e-4),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}

_DTYPES = {name: dtype for dtype, name in
           ((d, str(d).removeprefix("torch.")) for d in DTYPE_CODES)}
_FLOATING = ("float32", "float64", "float16", "bfloat16")

#: Sizes of the leading and the last dim: odd sizes, and sizes on either side of 16-byte vectors
#: and of 256-thread blocks.
_SHAPES = [(1, 1), (3, 37), (33, 255), (33, 256), (33, 257), (2, 4097)]


@dataclass
class CaseResult:
    """One checked case. ``status`` is "pass", "FAIL" or "skip"; ``repro`` says how to rebuild
    the inputs (seed, dtypes, shapes, strides, parameters)."""

    op: str
    check: str
    dtype: str
    case: str
    status: str
    max_abs_error: float | None = None
    error_vs_tolerance: float | None = None  # worst |out - ref| / (atol + rtol * |ref|); <= 1 passes
    tolerance: tuple[float, float] | None = None
    message: str = ""
    repro: dict = field(default_factory=dict)


@dataclass
class Report:
    """Every case of a verification run, with the seed it started from."""

    seed: int
    device: str
    results: list[CaseResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "FAIL"]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict:
        return {"seed": self.seed, "device": self.device, "ok": self.ok, "tolerances": TOLERANCES,
                "results": [asdict(r) for r in self.results]}


# ---- inputs ---------------------------------------------------------------------------------


def _eval_nodes(nodes: list, shapes: dict[int, list[int]], params: dict[int, object]) -> int | None:
    """Evaluates a postfix shape expression (OpforgeExprNode triples); None if it reads an
    unknown size."""
    stack: list[int] = []
    for op, arg, value in nodes:
        if op == 0:
            stack.append(value)
        elif op == 1:
            if arg not in shapes:
                return None
            dims = shapes[arg]
            stack.append(dims[value] if -len(dims) <= value < len(dims) else None)
        elif op == 2:
            stack.append(params.get(arg))
        else:
            b, a = stack.pop(), stack.pop()
            if a is None or b is None:
                return None
            stack.append({3: a + b, 4: a - b, 5: a * b, 6: a // b if b else None,
                          7: -(-a // b) if b else None, 8: min(a, b), 9: max(a, b)}[op])
    return stack[0] if len(stack) == 1 else None


def _round_up(size: int, k: int) -> int:
    """The multiple of ``k`` at or above ``size``: the edge sizes the cases use (1, 37, 257, ...)
    land on the smallest multiple and on those that straddle the kernels' tiles; 0 stays 0."""
    return -(-size // k) * k if size else 0


def _tensor_dtype(spec: dict, i: int, dtype: str) -> str:
    """dtype of tensor argument ``i`` for a case whose main dtype is ``dtype``."""
    arg = spec["args"][i]
    if "same_dtype" in arg:
        j = next(k for k, a in enumerate(spec["args"]) if a["name"] == arg["same_dtype"])
        return _tensor_dtype(spec, j, dtype)
    return dtype if dtype in arg["dtypes"] else arg["dtypes"][0]


def _rank(arg: dict) -> int:
    if "shape_nodes" in arg:
        return len(arg["shape_nodes"])
    lo, hi = max(arg["min_rank"], 1), arg["max_rank"]
    rank = max(lo, 2)
    return min(rank, hi) if hi >= 0 else rank


def _shapes(spec: dict, lead: int, last: int, params: dict[int, object]) -> dict[int, list[int]]:
    """A shape for every tensor argument: free dims from (lead, ..., last), constrained dims from
    the shape rules (evaluated once the tensors they read have shapes)."""
    shapes: dict[int, list[int]] = {}
    pending = [i for i, a in enumerate(spec["args"]) if a["type"] == "Tensor"]
    factors = _factors(spec)
    for _ in range(len(pending) + 1):
        for i in list(pending):
            arg = spec["args"][i]
            rank = _rank(arg)
            free = [lead] + [5] * max(rank - 2, 0) + [last] if rank >= 2 else [last] * rank
            free = [_round_up(size, factors[i].get(d, 1)) for d, size in enumerate(free)]
            if "same_shape" in arg:
                j = next(k for k, a in enumerate(spec["args"]) if a["name"] == arg["same_shape"])
                if j in shapes:
                    shapes[i] = list(shapes[j])
                    pending.remove(i)
                continue
            if "shape_nodes" not in arg:
                shapes[i] = free
                pending.remove(i)
                continue
            dims = [(_eval_nodes(n, shapes, params) if n and n[0][0] != EXPR_MULTIPLE_OF else free[d])
                    for d, n in enumerate(arg["shape_nodes"])]
            if all(d is not None for d in dims):
                shapes[i] = dims
                pending.remove(i)
    for i in pending:  # rules that read each other: fall back to free sizes
        shapes[i] = [_round_up(lead, factors[i].get(d, 1)) for d in range(_rank(spec["args"][i]))]
    return shapes


def _factors(spec: dict) -> dict[int, dict[int, int]]:
    """For each tensor argument, the factor each of its dims must be a multiple of: its own
    ``multiple_of`` rules and those of the inputs declared ``same_shape`` of it (whose shapes are
    copies of its own)."""
    args = spec["args"]
    index = {a["name"]: i for i, a in enumerate(args)}
    factors: dict[int, dict[int, int]] = {i: {} for i, a in enumerate(args) if a["type"] == "Tensor"}
    for i, a in enumerate(args):
        for d, k in multiple_of_dims(a).items():
            j, seen = i, set()
            while j not in seen:  # up the same_shape chain to the tensor whose shape is generated
                seen.add(j)
                factors[j][d] = math.lcm(factors[j].get(d, 1), k)
                if "same_shape" not in args[j]:
                    break
                j = index[args[j]["same_shape"]]
    return factors


def _param_sets(spec: dict, rng: random.Random) -> list[dict[int, object]]:
    """Parameter values: the defaults, then each ranged numeric parameter at its bounds and at a
    random point inside, each unranged float parameter at a random point of [0.25, 2], the other
    value of each bool, and every other choice of each parameter with choices."""
    base: dict[int, object] = {}
    for i, a in enumerate(spec["args"]):
        if a["type"] == "Tensor":
            continue
        if "default" in a:
            base[i] = _parse_default(a)
        elif "choices" in a:
            base[i] = a["choices"][0]
        elif a["type"] == "float":
            base[i] = a.get("min", 0.5) if a.get("min", 0.5) > 0 else 0.5
        elif a["type"] == "int":
            base[i] = int(a.get("min", 1)) if a.get("min", 1) >= 1 else 1
        elif a["type"] == "bool":
            base[i] = False
        else:
            base[i] = [] if a["type"].endswith("[]") else ""
    sets = [base]
    for i, a in enumerate(spec["args"]):
        if "choices" in a:  # before ranges: a parameter with both takes only its choices
            sets.extend({**base, i: c} for c in a["choices"] if c != base[i])
        elif a["type"] in ("float", "int") and ("min" in a or "max" in a):
            lo, hi = a.get("min", -4.0), a.get("max", 4.0)
            for v in (lo, hi, rng.uniform(lo, hi)):
                sets.append({**base, i: int(round(v)) if a["type"] == "int" else float(v)})
        elif a["type"] == "float" and "choices" not in a:
            sets.append({**base, i: rng.uniform(0.25, 2.0)})
        elif a["type"] == "bool":
            sets.append({**base, i: not base[i]})
    return sets


def _random_tensor(shape: list[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random values, never all zero: normal for floats, [1, 10) for integers."""
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 2).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    return torch.randint(1, 10, shape, generator=gen).to(dtype)


def _first_lines(e: BaseException, count: int = 6) -> str:
    """An exception as "Type: message", its first ``count`` lines (opforge's input errors put
    the op on the first line and each bad argument on one after it)."""
    return "\n".join(f"{type(e).__name__}: {e}".splitlines()[:count])


def _view(t: torch.Tensor, how: str, gen: torch.Generator) -> torch.Tensor:
    """A non-dense tensor with ``t``'s shape and values layout rules: permuted, sliced, expanded
    or storage-offset (misaligned for vector loads), and two layouts whose last dim stays
    contiguous with 16-byte aligned rows, which reach a ``contiguous_last_dim`` input as they
    are: padded rows (rows further apart than their length) and rows permuted (dims -3 and -2
    swapped in memory, a head split's transpose)."""
    shape = list(t.shape)
    if how == "permuted":
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if how == "padded rows":
        unit = max(1, 16 // t.element_size())
        return _random_tensor(shape[:-1] + [(shape[-1] // unit + 1) * unit], t.dtype, gen)[..., : shape[-1]]
    if how == "rows permuted":
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if how == "sliced":
        return _random_tensor(shape[:-1] + [2 * shape[-1]], t.dtype, gen)[..., ::2]
    if how == "expanded":
        return _random_tensor([1] + shape[1:], t.dtype, gen).expand(shape)
    flat = _random_tensor([t.numel() + 1], t.dtype, gen)
    return flat[1:].view(shape)


def _special(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    for k, v in enumerate((float("nan"), float("inf"), -float("inf"), 1e4, -1e4)):
        if k < flat.numel():
            flat[k * 7 % flat.numel()] = v
    return t


@dataclass
class _Inputs:
    label: str
    args: list
    seed: int

    def repro(self) -> dict:
        return {"seed": self.seed, "case": self.label,
                "args": [{"dtype": str(a.dtype).removeprefix("torch."), "shape": list(a.shape),
                          "stride": list(a.stride()), "storage_offset": a.storage_offset()}
                         if isinstance(a, torch.Tensor) else a for a in self.args]}


def _without_optional(spec: dict) -> str:
    """The label suffix of cases that leave out the op's optional tensor inputs ("" if it has none)."""
    names = [a["name"] for a in spec["args"] if a["type"] == "Tensor" and a.get("optional")]
    return f" without {', '.join(names)}" if names else ""


def generate_cases(spec: dict, dtype: str, seed: int) -> list[_Inputs]:
    """Every input case for one op and dtype (CPU tensors), each from its own seed. Optional
    tensor inputs are given, except in the cases labelled with :func:`_without_optional`'s suffix
    (every shape, and empty), where they are None."""
    rng = random.Random(seed)
    cases: list[_Inputs] = []
    tensor_args = [i for i, a in enumerate(spec["args"]) if a["type"] == "Tensor"]
    without = _without_optional(spec)

    def build(label: str, lead: int, last: int, params: dict[int, object],
              transform: Callable[[int, torch.Tensor, torch.Generator], torch.Tensor] | None = None,
              omit_optional: bool = False) -> None:
        case_seed = rng.randrange(2**31)
        gen = torch.Generator().manual_seed(case_seed)
        shapes = _shapes(spec, lead, last, params)
        args = []
        for i, a in enumerate(spec["args"]):
            if a["type"] != "Tensor":
                args.append(params[i])
                continue
            if omit_optional and a.get("optional"):
                args.append(None)
                continue
            t = _random_tensor(shapes[i], _DTYPES[_tensor_dtype(spec, i, dtype)], gen)
            args.append(transform(i, t, gen) if transform else t)
        cases.append(_Inputs(label, args, case_seed))

    params = _param_sets(spec, rng)
    for lead, last in _SHAPES:
        build(f"shape {lead}x{last}", lead, last, params[0])
        if without:
            build(f"shape {lead}x{last}{without}", lead, last, params[0], omit_optional=True)
    for k, p in enumerate(params[1:], 1):
        build(f"params #{k}", 3, 37, p)
    for how in ("permuted", "sliced", "expanded", "offset", "padded rows", "rows permuted"):
        for i in tensor_args:
            name = spec["args"][i]["name"]

            def transform(j, t, gen, i=i, how=how):
                if j != i or t.dim() == 0 or t.numel() == 0:
                    return t
                if how in ("permuted", "expanded") and (t.dim() < 2 or t.shape[0] < 2):
                    return t
                if how == "rows permuted" and (t.dim() < 3 or t.shape[-3] < 2 or t.shape[-2] < 2):
                    return t
                return _view(t, how, gen)

            build(f"{how} {name}", 4, 40, params[0], transform)
    build("empty", 0, 37, params[0])
    if without:
        build(f"empty{without}", 0, 37, params[0], omit_optional=True)
    if dtype in _FLOATING:
        first = tensor_args[0]
        build("nan/inf", 3, 37, params[0], lambda j, t, gen: _special(t) if j == first else t)
    return cases


# ---- checks ---------------------------------------------------------------------------------


def _op_handle(name: str):
    ns, op = name.split("::")
    return getattr(getattr(torch.ops, ns), op)


def _to(args: list, device: str | None = None, dtype: torch.dtype | None = None) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            t = a.to(device) if device else a
            out.append(t.to(dtype) if dtype is not None and t.dtype.is_floating_point else t)
        else:
            out.append(a)
    return out


def _keep_layout(a: torch.Tensor, device: str) -> torch.Tensor:
    """``a`` on ``device`` with the same sizes, strides and storage offset (``Tensor.to`` would
    make it dense)."""
    if not isinstance(a, torch.Tensor) or a.device.type == device:
        return a
    # The whole storage, element for element (an expanded view cannot be written through).
    flat = torch.empty(0, dtype=a.dtype).set_(a.untyped_storage(), 0, (a.untyped_storage().nbytes() // a.element_size(),))
    return flat.to(device).as_strided(a.shape, a.stride(), a.storage_offset())


def _compare(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> tuple[bool, float, float, str]:
    """(ok, max abs error, worst error / tolerance, why) of ``out`` against ``ref``; NaN must
    match NaN, infinities must match exactly. A reference value beyond the range of ``out``'s
    dtype is taken as the infinity it rounds to (a float16 result of 1e8 is inf, as torch
    computes it)."""
    atol, rtol = TOLERANCES[dtype] if dtype in TOLERANCES else (0.0, 0.0)
    if out.shape != ref.shape:
        return False, math.inf, math.inf, f"shape {list(out.shape)}, expected {list(ref.shape)}"
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if out.dtype.is_floating_point and r.dtype.is_floating_point:
        rounded = r.to(out.dtype).double()
        r = torch.where(rounded.isinf() & ~r.isinf(), rounded, r)
    if o.numel() == 0:
        return True, 0.0, 0.0, ""
    nan_mismatch = o.isnan() != r.isnan()
    comparable = ~o.isnan() & ~r.isnan() & ~(o.isinf() & r.isinf() & (o == r))
    diff = torch.where(comparable, (o - r).abs(), torch.zeros_like(o))
    ratio = diff / (atol + rtol * r.abs().nan_to_num(posinf=0.0)) if atol or rtol else diff
    bad = nan_mismatch | (comparable & (diff > atol + rtol * r.abs()))
    max_err, worst = diff.max().item(), ratio.nan_to_num(nan=math.inf, posinf=math.inf).max().item()
    if not bad.any():
        return True, max_err, worst, ""
    first = tuple(int(v) for v in bad.nonzero()[0].tolist())
    return False, max_err, worst, (f"{int(bad.sum())} of {o.numel()} elements differ; first at {list(first)}: "
                                   f"{o[first].item()!r}, expected {r[first].item()!r}")


def _compare_outputs(out, ref, dtype: str) -> tuple[bool, float, float, str]:
    """:func:`_compare` over every output of an op (a tensor or a tuple of them); the first
    mismatch names its output index when there are several."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        return False, math.inf, math.inf, f"{len(outs)} outputs, expected {len(refs)}"
    max_err = worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs)):
        ok, err, ratio, why = _compare(o, r, dtype)
        max_err, worst = max(max_err, err), max(worst, ratio)
        if not ok:
            return False, max_err, worst, (f"output {k}: " if len(outs) > 1 else "") + why
    return True, max_err, worst, ""


def _reference_dtype(spec: dict, dtype: str) -> torch.dtype | None:
    """float64 if every floating tensor input of the case accepts float64, else None (the CPU
    reference then runs in the case's own dtypes)."""
    for i, a in enumerate(spec["args"]):
        if a["type"] == "Tensor" and _tensor_dtype(spec, i, dtype) in _FLOATING and "float64" not in a["dtypes"]:
            return None
    return torch.float64


def _check_values(spec: dict, dtype: str, device: str, seed: int, report: Report) -> None:
    op = _op_handle(spec["name"])
    ref_dtype = _reference_dtype(spec, dtype)
    equivalent = spec.get("equivalent")
    names = [a["name"] for a in spec["args"]]
    if device == "cpu" and not equivalent:
        report.results.append(CaseResult(spec["name"], "values", dtype, "all", "skip",
                                         message="no device kernel on cpu and no .equivalent() expression"))
        return
    for case in generate_cases(spec, dtype, seed):
        result = CaseResult(spec["name"], "values", dtype, case.label, "pass",
                            tolerance=TOLERANCES.get(dtype), repro=case.repro())
        try:
            if device == "cpu":
                out = op(*case.args)
                ref = eval(equivalent, {"torch": torch}, dict(zip(names, _to(case.args, dtype=torch.float64))))  # noqa: S307
            else:
                out = op(*[_keep_layout(a, device) for a in case.args])
                ref = op(*_to(case.args, dtype=ref_dtype)) if ref_dtype is not None else op(*case.args)
            ok, result.max_abs_error, result.error_vs_tolerance, why = _compare_outputs(out, ref, dtype)
            if not ok:
                result.status, result.message = "FAIL", why
        except Exception as e:  # noqa: BLE001 -- reported as a failed case
            result.status, result.message = "FAIL", _first_lines(e)
        report.results.append(result)


def _check_structure(spec: dict, dtype: str, device: str, seed: int, report: Report) -> None:
    """opcheck, compile without recompiles over three batch sizes, and Meta against real; for an
    op with optional tensor inputs, once with them and once without."""
    cases = generate_cases(spec, dtype, seed)
    for suffix in dict.fromkeys(["", _without_optional(spec)]):
        _check_structure_of(spec, dtype, device, report, cases, suffix)


def _check_structure_of(spec: dict, dtype: str, device: str, report: Report, cases: list[_Inputs],
                        suffix: str) -> None:
    name = spec["name"]
    op = _op_handle(name)
    base = next(c for c in cases if c.label == "shape 3x37" + suffix)
    args = _to(base.args, device)

    def record(check: str, fn: Callable[[], str | None], run_dtype: str = dtype) -> None:
        repro = base.repro()
        for a in repro.get("args", []) if run_dtype != dtype else []:  # gradcheck: floating tensors in float64
            if isinstance(a, dict) and a.get("dtype") in _FLOATING:
                a["dtype"] = run_dtype
        try:
            why = fn()
            report.results.append(CaseResult(name, check, run_dtype, base.label, "FAIL" if why else "pass",
                                             message=why or "", repro=repro))
        except Exception as e:  # noqa: BLE001
            report.results.append(CaseResult(name, check, run_dtype, base.label, "FAIL",
                                             message=_first_lines(e), repro=repro))

    def opcheck():
        results = torch.library.opcheck(op.default, tuple(args))
        failed = {k: v for k, v in results.items() if v != "SUCCESS"}
        return f"opcheck: {failed}" if failed else None

    def meta():
        real = op(*args)
        fake = op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
        reals, fakes = (real, fake) if isinstance(real, tuple) else ((real,), (fake,))
        for k, (f, r) in enumerate(zip(fakes, reals)):
            got, want = (f.shape, f.dtype, f.stride()), (r.shape, r.dtype, r.stride())
            if got != want:
                return (f"output {k}: " if len(reals) > 1 else "") + f"meta {got} != real {want}"
        return None

    def compile_check():
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: op(*a), fullgraph=True, dynamic=True)
        labels = {f"shape {lead}x{last}{suffix}" for lead, last in _SHAPES[1:4]}
        batches = [c for c in cases if c.label in labels]
        compiled(*_to(batches[0].args, device))
        with torch._dynamo.config.patch(error_on_recompile=True):
            for c in batches[1:]:
                a = _to(c.args, device)
                ok, _, _, why = _compare_outputs(compiled(*a), op(*a), dtype)
                if not ok:
                    return f"compiled result differs: {why}"
        return None

    def gradcheck():
        targets = spec["backward_targets"]  # the arguments the backward op returns gradients for
        inputs = [a.detach().requires_grad_(i in targets) if isinstance(a, torch.Tensor) else a
                  for i, a in enumerate(_to(base.args, device, dtype=torch.float64))]
        torch.autograd.gradcheck(lambda *a: op(*a), tuple(inputs), fast_mode=True)
        return None

    record("opcheck", opcheck)
    record("meta", meta)
    record("compile", compile_check)
    if spec.get("backward") and _reference_dtype(spec, dtype) == torch.float64:
        record("gradcheck", gradcheck, "float64")
    elif spec.get("backward"):
        report.results.append(CaseResult(name, "gradcheck", "float64", base.label, "skip",
                                         message="a floating input does not accept float64, which gradcheck needs"))


#: Targets run-time kernels are compiled for on a machine without a GPU: Hopper (built as sm_90a,
#: where kernels may take wgmma paths) and Ampere (sm_80), which compiles their other paths.
CHECK_ARCHS = ("sm_90", "sm_80")


def _check_kernels_compile(spec: dict, dtypes: Sequence[str], seed: int, report: Report) -> None:
    """Without a GPU the run-time kernels never run, so compile every instantiation (each dtype x
    each combination of the compile-time parameter values the cases use) with NVRTC for each of
    :data:`CHECK_ARCHS`: a source that does not compile fails here, with NVRTC's log."""
    args = spec["args"]
    compile_time = [i for i, a in enumerate(args) if a.get("compile_time")]
    sets = _param_sets(spec, random.Random(seed))
    choices = [list(dict.fromkeys(p[i] for p in sets)) for i in compile_time]
    for dtype in dtypes:
        for combination in itertools.product(*choices):  # every combination, not one at a time
            params = dict(zip(compile_time, combination))
            tensors = {a["name"]: _DTYPES[_tensor_dtype(spec, i, dtype)] for i, a in enumerate(args)
                       if a["type"] == "Tensor"}
            values = {args[i]["name"]: params[i] for i in compile_time}
            for arch in CHECK_ARCHS:
                label = ", ".join([f"{k}={v}" for k, v in values.items()] + [arch])
                result = CaseResult(spec["name"], "nvrtc", dtype, label, "pass",
                                    repro={"dtypes": {k: str(v).removeprefix("torch.") for k, v in tensors.items()},
                                           "params": values, "arch": arch})
                try:
                    precompile(spec["name"], tensors, values, arch=arch)
                except Exception as e:  # noqa: BLE001 -- reported as a failed case
                    result.status, result.message = "FAIL", "\n".join(f"{type(e).__name__}: {e}".splitlines()[:8])
                report.results.append(result)


def verify_op(name: str, *, device: str | None = None, seed: int | None = None,
              dtypes: Sequence[str] | None = None, report: Report | None = None) -> Report:
    """Verify one loaded op (see the module docstring).

    Args:
        name: qualified op name, e.g. ``"examples::softshrink"`` (its library must be loaded).
        device: ``"cuda"`` (default when a GPU is present) or ``"cpu"``.
        seed: the run's seed (default: random); every case derives its own from it.
        dtypes: dtypes to check (default: every floating dtype the first input accepts, or
            its first dtype).
        report: a report to append to.

    Returns:
        The :class:`Report`; ``report.ok`` is False if any case failed.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    seed = random.randrange(2**31) if seed is None else seed
    report = report or Report(seed=seed, device=device)
    spec = find_op(name)
    first = next(a for a in spec["args"] if a["type"] == "Tensor")
    dtypes = list(dtypes or [d for d in first["dtypes"] if d in _FLOATING] or first["dtypes"][:1])
    set_poison_outputs(True)
    try:
        for k, dtype in enumerate(dtypes):
            _check_values(spec, dtype, device, seed + k, report)
        if device == "cpu" and spec.get("runtime_kernels"):
            _check_kernels_compile(spec, dtypes, seed, report)
        _check_structure(spec, "float32" if "float32" in dtypes else dtypes[0], device, seed, report)
    finally:
        set_poison_outputs(False)
    return report


# ---- models ---------------------------------------------------------------------------------


@dataclass
class OutputResult:
    """One model output: the package's result against eager on the CPU."""

    index: int
    shape: list[int]
    max_abs_error: float
    cosine: float  # the smallest cosine similarity over rows (dim 0); the whole tensor's if 1-d
    status: str


@dataclass
class ModelReport:
    """A model verified end to end in the C++ runner."""

    device: str
    outputs: list[OutputResult]
    latency_ms: dict[str, float]
    package: str

    @property
    def ok(self) -> bool:
        return all(o.status == "pass" for o in self.outputs)


def verify_model(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *, device: str | None = None,
                 dynamic_shapes=None, check_inputs: Sequence[Sequence[torch.Tensor]] | None = None,
                 reference: torch.nn.Module | None = None, package_dir: str | Path | None = None,
                 atol: float = 1e-4, rtol: float = 1e-4, min_cosine: float = 0.9999,
                 iters: int = 10) -> list[ModelReport]:
    """Export ``model`` on ``device``, AOTInductor-compile it with its op libraries, run the package
    in the C++ runner, and compare each output with ``reference`` (default: ``model`` itself) run in
    eager on the CPU, where opforge ops run their CPU references.

    Args:
        model: the module (moved to ``device`` for export, then back to the CPU for reference).
        example_inputs: inputs used for export, on the CPU.
        device: ``"cuda"`` (default when a GPU is present) or ``"cpu"``.
        dynamic_shapes: passed to ``torch.export.export``.
        check_inputs: input sets to run and compare (default: the example inputs); other shapes
            exercise the dynamic dims.
        reference: the module to compare with, e.g. the same model without custom ops.
        package_dir: where the package is written (default: a temporary folder).
        atol, rtol, min_cosine: an output passes if allclose within atol/rtol, or, for outputs
            compared as directions (embeddings), if the cosine of the flattened tensors is at least
            ``min_cosine`` and the max abs error at most 10 * atol.
        iters: timed runs in the runner.

    Returns:
        One :class:`ModelReport` per input set.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.eval()
    package_dir = Path(package_dir or tempfile.mkdtemp(prefix="opforge-verify-"))
    with torch.no_grad():
        program = torch.export.export(model.to(device), tuple(t.to(device) for t in example_inputs),
                                      dynamic_shapes=dynamic_shapes)
    package = aoti.package(program, package_dir)
    reference = (reference or model).cpu().eval()
    reports = []
    for inputs in check_inputs or [example_inputs]:
        with torch.inference_mode():
            expected = reference(*inputs)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        run = aoti.run(package, inputs, device=device, warmup=3, iters=iters)
        outs = []
        for k, (got, want) in enumerate(zip(run.outputs, expected)):
            g, w = got.double(), want.double()
            err = (g - w).abs().max().item() if g.numel() else 0.0
            rows_g, rows_w = (g.flatten(1), w.flatten(1)) if g.dim() > 1 else (g[None], w[None])
            cos = (torch.nn.functional.cosine_similarity(rows_g, rows_w, dim=1).min().item()
                   if g.numel() and g.shape == w.shape else 0.0 if g.numel() else 1.0)
            ok = g.shape == w.shape and (torch.allclose(g, w, atol=atol, rtol=rtol)
                                         or (cos >= min_cosine and err <= 10 * atol))
            outs.append(OutputResult(k, list(got.shape), err, cos, "pass" if ok else "FAIL"))
        if len(run.outputs) != len(expected):
            outs.append(OutputResult(len(expected), [], math.inf, 0.0, "FAIL"))
        reports.append(ModelReport(run.device, outs, run.latency_ms, str(package)))
    return reports


def print_report(report: Report, console=None) -> None:
    """A table of failures and per-op totals, then the seed and tolerances."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=max(120, Console().width))
    table = Table(title=f"opforge verify on {report.device} (seed {report.seed})")
    for col in ("op", "check", "dtype", "cases", "failed", "max abs err", "worst err / tol"):
        table.add_column(col, justify="left" if col in ("op", "check", "dtype") else "right")
    groups: dict[tuple, list[CaseResult]] = {}
    for r in report.results:
        groups.setdefault((r.op, r.check, r.dtype), []).append(r)
    for (op, check, dtype), rs in groups.items():
        failed = [r for r in rs if r.status == "FAIL"]
        errs = [r.max_abs_error for r in rs if r.max_abs_error is not None]
        ratios = [r.error_vs_tolerance for r in rs if r.error_vs_tolerance is not None]
        status = "skipped: " + rs[0].message if all(r.status == "skip" for r in rs) else str(len(failed))
        table.add_row(op, check, dtype, str(len(rs)), status if not failed else f"[red]{len(failed)}[/]",
                      f"{max(errs):.2e}" if errs else "", f"{max(ratios):.3f}" if ratios else "")
    console.print(table)
    for r in report.failures:
        console.print("[red]FAIL[/] " + escape(f"{r.op} {r.check} {r.dtype} [{r.case}]: {r.message}\n"
                                                f"  reproduce: {r.repro}"), soft_wrap=True)
    console.print("tolerances (atol, rtol) against float64: "
                  + ", ".join(f"{k} {v[0]:g}/{v[1]:g}" for k, v in TOLERANCES.items()), soft_wrap=True)

