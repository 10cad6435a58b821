"""Input cases for one op, generated from its description: sizes from the core's shape rules,
parameter values from ranges and choices, strided views, empty tensors and NaN/Inf."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .. import _core
from .._torch import loaded_libraries
from ..description import Op, Param, TensorArg
from .compare import FLOAT8

_FLOATING = ("float32", "float64", "float16", "bfloat16")

#: Sizes (lead, last) of the shape cases, as the core's example shapes take them (``lead`` for
#: first dims, ``last`` for last dims): one element; odd sizes; sizes on either side of 16-byte
#: vectors and of 256-thread blocks; the head sizes 64 and 128; more rows than one 128-row block.
SHAPES = [(1, 1), (3, 37), (33, 255), (33, 256), (33, 257), (2, 4097), (2, 8), (3, 9), (7, 64), (6, 128), (131, 24)]

#: Further sizes on a device, whose kernels tile them: thousands of rows (more than a GPU holds
#: blocks at once), rows of 128-element heads past several row blocks, and rows too long for a
#: thread block's registers. The CPU reference computes them too (the baseline), so they are
#: left out where the CPU reference is the code under test.
DEVICE_SHAPES = [(1031, 64), (300, 128), (3, 40000)]

#: Random sizes per dtype combination, "random LEADxLAST": lead in [2, 48], last in [2, 320],
#: this many on the CPU and :data:`DEVICE_RANDOM_CASES` on a device, except for an op whose
#: kernels are Triton functions: each size of a new block size or divisibility is a Triton
#: compile of its own (Note [Triton kernels] in ``opforge/op_launch.h``), so it gets
#: ``RANDOM_CASES`` on a device too (the fixed sizes already cover tails and block sizes).
RANDOM_CASES = 4
DEVICE_RANDOM_CASES = 12

#: The strided layouts each tensor input is given in turn (see :func:`_view`).
VIEWS = ("permuted", "sliced", "expanded", "offset", "padded rows", "rows permuted", "leading slice")


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype called ``name`` ("bfloat16")."""
    return getattr(torch, name)


#: Floating dtypes from the least precise to the most: a case is compared at the tolerance of
#: the least precise dtype among its tensors.
_PRECISION_ORDER = ("bfloat16", "float16", "float32", "float64")


@dataclass(frozen=True)
class DtypeCase:
    """One dtype combination an op accepts (one of ``op.dtype_combinations``, which the core
    enumerates from the dtype rules).

    Attributes:
        dtypes: dtype name by tensor input name.
        primary: the dtype of the op's primary input (:func:`primary_input`), which ``--dtype``
            selects by.
        label: ``primary``, then the inputs whose dtype differs from it and could be another:
            "bfloat16 (weight=float32)".
        tolerance: the least precise floating dtype among the inputs and outputs, whose
            tolerances the case is compared with (:data:`~opforge.verify.TOLERANCES`); the
            primary dtype if none is floating.
        params: by name, the values of the parameters whose value selects a dtype rule (Note
            [Rules that follow a parameter]): every case of this combination takes them.
    """

    dtypes: dict[str, str]
    primary: str
    label: str
    tolerance: str
    params: dict[str, object] = field(default_factory=dict)


def primary_input(op: Op) -> TensorArg:
    """The tensor input whose dtype names a case: the first that takes a floating dtype in some
    combination (an index input may come first), else the first tensor input."""
    for a in op.tensors:
        if any(c[a.name] in _FLOATING for c in op.dtype_combinations):
            return a
    return op.tensors[0]


def dtype_cases(op: Op, only: list[str] | None = None, device: str = "cpu") -> list[DtypeCase]:
    """Every dtype combination of ``op`` that its kernel on ``device`` takes
    (``op.dtype_combinations_on``; all of them on the CPU) as a :class:`DtypeCase`, those whose
    primary dtype is in ``only`` if given.

    Raises:
        ValueError: ``only`` selects no combination (the message lists the dtypes it may name).
    """
    primary = primary_input(op).name
    combinations = op.dtype_combinations_on.get(device, op.dtype_combinations)
    varies = {a.name for a in op.tensors if len({c[a.name] for c in op.dtype_combinations}) > 1}
    out = []
    tensors = {a.name for a in op.tensors}
    for combination in combinations:
        c = {k: v for k, v in combination.items() if k in tensors}
        pinned = {k: v for k, v in combination.items() if k not in tensors}
        p = c[primary]
        if only is not None and p not in only:
            continue
        others = [f"{k}={v}" for k, v in c.items() if k != primary and v != p and k in varies]
        others += [f"{k}={v}" for k, v in pinned.items()]
        # The dtypes that follow the case: a tensor of a fixed dtype (a float32 statistic beside
        # float64 inputs) does not loosen it; compare() holds each output to its own dtype too.
        outputs = [o.dtype if o.dtype is not None else c[o.dtype_like] for o in op.outputs]
        following = [c[k] for k in varies]
        following += [c[o.dtype_like] for o in op.outputs if o.dtype is None and o.dtype_like in varies]
        floating = [d for d in following if d in _FLOATING] or [d for d in [*c.values(), *outputs] if d in _FLOATING]
        tolerance = min(floating, key=_PRECISION_ORDER.index) if floating else p
        out.append(DtypeCase(c, p, p + (f" ({', '.join(others)})" if others else ""), tolerance, pinned))
    if not out:
        takes = list(dict.fromkeys(c[primary] for c in combinations))
        raise ValueError(
            f"{op.name}: no dtype combination has {primary} in {', '.join(only or [])}; {primary} takes "
            + ", ".join(takes)
        )
    return out


def floating_as(op: Op, case: DtypeCase, dtype: str, keep_fixed: bool = False) -> dict[str, str] | None:
    """``case``'s dtypes with every floating one replaced by ``dtype`` (with ``keep_fixed``, but
    for inputs that take it in none of the op's combinations: attention_backward's float32 lse
    keeps its dtype while the case's primary input takes ``dtype``), if the op accepts that
    combination (float64: the reference runs in it; float32: gradcheck for ops without float64),
    else None. What an input takes is read from ``op.dtype_combinations`` (the core's
    enumeration), which holds the dtypes of rules that follow a parameter (``opforge::when``) too."""
    declared: dict[str, set[str]] = {a.name: set() for a in op.tensors}
    for combination in op.dtype_combinations:
        for name, taken in declared.items():
            taken.add(combination.get(name))
    same = {
        k: dtype if v in _FLOATING and (not keep_fixed or dtype in declared[k]) else v for k, v in case.dtypes.items()
    }
    primary = primary_input(op).name
    if case.dtypes[primary] in _FLOATING and same[primary] != dtype:
        return None
    return same if {**same, **case.params} in op.dtype_combinations else None


def exact_float8(op: Op, case: DtypeCase) -> bool:
    """Whether ``case`` has a result of a float8 dtype that is compared bit for bit (an output, or
    a written input, of a float8 dtype the op declares no ``.tolerance()`` for): its reference then
    runs in the case's own dtypes, where the reference defines each byte (a float64 reference
    rounds differently), and so does the ``.equivalent()`` a CPU reference is checked against."""
    dtypes = [o.dtype if o.dtype is not None else case.dtypes.get(o.dtype_like) for o in op.outputs]
    dtypes += [case.dtypes.get(a.name) for a in op.mutated]
    return any(d in FLOAT8 and d not in op.tolerances for d in dtypes)


def pinned_sets(op: Op, sets: list[dict[int, object]], pinned: dict[str, object]) -> list[dict[int, object]]:
    """``sets`` (:func:`param_sets`) with the parameters named in ``pinned`` set to its values,
    each distinct set once: the sets of a dtype combination that a parameter's value selects."""
    index = {a.name: a.index for a in op.params}
    out: list[dict[int, object]] = []
    for s in sets:
        p = {**s, **{index[k]: v for k, v in pinned.items()}}
        if p not in out:
            out.append(p)
    return out


def param_sets(op: Op, rng: random.Random) -> list[dict[int, object]]:
    """Parameter values by argument index: the defaults, then each ranged numeric parameter at
    its bounds and at a random point inside, each unranged float parameter at a random point of
    [0.25, 2], the other value of each bool, and every other choice of each parameter with
    choices."""
    base: dict[int, object] = {}
    for a in op.params:
        if a.has_default:
            base[a.index] = a.default
        elif a.choices is not None:
            base[a.index] = a.choices[0]
        elif a.type == "float":
            base[a.index] = a.min if a.min is not None and a.min > 0 else 0.5
        elif a.type == "int":
            base[a.index] = int(a.min) if a.min is not None and a.min >= 1 else 1
        elif a.type == "bool":
            base[a.index] = False
        else:
            base[a.index] = [] if a.type.endswith("[]") else ""
    sets = [base]
    for a in op.params:
        i = a.index
        if a.choices is not None:  # before ranges: a parameter with both takes only its choices
            sets.extend({**base, i: c} for c in a.choices if c != base[i])
        elif a.type in ("float", "int") and (a.min is not None or a.max is not None):
            lo = a.min if a.min is not None else -4.0
            hi = a.max if a.max is not None else 4.0
            for v in (lo, hi, rng.uniform(lo, hi)):
                sets.append({**base, i: int(round(v)) if a.type == "int" else float(v)})
        elif a.type == "float":
            sets.append({**base, i: rng.uniform(0.25, 2.0)})
        elif a.type == "bool":
            sets.append({**base, i: not base[i]})
    return sets


@dataclass(frozen=True)
class Domain:
    """The values an integer input takes in one case: [low, high) from the core's evaluation of
    its rule, the marker value, distinctness (Note [Value domains])."""

    low: int
    high: int
    unique: bool = False
    sentinel: int | None = None


class NoCase(Exception):
    """A case that no input can make (distinct indices more than the range holds)."""


def _float8_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every byte whose value in ``dtype`` (a float8 dtype) is finite, as uint8."""
    codes = torch.arange(256, dtype=torch.uint8)
    return codes[codes.view(dtype).float().isfinite()]


def random_tensor(
    shape: list[int], dtype: torch.dtype, gen: torch.Generator, domain: Domain | None = None
) -> torch.Tensor:
    """Random values, never all zero: normal for floats, every finite value equally likely for
    the float8 dtypes (their whole range: zeros, subnormals, the largest values; NaN comes in the
    "nan/inf" case), [1, 10) for integers; within ``domain`` for an integer input that declares
    one (a quarter of them the marker, if it has one; distinct if it must be).

    Raises:
        NoCase: ``domain`` cannot supply the values (an empty range, or more distinct values than
            it holds, with no marker to fill in).
    """
    if str(dtype).removeprefix("torch.") in FLOAT8:
        codes = _float8_codes(dtype)
        picks = torch.randint(0, codes.numel(), shape, generator=gen)
        return codes[picks].view(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 2).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if domain is None:
        return torch.randint(1, 10, shape, generator=gen).to(dtype)
    n, span = math.prod(shape), max(domain.high - domain.low, 0)
    if domain.unique:
        if n > span and domain.sentinel is None:
            raise NoCase(f"{n} distinct values in [{domain.low}, {domain.high})")
        values = torch.full((n,), domain.sentinel if domain.sentinel is not None else 0, dtype=torch.int64)
        take = min(n, span)
        slots = torch.randperm(n, generator=gen)[:take]  # which elements get an index
        values[slots] = torch.randperm(span, generator=gen)[:take] + domain.low
    elif span == 0:
        if n and domain.sentinel is None:
            raise NoCase(f"values in the empty range [{domain.low}, {domain.high})")
        values = torch.full((n,), domain.sentinel if domain.sentinel is not None else 0, dtype=torch.int64)
    else:
        values = torch.randint(domain.low, domain.high, (n,), generator=gen)
    if domain.sentinel is not None and not domain.unique and n:
        values[torch.rand(n, generator=gen) < 0.25] = domain.sentinel
    return values.view(shape).to(dtype)


def _view(t: torch.Tensor, how: str, gen: torch.Generator, draw) -> torch.Tensor:
    """A non-dense tensor with ``t``'s shape and values: permuted, sliced or storage-offset
    (misaligned for vector loads), and two layouts whose last dim stays contiguous with 16-byte
    aligned rows, which reach a ``contiguous_last_dim`` input as they are: padded rows (rows
    further apart than their length) and rows permuted (dims -3 and -2 swapped in memory, a head
    split's transpose); or expanded (rows repeated, so with values of its own from ``draw(shape)``,
    which makes fresh values in the input's domain); or a leading slice (``big[1:]`` of a tensor one
    longer in its first dim: dense, and 16-byte aligned where a row is a multiple of 16 bytes, so
    that an input written in place takes it as it is, as a layer's slice of a stacked cache)."""
    shape = list(t.shape)
    if how == "permuted":
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    if how == "padded rows":
        unit = max(1, 16 // t.element_size())
        big = draw(shape[:-1] + [(shape[-1] // unit + 1) * unit])
        big[..., : shape[-1]] = t
        return big[..., : shape[-1]]
    if how == "rows permuted":
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if how == "sliced":
        big = draw(shape[:-1] + [2 * shape[-1]])
        big[..., ::2] = t
        return big[..., ::2]
    if how == "expanded":
        return draw([1] + shape[1:]).expand(shape)
    if how == "leading slice":
        big = draw([shape[0] + 1] + shape[1:])
        big[1:] = t
        return big[1:]
    flat = draw([t.numel() + 1])
    flat[1:] = t.reshape(-1)
    return flat[1:].view(shape)


def _special(t: torch.Tensor) -> torch.Tensor:
    """``t`` with NaN, infinities and large values in a few elements (a float8 tensor: NaN, the
    infinities where the format has them, else NaN again, and its largest finite values)."""
    t = t.clone()
    flat = t.view(-1)
    big = torch.finfo(t.dtype).max if str(t.dtype).removeprefix("torch.") in FLOAT8 else 1e4
    for k, v in enumerate((float("nan"), float("inf"), -float("inf"), big, -big)):
        if k < flat.numel():
            flat[k * 7 % flat.numel()] = v
    return t


@dataclass
class Inputs:
    """One case: its label, the op's arguments in schema order (CPU tensors), and its seed."""

    label: str
    args: list
    seed: int

    def repro(self) -> dict:
        return {
            "seed": self.seed,
            "case": self.label,
            "args": [
                {
                    "dtype": str(a.dtype).removeprefix("torch."),
                    "shape": list(a.shape),
                    "stride": list(a.stride()),
                    "storage_offset": a.storage_offset(),
                }
                if isinstance(a, torch.Tensor)
                else a
                for a in self.args
            ],
        }


def refused(op: Op, arg: TensorArg, t: torch.Tensor) -> bool:
    """Whether the core refuses ``t`` for input ``arg`` (a mutated input in a layout that would need
    a copy, or whose elements overlap; Note [Mutated inputs])."""
    offset = (t.data_ptr() % 16) if t.numel() else 0
    dtype = str(t.dtype).removeprefix("torch.")
    return _core.admission(op.name, arg.name, dtype, list(t.shape), list(t.stride()), offset) == "refuse"


def without_optional(op: Op) -> str:
    """The label suffix of cases that leave out the op's optional tensor inputs ("" if it has none)."""
    names = [a.name for a in op.tensors if a.optional]
    return f" without {', '.join(names)}" if names else ""


#: Last-dim sizes tried, in order after the case's own, when the case's sizes break one of the
#: op's cross-argument rules (a rule such as "cos_sin_cache.size(1) <= query.size(-1)" or a
#: divisibility the free sizes miss).
_RETRY_LASTS = (8, 16, 32, 64, 128, 256)

#: Sizes tried last, for rules that bound a size from above ("x.size(0) <= 2", a convolution's
#: width "weight.size(1) <= 4"): as lasts after the integer parameters' values, and as leads.
_SMALL = (4, 3, 2, 1)


def example(
    op: Op, lead: int, last: int, params: dict[str, object], leading: int = 1, omit_optional: bool = False
) -> dict | None:
    """The core's example shapes and facts (:func:`opforge._core.example_shapes`) for sizes near
    (lead, last) that satisfy every cross-argument rule: ``last`` itself, then it rounded up to a
    multiple of 2, 4, ... 128, then :data:`_RETRY_LASTS`, then the integer parameters' values (a
    rule such as ``x.size(1) == channels``), then :data:`_SMALL`; with ``lead`` itself first, then
    it rounded up the same way (``weight.size(0) % 8 == 0``), then :data:`_SMALL`. None if none
    does. Rules gated on an optional input's presence are judged for calls that give the optional
    inputs, or with ``omit_optional`` leave them out."""
    multiples = (2, 4, 8, 16, 32, 64, 128)
    sizes = [v for v in params.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    lasts = dict.fromkeys([last] + [-(-last // m) * m for m in multiples] + list(_RETRY_LASTS) + sizes + list(_SMALL))
    leads = dict.fromkeys([lead] + [-(-lead // m) * m for m in multiples] + list(_SMALL))
    for candidate_lead in leads:
        for candidate in lasts:
            facts = _core.example_shapes(op.name, candidate_lead, candidate, params, leading, omit_optional)
            if not facts["rule_problems"]:
                return facts
    return None


def op_handle(name: str):
    """``torch.ops.<ns>.<op>`` for "ns::op"."""
    ns, op = name.split("::")
    return getattr(getattr(torch.ops, ns), op)


def _forward_of(op: Op) -> Op | None:
    """The loaded op that names ``op`` as its backward op, or None."""
    if not op.is_backward_op:
        return None
    return next((f for lib in loaded_libraries() for f in lib.ops if f.backward == op.name), None)


def forward_results(op: Op, fwd: Op | None, args: list) -> bool:
    """For a backward op whose inputs include results of its forward op ``fwd`` (Note [Backward
    ops]: attention_backward's o and lse; :func:`_forward_of`), writes into them, in their own
    layout, the forward op's results on the case's other arguments (its CPU reference), so that
    the backward op sees what a backward call sees: a drawn lse is no log-sum-exp of the scores,
    and probabilities taken from it are far from a softmax's, which no kernel is built for. Cases of an op whose
    forward takes an argument the backward op does not, or writes its inputs, keep what was
    drawn. Returns False where such an input is a view whose elements overlap, which no
    forward result is: a case a backward call never sees, left out.

    Raises:
        ValueError, RuntimeError: the forward op refuses the case's arguments (its message).
    """
    saved = [(i, k) for i, (kind, k) in enumerate(fwd.backward_sources) if kind == "result"] if fwd else []
    given = {a.name: v for a, v in zip(op.args, args, strict=True)}
    if not saved or any(a.name not in given for a in fwd.args) or any(a.mutated for a in fwd.tensors):
        return True
    results = op_handle(fwd.name).default(*(given[a.name] for a in fwd.args))
    results = results if isinstance(results, (tuple, list)) else (results,)
    for i, k in saved:
        target = args[i]
        if target is None:
            continue
        if torch._debug_has_internal_overlap(target) == 1:  # MemOverlap::Yes
            return False
        with torch.no_grad():
            target.copy_(results[k])
    return True


#: The most elements the tensors of one case hold together, by where the code under test runs
#: ("cpu": the CPU reference against the equivalent; a device: its kernels, against the CPU
#: reference): sizes that make an input of rank 3 or more larger (a rotary embedding's [tokens,
#: heads, head size] draws tokens and head size from the same free size) are left out.
MAX_ELEMENTS = {"cpu": 1 << 22, "device": 1 << 25}


class CaseBuilder:
    """Builds the cases of one op in one dtype combination (``dtypes`` by tensor input name: a
    :attr:`DtypeCase.dtypes`; CPU tensors), each from its own seed, drawn in turn from ``seed``
    (so a case keeps its seed whichever cases are built). ``params`` are the op's parameter sets
    (:func:`param_sets`, drawn first from the same seed), with ``pinned`` (a
    :attr:`DtypeCase.params`) in each. Sizes satisfy the op's cross-argument
    rules (:func:`example`), integer inputs with a value domain hold values inside it, and a
    backward op's inputs that are its forward op's results hold those results
    (:func:`forward_results`)."""

    def __init__(
        self,
        op: Op,
        dtypes: dict[str, str],
        seed: int,
        max_elements: int = MAX_ELEMENTS["cpu"],
        pinned: dict[str, object] | None = None,
    ):
        self.op, self.dtypes, self.max_elements = op, dtypes, max_elements
        self.rng = random.Random(seed)
        self.params = pinned_sets(op, param_sets(op, self.rng), pinned or {})
        self.forward = _forward_of(op)
        self._shapes_seen: set = set()

    def build(
        self,
        label: str,
        lead: int,
        last: int,
        params: dict[int, object],
        transform: Callable[..., torch.Tensor] | None = None,
        omit_optional: bool = False,
        leading: int = 1,
        only: Callable[[str], bool] | None = None,
        distinct: bool = False,
    ) -> Inputs | None:
        """One case, or None where no input can make it (a rule no nearby size meets, more
        distinct indices than the range holds, more than ``max_elements`` elements), where it
        is a strided view of a mutated input that the op refuses (:func:`refused`), where
        ``only`` rejects its label, or, with ``distinct``, where an earlier case built with
        ``distinct`` had the same shapes and parameters. Optional tensor inputs are None with
        ``omit_optional``; ``transform(arg, t, gen, draw)`` gives each tensor its layout."""
        op = self.op
        case_seed = self.rng.randrange(2**31)
        named = {op.args[i].name: v for i, v in params.items()}
        wanted = only is None or only(label) or distinct
        facts = example(op, lead, last, named, leading, omit_optional) if wanted else None
        if facts is None:
            return None
        present = {a.name: facts["shapes"][a.name] for a in op.tensors if not (omit_optional and a.optional)}
        if sum(math.prod(s) for s in present.values()) > self.max_elements:
            return None
        if distinct:
            key = (repr(sorted(present.items())), repr(sorted(named.items())))
            if key in self._shapes_seen:
                return None
            self._shapes_seen.add(key)
        if only is not None and not only(label):
            return None
        gen = torch.Generator().manual_seed(case_seed)
        args = []
        try:
            for a in op.args:
                if isinstance(a, Param):
                    args.append(params[a.index])
                    continue
                if a.name not in present:
                    args.append(None)
                    continue
                bounds = facts["bounds"].get(a.name)
                domain = Domain(bounds[0], bounds[1], a.values.unique, a.values.sentinel) if bounds else None
                torch_dtype = dtype_of(self.dtypes[a.name])

                def draw(shape, torch_dtype=torch_dtype, domain=domain):
                    return random_tensor(shape, torch_dtype, gen, domain)

                t = draw(present[a.name])
                args.append(transform(a, t, gen, draw) if transform else t)
                if a.mutated and refused(op, a, args[-1]):
                    return None  # a mutated input in a layout it cannot take: not a case the op computes
        except NoCase:
            return None
        if not forward_results(op, self.forward, args):
            return None
        return Inputs(label, args, case_seed)


def _viewed(index: int, how: str) -> Callable[..., torch.Tensor]:
    """A ``transform`` for :meth:`CaseBuilder.build` that gives the tensor input at ``index``
    the layout ``how`` (:func:`_view`) where its shape allows it, and leaves the others dense."""

    def transform(arg, t, gen, draw):
        if arg.index != index or t.dim() == 0 or t.numel() == 0:
            return t
        if how in ("permuted", "expanded") and (t.dim() < 2 or t.shape[0] < 2):
            return t
        if how == "rows permuted" and (t.dim() < 3 or t.shape[-3] < 2 or t.shape[-2] < 2):
            return t
        return _view(t, how, gen, draw)

    return transform


def generate_cases(
    op: Op,
    dtypes: dict[str, str],
    seed: int,
    only: Callable[[str], bool] | None = None,
    device: str = "cpu",
    pinned: dict[str, object] | None = None,
) -> list[Inputs]:
    """Every input case for one op and dtype combination (``dtypes`` by tensor input name: a
    :attr:`DtypeCase.dtypes`; CPU tensors), built by a :class:`CaseBuilder` from ``seed``: the
    sizes of :data:`SHAPES` (with :data:`DEVICE_SHAPES` where ``device`` is not "cpu"), random
    sizes (:data:`RANDOM_CASES`, :data:`DEVICE_RANDOM_CASES` but for Triton ops), each parameter set, each of
    :data:`VIEWS` for each tensor input (written ones included, in the layouts they take),
    empty and NaN/Inf. Sizes that give the shapes of an earlier size case are left out. Optional
    tensor inputs are given, except in the cases labelled with :func:`without_optional`'s suffix
    (every size, and empty), where they are None. An op with an input declared
    ``shape({leading_dims, ...})`` also gets cases with none and with three leading dims. With
    ``only``, just the cases whose label it accepts are built (each with the seed it has in the
    full list). ``pinned``: the parameter values the dtype combination takes
    (:attr:`DtypeCase.params`)."""
    on_cpu = device == "cpu"
    builder = CaseBuilder(op, dtypes, seed, MAX_ELEMENTS["cpu" if on_cpu else "device"], pinned)
    without = without_optional(op)
    params = builder.params
    cases: list[Inputs] = []

    def add(*args, **kwargs) -> None:
        case = builder.build(*args, only=only, **kwargs)
        if case is not None:
            cases.append(case)

    sizes = [(f"shape {lead}x{last}", lead, last) for lead, last in SHAPES + ([] if on_cpu else DEVICE_SHAPES)]
    triton = any(k.backend == "triton" for k in op.runtime_kernels)
    for _ in range(RANDOM_CASES if on_cpu or triton else DEVICE_RANDOM_CASES):
        lead, last = builder.rng.randint(2, 48), builder.rng.randint(2, 320)
        sizes.append((f"random {lead}x{last}", lead, last))
    for label, lead, last in sizes:
        add(label, lead, last, params[0], distinct=True)
        if without:
            add(label + without, lead, last, params[0], omit_optional=True, distinct=True)
    for k, p in enumerate(params[1:], 1):
        add(f"params #{k}", 3, 37, p)
    for how in VIEWS:
        for a in op.tensors:
            if how == "expanded" and a.values is not None and a.values.unique:
                continue  # repeated rows repeat indices that must be distinct
            add(f"{how} {a.name}", 4, 40, params[0], _viewed(a.index, how))
    if any(a.leading_dims for a in op.tensors):  # shape({leading_dims[_of], ...}): none, and several
        add("no leading dims", 3, 37, params[0], leading=0)
        add("3 leading dims", 3, 37, params[0], leading=3)
    add("empty", 0, 37, params[0])
    if without:
        add(f"empty{without}", 0, 37, params[0], omit_optional=True)
    # A written float8 tensor is a result buffer (a quantiser's): the special values go to an input.
    floating = [
        a.index for a in op.tensors if dtypes[a.name] in _FLOATING or (dtypes[a.name] in FLOAT8 and not a.mutated)
    ]
    if floating:
        add("nan/inf", 3, 37, params[0], lambda arg, t, gen, draw: _special(t) if arg.index == floating[0] else t)
    return cases
