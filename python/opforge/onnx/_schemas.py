"""ONNX schemas of opforge ops: registered with ``onnx.defs`` so that ``onnx.checker`` (with
``full_check``) and ONNX's shape inference know each op's node (Note [The ONNX node of an op] in
``src/ort/registration.cpp``), with output types and shapes inferred by the core from the
description over symbolic dims (Note [Symbolic dims in ONNX] in ``src/ort/dims.h``)."""

from __future__ import annotations

import json
import threading

import onnx
from onnx.defs import OpSchema

from .. import _core
from ..description import Op, TensorArg
from . import _runtime
from ._types import ONNX_TYPES, type_string

#: The opset version of every op's domain.
OPSET_VERSION = 1

_lock = threading.Lock()
_registered: dict[str, OpSchema] = {}

_ATTRIBUTE_TYPES = {
    "int": OpSchema.AttrType.INT,
    "bool": OpSchema.AttrType.INT,
    "float": OpSchema.AttrType.FLOAT,
    "str": OpSchema.AttrType.STRING,
    "int[]": OpSchema.AttrType.INTS,
    "float[]": OpSchema.AttrType.FLOATS,
}


def domain_and_name(op: Op) -> tuple[str, str]:
    """The node's domain and op_type: ``("examples", "softshrink")`` for ``examples::softshrink``."""
    ns, name = op.name.split("::")
    return ns, name


def written_output_name(arg: TensorArg) -> str:
    """The name of the output that holds written input ``arg``'s value after the op."""
    return f"{arg.name}_out"


def _type_param(arg: TensorArg) -> str:
    return f"T_{arg.name}"


def _allowed(arg: TensorArg) -> list[str]:
    dtypes = [d for d in ONNX_TYPES if d in arg.dtypes or d in arg.dtype_alternatives]
    return [type_string(d) for d in (dtypes or list(ONNX_TYPES))]


def schema(op: Op) -> OpSchema:
    """The ONNX schema of ``op``'s node: each tensor input its own type parameter (the dtypes it
    admits), outputs typed by their rule (a fixed dtype, or the type parameter of the input whose
    dtype they take), then each written input's value after the op, parameters as attributes."""
    domain, name = domain_and_name(op)
    option = OpSchema.FormalParameterOption
    inputs = [
        OpSchema.FormalParameter(t.name, _type_param(t), param_option=option.Optional if t.optional else option.Single)
        for t in op.tensors
    ]
    outputs = []
    for o in op.outputs:
        type_str = type_string(o.dtype) if o.dtype is not None else _type_param(op.arg(o.dtype_like))
        optional = o.present_with is not None
        outputs.append(
            OpSchema.FormalParameter(o.name, type_str, param_option=option.Optional if optional else option.Single)
        )
    for t in op.mutated:
        outputs.append(
            OpSchema.FormalParameter(
                written_output_name(t), _type_param(t), param_option=option.Optional if t.optional else option.Single
            )
        )
    constraints = [(_type_param(t), _allowed(t), "") for t in op.tensors]
    attributes = [
        OpSchema.Attribute(p.name, _ATTRIBUTE_TYPES[p.type], "", required=not p.has_default) for p in op.params
    ]
    s = OpSchema(
        name,
        domain,
        OPSET_VERSION,
        f"{op.schema}\n\n{op.doc}",
        inputs=inputs,
        outputs=outputs,
        type_constraints=constraints,
        attributes=attributes,
    )
    s.set_type_and_shape_inference_function(_inference(op))
    return s


def _attribute_json(proto: onnx.AttributeProto) -> dict:
    """An attribute as the adapter's output-types entry reads it (src/ort/output_types.h)."""
    kind = proto.type
    if kind == onnx.AttributeProto.INT:
        return {"i": proto.i}
    if kind == onnx.AttributeProto.FLOAT:
        return {"f": proto.f}
    if kind == onnx.AttributeProto.STRING:
        return {"s": proto.s.decode()}
    if kind == onnx.AttributeProto.INTS:
        return {"ints": list(proto.ints)}
    if kind == onnx.AttributeProto.FLOATS:
        return {"floats": list(proto.floats)}
    return {}


def _dims(type_proto: onnx.TypeProto) -> list[int | str | None]:
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
        for d in type_proto.tensor_type.shape.dim
    ]


def _inference(op: Op):
    """The type-and-shape inference function of ``op``'s schema: asks the adapter (the core's
    rules over symbolic dims) for the node's output types."""
    entry = _runtime.adapter().opforge_ort_output_types
    names = [p.name for p in op.params]

    def infer(ctx) -> None:
        inputs = []
        for i in range(len(op.tensors)):
            if i >= ctx.get_num_inputs() or not ctx.has_input(i):
                inputs.append(None)
                continue
            t = ctx.get_input_type(i)
            if t is None or not t.HasField("tensor_type"):
                return  # a type ONNX has not inferred: nothing to infer from
            shape = _dims(t) if t.tensor_type.HasField("shape") else None
            if shape is None:
                return  # an input of unknown rank
            inputs.append({"type": t.tensor_type.elem_type, "shape": shape})
        attributes = {}
        for name in names:
            proto = ctx.get_attribute(name)
            if proto is not None:
                attributes[name] = _attribute_json(proto)
        request = {"op": op.name, "inputs": inputs, "attributes": attributes}
        response = _core.call(entry, json.dumps(request), _runtime.adapter())
        for k, out in enumerate(response["outputs"]):
            if out is None or k >= ctx.get_num_outputs() or not ctx.has_output(k):
                continue
            ctx.set_output_type(k, onnx.helper.make_tensor_type_proto(out["type"], out["shape"]))

    return infer


def schema_of(op: Op) -> OpSchema:
    """The registered schema of ``op`` (register it first)."""
    return _registered[op.name]


def untyped_outputs(op: Op) -> list:
    """The outputs of ``op`` whose fixed dtype ONNX has no element type for (float8_e8m0fnu): an
    op with any gets no schema, and its translation refuses the export by name."""
    return [o for o in op.outputs if o.dtype is not None and o.dtype not in ONNX_TYPES]


def onnx_typed(op: Op) -> bool:
    """Whether ONNX has an element type for each fixed output dtype of ``op``."""
    return not untyped_outputs(op)


def register(ops: list[Op]) -> None:
    """Registers the ONNX schema of each op of ``ops`` that :func:`onnx_typed` admits with
    ``onnx.defs`` (once per process)."""
    with _lock:
        for op in ops:
            if op.name in _registered or not onnx_typed(op):
                continue
            s = schema(op)
            onnx.defs.register_schema(s)
            _registered[op.name] = s
