"""Sharding rules for ``torch.distributed.tensor`` (DTensor), derived from op descriptions.

An op declares how its work may be split (``.sharding(opforge::Sharding::kPointwise)``, or
derived from a run-time kernel's launch rule; see ``opforge::Sharding`` in opforge/op.h), and
:func:`register_sharding_rules` turns that into DTensor strategies, so a tensor-parallel model
calls opforge ops on DTensors without gathering them:

- pointwise: for every dim ``d`` of the output, output and inputs ``Shard(d)`` (an input of lower
  rank aligns with the output's trailing dims, like a bias: ``Shard(d - offset)`` where it has
  that dim, else ``Replicate()``); or everything replicated.
- rowwise: the same except the last dim: rows stay whole on one rank.
- in both, a dim that an input declares ``opforge::multiple_of(k)`` is never sharded (a shard of
  it need not be a multiple of k).
- dims (``.sharding(opforge::shard_dims({0, 1}))``): each listed dim of the first tensor input,
  with the outputs ``Shard(d)`` too; another input is ``Shard(j)`` where its shape rule declares
  dim j as ``dim(first, d)`` (or it has ``same_shape`` of such an input), else ``Replicate()``.
  Attention shards over batch and heads this way, its padding mask over batch only.

``opforge.load_library`` registers the rules of every op it loads.
"""

from __future__ import annotations

from typing import Sequence

from ._adapter import EXPR_DIM, multiple_of_dims


def whole_dims(spec: dict) -> frozenset[int]:
    """Dims, counted from the end (-1 is the last), that some tensor input declares
    ``opforge::multiple_of(k)``: aligned from the right as pointwise inputs are."""
    return frozenset(d - len(a["shape_nodes"]) for a in spec["args"] for d in multiple_of_dims(a))


def strategies(kind: str, num_outputs: int, args: Sequence[object],
               whole: frozenset[int] = frozenset()) -> list[tuple[list, list]]:
    """DTensor sharding strategies -- (output placements, input placements) pairs -- for an op of
    sharding ``kind`` ("pointwise" or "rowwise") called with ``args`` (tensor-likes have ``ndim``;
    other values, including None for an optional tensor left out, get placement None). Dims in
    ``whole`` (counted from the end, see :func:`whole_dims`) are not sharded.
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


def follow_dims(spec: dict) -> dict[int, dict[int, int]]:
    """For an op of sharding kind "dims": {argument index: {dim d of the first tensor input: the
    argument's dim declared ``dim(first, d)``}}, from the shape rules in ``spec`` (an op
    description from :func:`opforge.find_op`); ``same_shape`` inputs inherit their model's map."""
    args = spec["args"]
    first = next(i for i, a in enumerate(args) if a["type"] == "Tensor")
    lead = args[first]
    rank = (len(lead["shape_nodes"]) if "shape_nodes" in lead
            else lead["max_rank"] if lead.get("min_rank", -1) == lead.get("max_rank", -2) else None)
    maps: dict[int, dict[int, int]] = {first: {d: d for d in spec.get("sharding_dims", [])}}
    for i, a in enumerate(args):
        if a["type"] != "Tensor" or i == first:
            continue
        if "same_shape" in a:
            maps[i] = maps.get(next(j for j, b in enumerate(args) if b["name"] == a["same_shape"]), {})
            continue
        maps[i] = {}
        for j, nodes in enumerate(a.get("shape_nodes", [])):
            if len(nodes) == 1 and nodes[0][0] == EXPR_DIM and nodes[0][1] == first:  # dim(first, d)
                d = nodes[0][2]
                maps[i][d + rank if d < 0 and rank is not None else d] = j  # dim(first, -1) counts from the end
    return maps


def dims_strategies(spec: dict, num_outputs: int, args: Sequence[object], names: Sequence[str | None],
                    maps: dict[int, dict[int, int]] | None = None) -> list:
    """DTensor strategies for sharding kind "dims" (see the module docstring) for a call with
    ``args`` in DTensor's order, ``names[k]`` being the declared argument name of ``args[k]``
    (None: positional, the k-th declared argument); ``maps`` is :func:`follow_dims` of
    ``spec`` (computed here if not given)."""
    from torch.distributed.tensor import Replicate, Shard

    index = {a["name"]: i for i, a in enumerate(spec["args"])}
    positions = [k if n is None else index[n] for k, n in enumerate(names)]
    maps = follow_dims(spec) if maps is None else maps
    out = [([Replicate()] * num_outputs, [Replicate() if hasattr(a, "ndim") else None for a in args])]
    for d in spec.get("sharding_dims", []):
        inputs = []
        for a, i in zip(args, positions):
            if not hasattr(a, "ndim"):
                inputs.append(None)
            else:
                j = maps.get(i, {}).get(d)
                inputs.append(Shard(j) if j is not None else Replicate())
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

        maps = follow_dims(spec) if kind == "dims" else None  # from the description, once
        whole = whole_dims(spec)

        def rule(*args, _kind=kind, _n=num_outputs, _spec=spec, _maps=maps, _whole=whole, **kwargs):
            values = [*args, *kwargs.values()]  # DTensor's order: args, then kwargs
            if _kind == "dims":
                return dims_strategies(_spec, _n, values, [None] * len(args) + list(kwargs), _maps)
            return strategies(_kind, _n, values, _whole)

        register_sharding(op)(rule)
        done.append(spec["name"])
    return done
