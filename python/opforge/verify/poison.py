"""Output elements a kernel never writes: verify's outputs hold the core's poison before each
kernel runs, and where the reference's value equals that poison, the case runs again with the
core's other poison.

Note [Poison that equals the reference]
---------------------------------------
While :func:`poisoning` is on, the core fills every output with poison before its kernel runs
(step 5 of Note [The call protocol] in ``src/core/call.h``): one byte repeated over the output's
memory, :func:`opforge._core.poison_byte` of its dtype and the mode. verify runs every check in
mode 1 (NaN for floating dtypes, 0x7b in every byte of an integer, true for bools), so an
element the kernel leaves unwritten differs from the reference. Not where the reference holds
that value itself: a bool mask that is true almost everywhere, an index that equals the pattern,
a NaN the reference propagates. There a missed element would pass. So wherever some output's
reference equals its mode-1 poison (:func:`hidden`), verify runs the case again in mode 2 (0x5a
in every byte of a floating or integer dtype: finite values; false for bools) and compares that
run with the reference too. The two modes' values differ in every dtype, so an element left
unwritten differs from the reference in one of the two runs, for every op: those that write
their inputs and those with optional or data-dependent outputs (no out= overload) alike. The
out= check compares the out= overload's results with the op's own by the same rule.

Poisoning covers outputs only: nothing is written into an input before its kernel runs. An
element of a mutated input (Note [Mutated inputs] in ``opforge/op.h``) that the kernel should
write but does not keeps the value it held before the call; verify's comparison of the input's
final value with the reference catches it wherever that value is not the right one (where it
is, the element is right as it stands).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from .._core import poison_byte, poison_outputs, set_poison_outputs
from ..description import Op

#: The message of a case whose run in mode 2 fails where its run in mode 1 passed: "{n}" is the
#: number of output elements whose reference holds the mode-1 poison, followed by the comparison's.
ALTERNATE = "the reference holds the poison in {n} output elements; run again with the alternate poison: "


@contextmanager
def poisoning(mode: int) -> Iterator[None]:
    """Sets the core's poison mode (:func:`opforge._core.set_poison_outputs`: 0 none, 1 the
    primary poison, 2 the alternate one) for the block, and back to the mode that was on before
    it (the core's, so a process's ``OPFORGE_POISON_OUTPUTS`` stays as it was)."""
    before = poison_outputs()
    set_poison_outputs(mode)
    try:
        yield
    finally:
        set_poison_outputs(before)


def poison_value(dtype: torch.dtype, mode: int) -> torch.Tensor:
    """The value the core fills an output of ``dtype`` with in poison mode ``mode`` (1 or 2): a
    0-dim CPU tensor of ``dtype`` whose every byte is :func:`opforge._core.poison_byte`.

    Raises:
        ValueError: opforge has no dtype of that name.
    """
    byte = poison_byte(str(dtype).removeprefix("torch."), mode)
    size = torch.empty((), dtype=dtype).element_size()
    return torch.full((size,), byte, dtype=torch.uint8).view(dtype)[0]


def _equals_poison(dtype: torch.dtype, ref: torch.Tensor) -> torch.Tensor:
    """Where ``ref`` (any dtype, on any device) holds the mode-1 poison of an output of ``dtype``
    (NaN equals NaN), as a bool tensor of ``ref``'s shape on the CPU."""
    p = poison_value(dtype, 1)
    common = torch.promote_types(ref.dtype, p.dtype)
    r, p = ref.detach().cpu().to(common), p.to(common)
    same = r == p
    return same | (r.isnan() & p.isnan()) if common.is_floating_point else same


def hidden(op: Op, out: tuple, ref: tuple) -> int:
    """How many elements of the op's outputs (the first ``len(op.outputs)`` of ``out`` and of
    ``ref``: :func:`~opforge.verify.checks.results`) hold the mode-1 poison in the reference,
    where a kernel that did not write them would pass a run in mode 1."""
    n = 0
    for o, r in zip(out[: len(op.outputs)], ref[: len(op.outputs)]):
        if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.shape == r.shape:
            n += int(_equals_poison(o.dtype, r).sum())
    return n


def rerun_where_hidden(
    op: Op, run: Callable[[], tuple], out: tuple, ref: tuple, compare: Callable[[tuple], tuple]
) -> str:
    """The run in mode 2 of Note [Poison that equals the reference]: where :func:`hidden` finds
    elements of ``ref`` that hold the mode-1 poison (``out``: the results of the run in mode 1
    that passed), ``run()`` again in mode 2 and ``compare`` its results with the reference
    (:func:`~opforge.verify.compare.compare_outputs` with the reference bound: (ok, max error,
    worst ratio, why)). Returns "" if nothing is hidden or the run in mode 2 passes, else
    :data:`ALTERNATE` and the comparison's message."""
    n = hidden(op, out, ref)
    if not n:
        return ""
    with poisoning(2):
        again = run()
    ok, _, _, why = compare(again)
    return "" if ok else ALTERNATE.format(n=n) + why
