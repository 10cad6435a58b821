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
        attributes = {
            p.name: _attribute(op, p, bound.arguments[p.name])
            for p in op.params
            if bound.arguments.get(p.name) is not None
        }
        return onnx_op(*inputs, **attributes)

    translate.__name__ = f"opforge_{domain}_{name}"
    return translate


def translation_table(ops: list[Op]) -> dict:
    """``{torch.ops.<ns>.<op>.default: translation}`` for each of ``ops`` that torch has
    registered (opforge.load_library), for ``torch.onnx.export(custom_translation_table=...)``."""
    _schemas.register(ops)
    table = {}
    for op in ops:
        ns, name = _schemas.domain_and_name(op)
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is not None:
            table[packet.default] = translation(op)
    return table
