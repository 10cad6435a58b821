// Schema strings and descriptions derived from an op's C ABI record.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// "ns::name".
std::string qualified_name(const OpforgeOpSpec& op);

/// The torch schema without namespace, e.g. "softshrink(Tensor x, float lambd=0.5) -> Tensor".
/// Types: Tensor (`Tensor? name=None` if optional), int, float, bool, str, int[], float[];
/// defaults printed so that torch's schema parser reads back the same value (floats as
/// shortest round-trip decimals).
std::string schema(const OpforgeOpSpec& op);

/// The schema with namespace, as error messages print it: "examples::softshrink(...) -> Tensor".
std::string qualified_schema(const OpforgeOpSpec& op);

/// Infix text of an expression, e.g. "x.size(-1) * 2"; used in messages and docs.
std::string expr_string(const OpforgeOpSpec& op, const OpforgeExpr& e);

/// A JSON description of a library's ops (name, schema, doc, declaration site, arguments with
/// kinds, dtype sets, ranks, layouts and `"optional": true` for optional tensors, and outputs),
/// for Python tooling and other adapters.
std::string library_json(const OpforgeLibrary& lib);

/// True if `k` is a run-time kernel (a CUDA source compiled at run time) of a library whose ABI
/// carries those fields.
bool has_runtime_source(const OpforgeKernel& k);

/// How an op's values reach the backward op it names (Note [Backward ops] in opforge/op.h),
/// matched by argument names.
struct BackwardPlan {
  enum class Source { kGrad, kArg, kOutput };
  /// Per argument of the backward op, in schema order: the gradient of forward output `index`
  /// (kGrad), forward argument `index`, tensor or parameter (kArg), or forward output `index`
  /// (kOutput).
  std::vector<std::pair<Source, int32_t>> sources;
  /// Per output of the backward op: the index of the forward argument it is the gradient of.
  std::vector<int32_t> targets;
};

/// The backward op `op` names, if it has one and its record carries the field, else nullptr.
const char* backward_name(const OpforgeOpSpec& op);

/// Matches `bwd`'s arguments and outputs to `fwd` by name: an argument `grad_<output>` or named
/// like an argument or output of `fwd`; outputs `grad_<tensor argument>`. Returns the plan, or
/// sets `problems` to one line per mismatch (naming the argument and what it may be called)
/// and returns an empty plan.
BackwardPlan plan_backward(const OpforgeOpSpec& fwd, const OpforgeOpSpec& bwd, std::string& problems);

/// True if another op of `lib` names `op` as its backward op.
bool is_backward_op(const OpforgeLibrary& lib, const OpforgeOpSpec& op);

/// The op of `lib` called `qualified` ("ns::name"), or nullptr.
const OpforgeOpSpec* find_op(const OpforgeLibrary& lib, const std::string& qualified);

/// Every problem with the backward ops `lib`'s ops name, one line each ("" if none): a backward
/// op the library does not declare, or names that do not match (plan_backward).
std::string check_backward_ops(const OpforgeLibrary& lib);

/// Name of a schema type for an argument kind ("Tensor", "int", ...).
const char* schema_type(int32_t kind);

/// True if `a` is a tensor argument the caller may leave out (`Tensor? name=None`). (The
/// field needs no struct_size test: OpforgeTensorSpec is embedded in OpforgeArgSpec, so it
/// grows only with OPFORGE_ABI_VERSION, which the adapter checks at load.)
inline bool is_optional(const OpforgeArgSpec& a) { return a.kind == OPFORGE_ARG_TENSOR && a.tensor.optional != 0; }

}  // namespace opforge::core
