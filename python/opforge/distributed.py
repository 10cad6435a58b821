"""Sharding rules for ``torch.distributed.tensor`` (DTensor), from op descriptions.

An op declares how its work may be split (``.sharding(opforge::Sharding::kPointwise)``, or
derived from a run-time kernel's launch rule; see ``opforge::Sharding`` in opforge/op_builder.h), and
:func:`register_sharding_rules` turns that into DTensor strategies, so a tensor-parallel model
calls opforge ops on DTensors without gathering them:

- pointwise: for every dim ``d`` of the output, output and inputs ``Shard(d)`` (an input of lower
  rank aligns with the output's trailing dims, like a bias: ``Shard(d - offset)`` where it has
  that dim, else ``Replicate()``); or everything replicated.
- rowwise: the same except the last dim: rows stay whole on one rank.
- in both, the dims the core reports as unshardable (``Op.unshardable_dims``: declared
  ``opforge::multiple_of(k)`` by some input) are never sharded.
- dims (``.sharding(opforge::shard_dims({0, 1}))``): each listed dim of the first tensor input,
  with the outputs ``Shard(d)`` too; another input is ``Shard(j)`` where the core found that it
  follows dim d (``TensorArg.follows``: its shape rule declares dim j as ``dim(first, d)``, or it
  has ``same_shape`` of such an input), else ``Replicate()``. Attention shards over batch and
  heads this way, its padding mask over batch only.

``opforge.load_library`` registers the rules of every op it loads. The rules' facts come from the
core (src/core/sharding.h); this module only builds DTensor placements from them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .description import Op


def strategies(
    kind: str, num_outputs: int, args: Sequence[object], whole: frozenset[int] = frozenset()
) -> list[tuple[list, list]]:
    """DTensor sharding strategies -- (output placements, input placements) pairs -- for an op of
    sharding ``kind`` ("pointwise" or "rowwise") called with ``args`` (tensor-likes have ``ndim``;
    other values, including None for an optional tensor left out, get placement None). Dims in
    ``whole`` (counted from the end, :attr:`Op.unshardable_dims`) are not sharded.
    """
    from torch.distributed.tensor import Replicate, Shard

    tensors = [a for a in args if hasattr(a, "ndim")]
    rank = tensors[0].ndim
    out = [([Replicate()] * num_outputs, [Replicate() if hasattr(a, "ndim") else None for a in args])]
    shardable = range(rank) if kind == "pointwise" else range(rank - 1)
    for d in (d for d in shardable if d - rank not in whole):
        inputs = []
        for a in args:
            if not hasattr(a, "ndim"):
                inputs.append(None)
                continue
            offset = rank - a.ndim  # broadcast from the right
            inputs.append(Shard(d - offset) if d >= offset else Replicate())
        out.append(([Shard(d)] * num_outputs, inputs))
    return out


def dims_strategies(op: Op, num_outputs: int, args: Sequence[object], names: Sequence[str | None]) -> list:
    """DTensor strategies for sharding kind "dims" (see the module docstring) for a call with
    ``args`` in DTensor's order, ``names[k]`` being the declared argument name of ``args[k]``
    (None: positional, the k-th declared argument)."""
    from torch.distributed.tensor import Replicate, Shard

    declared = [op.args[k] if n is None else op.arg(n) for k, n in enumerate(names)]
    out = [([Replicate()] * num_outputs, [Replicate() if hasattr(a, "ndim") else None for a in args])]
    for d in op.sharding_dims:
        inputs = []
        for a, arg in zip(args, declared):
            if not hasattr(a, "ndim"):
                inputs.append(None)
            else:
                j = getattr(arg, "follows", {}).get(d)
                inputs.append(Shard(j) if j is not None else Replicate())
        out.append(([Shard(d)] * num_outputs, inputs))
    return out


def register_sharding_rules(ops: Sequence[Op]) -> list[str]:
    """Register DTensor strategies for every op in ``ops`` whose sharding is not "none".

    Returns:
        The names of the ops given rules ([] if torch.distributed is unavailable).
    """
    import torch

    if not torch.distributed.is_available():
        return []
    from torch.distributed.tensor.experimental import register_sharding

    done = []
    for op in ops:
        if op.sharding == "none":
            continue
        ns, name = op.name.split("::")
        handle = getattr(getattr(torch.ops, ns), name).default

        def rule(*args, _op=op, **kwargs):
            values = [*args, *kwargs.values()]  # DTensor's order: args, then kwargs
            if _op.sharding == "dims":
                return dims_strategies(_op, len(_op.outputs), values, [None] * len(args) + list(kwargs))
            return strategies(_op.sharding, len(_op.outputs), values, _op.unshardable_dims)

        register_sharding(handle)(rule)
        done.append(op.name)
    return done
