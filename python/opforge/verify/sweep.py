"""The sizes of verify's ``torch.compile`` check: cases whose sizes differ, chosen so that
torch's own guards do not recompile for them (Note [Duck sizing]).

Note [Duck sizing]
------------------
``torch.compile(dynamic=True)`` gives input dims of equal size one symbol (duck sizing:
``torch.fx.experimental._config.use_duck_shape``) and guards that they stay equal; it also
specialises sizes 0 and 1. A later call where such dims differ recompiles, though the op's Meta
function never asked for it: with x [3, 5, 37] and block scales [3, 5, ceildiv(37, 8) = 5], then
x [33, 5, 255] and scales [33, 5, 32], the second call recompiles for "scales.size(2) ==
x.size(1)". So the check's cases keep every pair of dims (of every tensor input, and the values
of the integer parameters, and the sizes 0 and 1) equal in all of them or in none: dims a rule
ties stay equal, dims that met by accident never do. The sizes come from the core's rules
(:func:`~opforge.verify.cases.example`); an op whose rules admit no two such cases that differ
gets the check reported as not applicable, with the reason.
"""

from __future__ import annotations

from itertools import combinations
from typing import NamedTuple

from ..description import Op, Param
from .cases import CaseBuilder, Inputs, example

#: (lead, last) pairs the check's cases are drawn from, in order: primes other than the core's 5
#: for middle dims (and 0 and 1, which torch specialises), so that sizes seldom meet by accident.
CANDIDATES = ((3, 37), (11, 67), (19, 101), (29, 131), (43, 173), (7, 53), (13, 83), (23, 113), (2, 41), (2, 97))

#: How many cases the check runs: the first compiles, the others must not recompile.
SWEEP = 3


def _positions(op: Op, shapes: dict[str, list[int]], params: dict[int, object]) -> dict[tuple, int]:
    """Every size torch may duck-size or specialise in one case: each dim of each tensor
    input given (by ``("dim", name, d)``), each integer parameter's value, and 0 and 1."""
    out: dict[tuple, int] = {("size", 0): 0, ("size", 1): 1}
    for name, sizes in shapes.items():
        for d, v in enumerate(sizes):
            out[("dim", name, d)] = v
    for a in op.args:
        v = params.get(a.index) if isinstance(a, Param) else None
        if isinstance(v, int) and not isinstance(v, bool):
            out[("param", a.name)] = v
    return out


def _equal_pairs(positions: dict[tuple, int]) -> frozenset:
    return frozenset((p, q) for p, q in combinations(sorted(positions), 2) if positions[p] == positions[q])


class Sweep(NamedTuple):
    """The compile check's cases and its label ("sweep 3x37, 11x67, 19x101"), or no cases and
    why the check does not apply."""

    cases: list[Inputs]
    label: str
    why: str = ""


def compile_cases(
    op: Op, builder: CaseBuilder, params: dict[int, object], omit_optional: bool = False, suffix: str = ""
) -> Sweep:
    """Up to :data:`SWEEP` cases for the compile check, with ``params``, built by ``builder``
    (labelled "sweep LEADxLAST" and ``suffix``, with optional inputs None where
    ``omit_optional``): of the :data:`CANDIDATES` the op's rules admit, those whose equal sizes
    (:func:`_positions`) are the same pairs in each (Note [Duck sizing]): the group with the most
    distinct shapes, the earliest of equals, its first cases."""
    named = {op.args[i].name: v for i, v in params.items()}
    present = [a.name for a in op.tensors if not (omit_optional and a.optional)]
    groups: dict[frozenset, list[tuple[int, int, tuple]]] = {}
    admitted = []
    for lead, last in CANDIDATES:
        facts = example(op, lead, last, named)
        if facts is None:
            continue
        shapes = {name: facts["shapes"][name] for name in present}
        key = tuple(tuple(shapes[n]) for n in present)
        admitted.append(key)
        group = groups.setdefault(_equal_pairs(_positions(op, shapes, params)), [])
        if all(key != k for _, _, k in group):
            group.append((lead, last, key))
    label = "sweep" + suffix
    if not admitted:
        sizes = ", ".join(f"{lead}x{last}" for lead, last in CANDIDATES)
        return Sweep([], label, f"the op's rules admit none of the sizes tried (lead x last: {sizes})")
    if len(set(admitted)) < 2:
        shapes = ", ".join(f"{n} {list(s)}" for n, s in zip(present, admitted[0]))
        return Sweep([], label, f"the op's rules admit one input shape only ({shapes})")
    best = max(groups.values(), key=len)  # the earliest of equals
    if len(best) < 2:
        return Sweep(
            [], label, "the op's rules admit no two input shapes with the same dims equal (Note [Duck sizing])"
        )
    cases = []
    for lead, last, _ in best[:SWEEP]:
        case = builder.build(f"sweep {lead}x{last}{suffix}", lead, last, params, omit_optional=omit_optional)
        if case is not None:
            cases.append(case)
    if len(cases) < 2:
        return Sweep([], label, "no inputs can be made for two of the sizes the op's rules admit (value domains)")
    sizes = ", ".join(c.label.removeprefix("sweep ").removesuffix(suffix) for c in cases)
    return Sweep(cases, f"sweep {sizes}{suffix}")
