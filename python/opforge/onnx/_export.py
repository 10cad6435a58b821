"""torch.onnx's translation of opforge ops: one function per op, each writing the op's node
(Note [The ONNX node of an op] in ``src/ort/registration.cpp``) through onnxscript with the op's
registered ONNX schema (``_schemas``), so ``torch.onnx.export(..., dynamo=True)`` needs nothing
written per op."""

from __future__ import annotations

import inspect

import torch
from onnxscript.values import Op as OnnxOp
from onnxscript.values import Opset

from ..description import REQUIRED, Op, Param, TensorArg
from . import _schemas


def _signature(op: Op) -> inspect.Signature:
    """The op's schema as a Python signature (how the exporter passes the FX node's arguments)."""
    parameters = []
    for a in op.args:
        default = inspect.Parameter.empty
        if isinstance(a, TensorArg) and a.optional:
            default = None
        elif isinstance(a, Param):
            default = None if a.default is not REQUIRED else inspect.Parameter.empty
        parameters.append(inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    return inspect.Signature(parameters)


def _attribute(op: Op, p: Param, value):
    """A parameter's value as the node's attribute (bool as int: ONNX has no bool attribute).

    Raises:
        ValueError: a value only known when the graph runs (a symbolic size parameter).
    """
    if isinstance(value, (list, tuple)):
        return [_attribute(op, p, v) for v in value]
    if isinstance(value, (bool, int, float, str)):
        return int(value) if isinstance(value, bool) else value
    raise ValueError(
        f"opforge.onnx: {op.name}: parameter {p.name} is exported as an ONNX attribute and needs a value known when "
        f"the model is exported, got {value!r}"
    )


def translation(op: Op):
    """The function torch.onnx calls for a node of ``op``: writes the op's ONNX node (its tensor
    inputs, its parameters as attributes) and returns its outputs, then the written inputs' new
    values."""
    domain, name = _schemas.domain_and_name(op)
    onnx_op = OnnxOp(Opset(domain, _schemas.OPSET_VERSION), name, _schemas.schema_of(op))
    signature = _signature(op)

    def translate(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        inputs = [bound.arguments.get(t.name) for t in op.tensors]
        while inputs and inputs[-1] is None:  # no empty input after the last given one
            inputs.pop()
        attributes = {
            p.name: _attribute(op, p, bound.arguments[p.name])
            for p in op.params
            if bound.arguments.get(p.name) is not None
        }
        return onnx_op(*inputs, **attributes)

    translate.__name__ = f"opforge_{domain}_{name}"
    return translate


def written_translation(ops: dict[str, Op], translations: dict[str, object]):
    """The translation of torch.export's functionalised call of an op that writes its inputs
    (``auto_functionalized_v2(op, _x_base_index=i, _all_bases=[...], **other args)``, which returns
    the op's results, then the new value of every base): the op's node, whose extra outputs are
    the written inputs' new values (Note [The ONNX node of an op]), given back as the new values of
    their bases; a base the op does not write is returned as it is.

    Raises:
        ValueError: an op that is not one of ``ops``, or a written argument that is a view of
            another tensor (ONNX has no views to write through).
    """

    def translate(mutable_op, **kwargs):
        schema = getattr(mutable_op, "_schema", None)
        name = schema.name if schema is not None else str(mutable_op)
        if name not in ops:
            raise ValueError(
                f"opforge.onnx: {name} writes its inputs and is not an op of an opforge library loaded here"
            )
        op = ops[name]
        bases = list(kwargs.pop("_all_bases", []))
        kwargs.pop("_only_clone_these_bases", None)
        args, written = {}, []
        for a in op.args:
            if not (isinstance(a, TensorArg) and a.mutated):
                args[a.name] = kwargs.get(a.name)
                continue
            view = sorted(k for k in kwargs if k.startswith(f"_{a.name}_") and k != f"_{a.name}_base_index")
            if view:
                raise ValueError(
                    f"opforge.onnx: {op.name} writes {a.name}, which is a view of another tensor here "
                    f"({', '.join(view)}); ONNX has no views to write through: pass the tensor itself"
                )
            index = kwargs.get(f"_{a.name}_base_index")
            args[a.name] = None if index is None else bases[index]
            if index is not None:
                written.append(index)
        results = translations[name](**args)
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        outputs, new_values = results[: len(op.outputs)], results[len(op.outputs) :]
        for index, value in zip(written, new_values, strict=True):
            bases[index] = value
        return (*outputs, *bases)

    translate.__name__ = "opforge_auto_functionalized"
    return translate


def refusal(op: Op):
    """The function torch.onnx calls for a node of an op that has no ONNX schema because an output's
    fixed dtype has no ONNX element type (:func:`_schemas.untyped_outputs`).

    Raises:
        TypeError: always, naming the op, the output and its dtype.
    """
    untyped = ", ".join(f"{o.name} ({o.dtype})" for o in _schemas.untyped_outputs(op))

    def refuse(*args, **kwargs):
        raise TypeError(
            f"opforge.onnx: {op.name} cannot be exported to ONNX: ONNX has no element type for its output {untyped}"
        )

    return refuse


def translation_table(ops: list[Op]) -> dict:
    """``{torch.ops.<ns>.<op>.default: translation}`` for each of ``ops`` that torch has
    registered (opforge.load_library), and the translation of torch.export's functionalised calls
    of those that write their inputs, for ``torch.onnx.export(custom_translation_table=...)``."""
    _schemas.register(ops)
    table, by_name, translations = {}, {}, {}
    for op in ops:
        ns, name = _schemas.domain_and_name(op)
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is None:
            continue
        if not _schemas.onnx_typed(op):
            table[packet.default] = refusal(op)
            continue
        table[packet.default] = translations[op.name] = translation(op)
        by_name[op.name] = op
    if any(op.mutated for op in by_name.values()):
        table[torch.ops.higher_order.auto_functionalized_v2] = written_translation(by_name, translations)
    return table
