"""Batching rules (``torch.func.vmap``) for every op of a loaded library, registered with
``torch.library.register_vmap``.

Which inputs may carry the batch as one more leading dim is the core's rule
(``core::batchable_args``, ``Op.batchable``): pointwise and rowwise ops whose first input has a
free rank. When only such inputs are batched, the rule moves each batch dim to the front,
broadcasts the unbatched ones among them to the batch, and calls the op once; the outputs are
batched at dim 0. Any other call (a batched bias, an op of fixed rank, one that writes its
inputs) falls back to calling the op once per batch element and stacking the results: correct
for every op, and as slow as a Python loop. An op with data-dependent output sizes
(opforge::size_of) is refused, as torch refuses ``nonzero``, and so is a call that writes an input
that is not batched while another input is (every element would write the same memory), as
torch refuses its own in-place ops. A zero-size batch evaluates the output shapes and
dtypes on the Meta device (the core's rules) and returns empty outputs. Nested vmap applies the
rule once per level.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .description import Op, TensorArg


def _handle(op: Op):
    ns, name = op.name.split("::")
    return getattr(getattr(torch.ops, ns), name).default


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _batched_at_0(out):
    """``out`` and its out_dims: every output batched at dim 0 (None for an absent output)."""
    if isinstance(out, tuple):
        return out, tuple(None if o is None else 0 for o in out)
    return out, 0


def _one_call(op: Op, handle, batch: int, in_dims, args, kwargs):
    call = list(args)
    for i, (a, d) in enumerate(zip(args, in_dims)):
        if d is not None:
            call[i] = a.movedim(d, 0)
        elif op.args[i].name in op.batchable and isinstance(a, torch.Tensor):  # follows the batch
            call[i] = a.expand(batch, *a.shape)
    return _batched_at_0(handle(*call, **kwargs))


def _per_element(handle, batch: int, in_dims, args, kwargs):
    if batch == 0:  # no element to call the op on: its outputs' shapes from the Meta kernel
        one = [
            torch.empty(a.shape[:d] + a.shape[d + 1 :], dtype=a.dtype, device="meta")
            if d is not None
            else (a.to("meta") if isinstance(a, torch.Tensor) else a)
            for a, d in zip(args, in_dims)
        ]
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        outs = tuple(
            None if o is None else torch.empty((0, *o.shape), dtype=o.dtype, device=device)
            for o in _as_tuple(handle(*one, **kwargs))
        )
        return _batched_at_0(outs if len(outs) > 1 else outs[0])
    results = [
        _as_tuple(handle(*[a.select(d, b) if d is not None else a for a, d in zip(args, in_dims)], **kwargs))
        for b in range(batch)
    ]
    stacked = tuple(None if parts[0] is None else torch.stack(parts) for parts in zip(*results))
    return _batched_at_0(stacked if len(stacked) > 1 else stacked[0])


def _refuse_unbatched_writes(op: Op, in_dims, args, batched: set[str]) -> None:
    """An op that writes an input that is not batched while another input is would have every
    element of the batch write the same memory, one after another: a result that depends on the
    order. torch refuses its own in-place ops so ("vmap: inplace arithmetic(self, *extra_args) is
    not possible ..."); so does opforge, naming the op and the input."""
    if not batched:
        return
    for a, d, value in zip(op.args, in_dims, args):
        if isinstance(a, TensorArg) and a.mutated and d is None and isinstance(value, torch.Tensor):
            raise RuntimeError(
                f"vmap: {op.name} writes {a.name} in place, but {a.name} is not batched while "
                f"{', '.join(sorted(batched))} {'is' if len(batched) == 1 else 'are'}: every element of the batch "
                f"would write the same {a.name}; batch {a.name} too (e.g. {a.name}.expand(batch, ...).clone()) or "
                "call the op outside vmap"
            )


def register_batching_rules(ops: Iterable[Op]) -> None:
    """Registers with torch the batching rule of each op in ``ops`` (see the module docstring)."""
    for op in ops:
        handle = _handle(op)
        names = [a.name for a in op.args]

        dynamic = [o.name for o in op.outputs if o.size_from]

        def rule(info, in_dims, *args, _op=op, _handle=handle, _names=names, _dynamic=dynamic, **kwargs):
            if _dynamic:  # as torch's own nonzero: each element's outputs may differ in size
                raise RuntimeError(
                    f"vmap: {_op.name} cannot be batched: the sizes of its outputs {', '.join(_dynamic)} depend on "
                    "the input values (opforge::size_of), so the elements' results cannot be stacked; call it "
                    "once per element instead"
                )
            in_dims = tuple(in_dims) + (None,) * (len(args) - len(in_dims))
            batched = {_names[i] for i, d in enumerate(in_dims) if d is not None}
            _refuse_unbatched_writes(_op, in_dims, args, batched)
            if batched and batched <= set(_op.batchable):
                return _one_call(_op, _handle, info.batch_size, in_dims, args, kwargs)
            return _per_element(_handle, info.batch_size, in_dims, args, kwargs)

        torch.library.register_vmap(op.name, rule)
