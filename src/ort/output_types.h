// Output types of an opforge op's ONNX node from its input types and attributes, evaluated by the
// core over symbolic dims (Note [Symbolic dims in ONNX] in dims.h), for ONNX Runtime's shape
// inference (InferOutputShapeFn) and ONNX's (opforge_ort_output_types, which opforge.onnx calls
// from the inference function it registers with onnx.defs).
#pragma once

#include <cstdint>
#include <vector>

#include "dims.h"
#include "opforge/c_api.h"
#include "ort_abi.h"
#include "params.h"

namespace opforge::ort {

/// The type of one of a node's tensors: an ONNX element type and dims; `present` false for an
/// input or output the node leaves out.
struct TensorType {
  int32_t element_type = kUndefined;
  std::vector<Dim> dims;
  bool present = true;
};

/// The types of a node's outputs (Note [The ONNX node of an op] in registration.cpp: the op's
/// outputs, then each written input's value after the op) from `inputs` (one per tensor input,
/// in schema order) and `params`: the core checks the call (src/core/check.h) and evaluates the
/// output rules. Throws InvalidArgument with the call's message where the types contradict the
/// op's rules.
std::vector<TensorType> output_types(const OpforgeOpSpec& op, const std::vector<TensorType>& inputs,
                                     const Params& params);

/// output_types for ONNX Runtime's shape-inference context: reads the inputs' types from `ctx`,
/// the attributes through `source`, and sets the outputs' types. Throws as output_types.
void infer_output_types(Api api, const OpforgeOpSpec& op, ShapeInferContext* ctx, AttributeSource& source);

}  // namespace opforge::ort

extern "C" {
/* Output types of an op's ONNX node, for ONNX's shape inference (opforge.onnx). Request:
 * {"op": "ns::op", "inputs": [per tensor input in schema order: {"type": ONNX element type,
 * "shape": [int | "name" | null (unknown), ...]} | null (left out)], "attributes": {name: {"i": int}
 * | {"f": float} | {"s": str} | {"ints": [...]} | {"floats": [...]}}}. Response: {"outputs": [per
 * node output: {"type": ONNX element type, "shape": [...]} | null (left out)]}. Errors as
 * opforge/core.h's entries ("invalid_argument": the call's message). */
OpforgeStatus opforge_ort_output_types(const char* request, char** out);
}
