"""Output elements a kernel never writes: verify's outputs hold poison before each kernel runs,
and where the reference's value equals the poison, the case runs again with other values.

Note [Poison that equals the reference]
---------------------------------------
While :func:`poisoning` is on, the core fills every output with poison before its kernel runs
(NaN for floating dtypes, 123 for integers, true for bools: ``opforge::core::poison_value``), so
an element the kernel leaves unwritten differs from the reference. Not where the reference holds
the poison itself: a bool mask that is true almost everywhere, an index equal to 123, a NaN the
reference propagates. There a missed element would pass. So wherever some output's reference
equals its poison (:func:`hidden`), verify runs the case again through the op's out= overload,
with poisoning off and each output filled beforehand with values that differ from the
reference in every element (:func:`other_values`: the poison, and elsewhere 0 or false), and
compares that run with the reference too. An op without an out= overload (one that writes its
inputs, or has an optional or a data-dependent output) cannot be given its outputs: such a case
passes with a message that counts the elements left unchecked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .._core import set_poison_outputs
from ..description import Op

_poisoning = [False]  # what verify last set (the core's switch has no getter)


@contextmanager
def poisoning(enabled: bool) -> Iterator[None]:
    """Turns the core's output poisoning on or off (:func:`opforge._core.set_poison_outputs`)
    for the block, and back to what verify had set before it."""
    before = _poisoning[0]
    set_poison_outputs(enabled)
    _poisoning[0] = enabled
    try:
        yield
    finally:
        set_poison_outputs(before)
        _poisoning[0] = before


def _poison(dtype: torch.dtype) -> float | bool | int:
    """The value the core poisons an output of ``dtype`` with (``opforge::core::poison_value``)."""
    return float("nan") if dtype.is_floating_point else (True if dtype == torch.bool else 123)


def _equals_poison(like: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Where ``ref`` (any dtype, on any device) holds the poison of an output of ``like``'s dtype."""
    r = ref.detach().cpu()
    if like.is_floating_point():
        return r.isnan() if r.is_floating_point() else torch.zeros(r.shape, dtype=torch.bool)
    return r.double() == float(_poison(like.dtype))


def hidden(op: Op, out: tuple, ref: tuple) -> int:
    """How many elements of the op's outputs (the first ``len(op.outputs)`` of ``out`` and of
    ``ref``: :func:`~opforge.verify.checks.results`) hold the poison in the reference, where a
    kernel that did not write them would pass."""
    n = 0
    for o, r in zip(out[: len(op.outputs)], ref[: len(op.outputs)]):
        if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.shape == r.shape:
            n += int(_equals_poison(o, r).sum())
    return n


def other_values(like: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """A dense tensor of ``like``'s shape, dtype and device that differs from ``ref`` (of the same
    shape) in every element: the poison, and 0 (false for bools) where ``ref`` holds the poison."""
    out = torch.full(like.shape, _poison(like.dtype), dtype=like.dtype)
    out[_equals_poison(like, ref)] = 0
    return out.to(like.device)


def run_prefilled(op: Op, handle, args: list, out: tuple, ref: tuple) -> tuple:
    """The results of the out= overload of ``handle`` (the op's ``torch.ops`` packet) on ``args``
    (which it writes, as :func:`~opforge.verify.checks.results` does), with poisoning off and
    its outputs given as dense tensors of the shapes, dtypes and devices of ``out`` (an earlier
    run's results) holding :func:`other_values` of ``ref``: its outputs, then the final values
    of the mutated inputs.

    Raises:
        RuntimeError: the overload returned other tensors than the out tensors it was given.
    """
    buffers = [
        None if t is None else other_values(t, r) for t, r in zip(out[: len(op.outputs)], ref[: len(op.outputs)])
    ]
    with poisoning(False):
        returned = handle.out(*args, **{o.name: b for o, b in zip(op.outputs, buffers) if b is not None})
    returned = returned if isinstance(returned, (tuple, list)) else (returned,)
    if any(b is not None and r is not b for r, b in zip(returned, buffers)):
        raise RuntimeError("the out= overload did not return its out tensors")
    return tuple(buffers) + tuple(args[a.index] for a in op.mutated if args[a.index] is not None)
