"""Element types between ONNX (``onnx.TensorProto`` numbering, which ONNX Runtime uses as it is)
and opforge's dtype names. One row per type: a new opforge dtype (float8) is one more row here
and in ``src/ort/types.h``."""

from __future__ import annotations

#: opforge dtype name -> ONNX element type (TensorProto.DataType).
ONNX_TYPES: dict[str, int] = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "bfloat16": 16,
}

#: ONNX element type -> opforge dtype name.
OPFORGE_DTYPES: dict[int, str] = {t: name for name, t in ONNX_TYPES.items()}

#: ONNX's type strings of its element types, as OpSchema type constraints name them.
_TYPE_STRINGS: dict[int, str] = {
    1: "tensor(float)",
    2: "tensor(uint8)",
    3: "tensor(int8)",
    5: "tensor(int16)",
    6: "tensor(int32)",
    7: "tensor(int64)",
    9: "tensor(bool)",
    10: "tensor(float16)",
    11: "tensor(double)",
    16: "tensor(bfloat16)",
}


def type_string(dtype: str) -> str:
    """ONNX's type string of opforge dtype ``dtype`` ("float32" -> "tensor(float)")."""
    return _TYPE_STRINGS[ONNX_TYPES[dtype]]
