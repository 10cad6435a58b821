// The JSON description of an op library: every declaration as data, for Python tooling and
// adapters that trace in Python (see python/opforge/description.py, which reads it).
#pragma once

#include <string>

#include "opforge/c_api.h"

namespace opforge::core {

/// The description of `lib`'s ops, as JSON text:
///
///   {"abi_version": 3, "kernel_dir": "/abs/libx.kernels" | null, "ops": [op...], "classes": [class...]}
///   op: {"name": "ns::op", "schema", "out_schema": the out= overload's | null (none),
///        "doc", "file", "line", "equivalent": str | null,
///        "backward": "ns::op_backward" | null,
///        "backward_sources": per argument of the backward op ["grad", result index] (that
///        result's gradient) | ["arg", argument index] | ["result", result index] (BackwardPlan;
///        results: the outputs, then the mutated inputs' values after the op),
///        "backward_gradients": per output of the backward op [the argument indices it is the
///        gradient of...],
///        "differentiable_results": per result, whether the backward op takes its gradient
///        (BackwardPlan::differentiable; empty without a backward op),
///        "is_backward_op": bool, "autocast": "none" | "float32" | "lower_precision" | "promote",
///        "tolerances": {dtype: [atol, rtol]} (OpBuilder::tolerance; opforge verify's defaults
///        for the others), "tolerance_vs_equivalent": factor | null
///        (OpBuilder::tolerance_vs_equivalent),
///        "sharding": "none" | "pointwise" | "rowwise" | "dims",
///        "sharding_dims": [d...], "unshardable_dims": [d from the end...], "batchable": [name...]
///        (batchable_args in sharding.h), "rules": [{"text":
///        "a.size(0) <= b.size(1)", "op": "<="}...],
///        "args": [arg...], "outputs": [output...], "devices": ["cpu", "cuda"],
///        "runtime_kernels": [{"source", "name", "backend",
///        "checks_values"}], "dtype_combinations": [{tensor name: dtype,
///        name of a parameter a dtype rule follows: typed value}...]
///        (dtype_combinations in dtypes.h), "dtype_combinations_on": {device: [those its kernel
///        takes...]} (dtype_combinations_on, Note [Kernel dtypes])}
///   tensor arg: {"name", "kind": "tensor", "type": "Tensor", "dtypes": ["float32"...],
///        "same_dtype": name | null, "dtype_alternatives": [dtype...] (with same_dtype),
///        "dtype_cases": [{"param", "value": typed value, "dtypes", "same_dtype",
///        "dtype_alternatives"}...] (the rules where a parameter has a value; the fields above are
///        then the rule of every other value: Note [Rules that follow a parameter]),
///        "same_shape": name | null, "min_rank", "max_rank" (-1: no bound), "leading_dims": bool
///        ("shape" then rules the last dims), "layout": "contiguous" | "strided" | "contiguous_last_dim",
///        "optional": bool, "default_none": bool (schema `=None`), "mutated": bool,
///        "values": null | {"low", "high" (text), "unique": bool, "sentinel": int | null} (Note [Value domains]),
///        "shape": ["x.size(-1)", "*"...] | null, "shape_cases": [case...] (the shape rules where a
///        parameter has a value; "shape" is then the rule of every other value), "multiple_of": [[dim,
///        k]...], "follows": [[dim of the first input, dim]...]}
///   param arg: {"name", "kind": "param", "type": "int" | "float" | "bool" | "str" | "int[]" |
///        "float[]", "default": typed value (absent: required), "min", "max" (absent: no
///        bound), "choices": [typed value...] | null, "compile_time": bool}
///   output: {"name", "dtype": "float32" | null (fixed dtype), "dtype_like": name | null,
///        "like": name | null, "present_with": the optional input it exists with | null,
///        "size_from": the output whose value is its first dim (data-dependent) | null,
///        "shape": [text...] (explicit shape), "with_dims": [[dim, text]...] (like: replaced dims),
///        "cases": [case...] (its shape and dtype rules where a parameter has a value)}
///   case (Note [Rules that follow a parameter]): {"param", "value": typed value, "shape": [text...]
///        | null (no shape rule), "leading_dims": bool, "dtype": name | null, "dtype_like": name |
///        null}
///   class (Note [Custom classes], classes.h): {"name": "Class", "qualified_name": "ns::Class", "doc",
///        "file", "line", "constructor": "ns::op" | null, "fields": [{"name", "kind": "Tensor" |
///        "int" | ..., "optional": bool}...], "methods": [{"name", "op": "ns::op", "bound": [field
///        name | null (the caller's argument), one per argument of the op]}...]}
///
/// Shape rules appear as text only: Python, and adapters that trace there, have the core evaluate
/// them (opforge_core_output_shapes, opforge_core_example_shapes in opforge/core.h).
///
/// Floats that JSON cannot hold (inf, nan) are the strings "inf", "-inf" and "nan".
std::string description_json(const OpforgeLibrary& lib);

}  // namespace opforge::core
