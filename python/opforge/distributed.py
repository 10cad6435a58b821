"""Sharding rules for ``torch.distributed.tensor`` (DTensor), derived from op descriptions.

An op declares how its work may be split (``.sharding(opforge::Sharding::kPointwise)``, or
derived from a run-time kernel's launch rule; see ``opforge::Sharding`` in opforge/op.h), and
:func:`register_sharding_rules` turns that into DTensor strategies, so a tensor-parallel model
calls opforge ops on DTensors without gathering them:

- pointwise: for every dim ``d`` of the output, output and inputs ``Shard(d)`` (an input of lower
  rank aligns with the output's trailing dims, like a bias: ``Shard(d - offset)`` where it has
  that dim, else ``Replicate()``); or everything replicated.
- rowwise: the same except the last dim: rows stay whole on one rank.

``opforge.load_library`` registers the rules of every op it loads.
"""

from __future__ import annotations

from typing import Sequence


def strategies(kind: str, num_outputs: int, args: Sequence[object]) -> list[tuple[list, list]]:
    """DTensor sharding strategies -- (output placements, input placements) pairs -- for an op of
    sharding ``kind`` ("pointwise" or "rowwise") called with ``args`` (tensor-likes have ``ndim``;
    other values, including None for an optional tensor left out, get placement None).
    """
    from torch.distributed.tensor import Replicate, Shard

    tensors = [a for a in args if hasattr(a, "ndim")]
    rank = tensors[0].ndim
    out = [([Replicate()] * num_outputs, [Replicate() if hasattr(a, "ndim") else None for a in args])]
    shardable = range(rank) if kind == "pointwise" else range(rank - 1)
    for d in shardable:
        inputs = []
        for a in args:
            if not hasattr(a, "ndim"):
                inputs.append(None)
                continue
            offset = rank - a.ndim  # broadcast from the right
            inputs.append(Shard(d - offset) if d >= offset else Replicate())
        out.append(([Shard(d)] * num_outputs, inputs))
    return out


def register_sharding_rules(ops: Sequence[dict]) -> list[str]:
    """Register DTensor strategies for every op in ``ops`` (descriptions from
    :attr:`opforge.Library.ops`) whose sharding is not "none".

    Returns:
        The names of the ops given rules ([] if torch.distributed is unavailable).
    """
    import torch

    if not torch.distributed.is_available():
        return []
    from torch.distributed.tensor.experimental import register_sharding

    done = []
    for spec in ops:
        kind = spec.get("sharding", "none")
        if kind == "none":
            continue
        ns, name = spec["name"].split("::")
        op = getattr(getattr(torch.ops, ns), name).default
        num_outputs = len(spec["outputs"])

        def rule(*args, _kind=kind, _n=num_outputs, **kwargs):
            return strategies(_kind, _n, [*args, *kwargs.values()])  # DTensor's order: args, then kwargs

        register_sharding(op)(rule)
        done.append(spec["name"])
    return done
