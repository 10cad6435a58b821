// Schema strings derived from an op's C ABI record: names, types, defaults, expressions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// "ns::name".
std::string qualified_name(const OpforgeOpSpec& op);

/// "file:line: ns::name: ", the prefix of every declaration error about `op`.
std::string declared_at(const OpforgeOpSpec& op);

/// The torch schema without namespace, e.g. "softshrink(Tensor x, float lambd=0.5) -> Tensor".
/// Types: Tensor (`Tensor? name=None` if optional, `Tensor(a!) name` if mutated), int (SymInt for
/// a size parameter, is_size_param), float, bool, str, int[], float[]; returns `Tensor`, a tuple, or `()` for an op
/// that only writes its inputs; defaults printed so that torch's schema parser reads back the same value (floats as
/// shortest round-trip decimals, strings quoted with backslash escapes).
std::string schema(const OpforgeOpSpec& op);

/// Whether the op has an `out=` overload: it has outputs, each of which every call has (none
/// exists only with an optional input) at a size known before the kernel runs, and writes none of its inputs (an op
/// that does is not functional, and under torch.compile an out= overload is functionalised through the functional op).
bool has_out_overload(const OpforgeOpSpec& op);

/// The `out=` overload, as ATen writes them: the op's arguments, then its outputs as
/// keyword-only arguments the caller allocates, which are written and returned, e.g.
/// "softshrink.out(Tensor x, float lambd=0.5, *, Tensor(a!) y) -> Tensor(a!)".
std::string out_schema(const OpforgeOpSpec& op);

/// Whether an output's first dim is data-dependent (OpforgeOutputSpec::size_from).
bool has_data_dependent_sizes(const OpforgeOpSpec& op);

/// For an op with data-dependent sizes, its fake companion: the op's schema renamed
/// "_opforge_fake_<name>" with a keyword-only `SymInt[] data_dependent_sizes` (one per such
/// output, in order), e.g. "_opforge_fake_compact(Tensor x, float threshold, *, SymInt[]
/// data_dependent_sizes) -> (Tensor, Tensor)". A tracing framework creates the unbacked sizes
/// and calls it to evaluate every other rule in C++ (Note [Data-dependent sizes] in opforge/expr.h).
std::string fake_companion_schema(const OpforgeOpSpec& op);
std::string fake_companion_name(const OpforgeOpSpec& op);

/// The out= overload's schema with namespace, "examples::softshrink.out(...) -> Tensor(a!)".
std::string qualified_out_schema(const OpforgeOpSpec& op);

/// The schema with namespace, as error messages print it: "examples::softshrink(...) -> Tensor".
std::string qualified_schema(const OpforgeOpSpec& op);

/// Infix text of an expression, e.g. "x.size(-1) * 2"; used in messages and docs.
std::string expr_string(const OpforgeOpSpec& op, const OpforgeExpr& e);

/// "<=" for OPFORGE_EXPR_LE, and so on for the comparisons of rules.
const char* comparison_symbol(int32_t op);

/// A rule's text, e.g. "cos_sin_cache.size(1) <= query.size(-1)".
std::string rule_string(const OpforgeOpSpec& op, const OpforgeRule& rule);

/// The op's autocast policy (OpforgeAutocast; NONE for records without the field), and its name:
/// "none", "float32", "lower_precision", "promote".
int32_t autocast_policy(const OpforgeOpSpec& op);
const char* autocast_name(int32_t policy);

/// The tolerances opforge verify compares the op's results with (OpforgeOpSpec::tolerances),
/// none for records without the field.
std::vector<OpforgeTolerance> tolerances(const OpforgeOpSpec& op);

/// The factor of OpforgeOpSpec::tolerance_vs_equivalent, 0 when not declared or for records
/// without the field.
double tolerance_vs_equivalent(const OpforgeOpSpec& op);

/// The op's cross-argument rules (OpforgeOpSpec::rules), 0 for records without the field.
int32_t num_rules(const OpforgeOpSpec& op);

/// Whether parameter `i` is a size: an int64_t parameter, not compile-time, that a shape rule,
/// value domain or cross-argument rule reads. Its schema type is `SymInt` (as torch's own size
/// arguments), so that torch.compile(dynamic=True) and torch.export keep a value derived from a
/// dynamic dim symbolic instead of specialising (recompiling) on each value.
bool is_size_param(const OpforgeOpSpec& op, int32_t i);

/// Name of a schema type for an argument kind ("Tensor", "int", ...).
const char* schema_type(int32_t kind);

/// True if `k` is a run-time kernel (a source compiled at run time) of a library whose ABI
/// carries those fields.
bool has_runtime_source(const OpforgeKernel& k);

/// The kernel a call on `device_type` (OpforgeDeviceType) runs: the CPU reference for
/// OPFORGE_DEVICE_CPU, else the op's first kernel for that device; null if it has none. Every
/// adapter picks through this, so they agree on which kernel runs.
const OpforgeKernel* device_kernel(const OpforgeOpSpec& op, int32_t device_type);

/// The OpforgeDeviceType a framework's device type name stands for ("cpu", "cuda"); -1 for
/// one no kernel runs on ("meta").
int32_t device_type_code(std::string_view name);

/// The name of OpforgeDeviceType `device_type` in messages and descriptions: "cuda" or "cpu".
inline const char* device_type_name(int32_t device_type) { return device_type == OPFORGE_DEVICE_CUDA ? "cuda" : "cpu"; }

/// Whether kernel `k` declares the dtypes it takes for one argument (Note [Kernel dtypes] in
/// opforge/op_builder.h): a dtype_arg and a non-empty set.
inline bool restricts_dtypes(const OpforgeKernel& k) { return k.dtype_arg >= 0 && k.dtypes != 0; }

/// Whether kernel `k` takes `dtype` (OpforgeDtype) for tensor argument `arg`: true unless `k`
/// declares a dtype set for `arg` without it.
inline bool kernel_takes(const OpforgeKernel& k, int32_t arg, int32_t dtype) {
  return !restricts_dtypes(k) || k.dtype_arg != arg || (dtype >= 0 && ((k.dtypes >> dtype) & 1u));
}

/// True if `a` is a tensor argument the caller may leave out (`Tensor? name=None`). (The
/// field needs no struct_size test: OpforgeTensorSpec is embedded in OpforgeArgSpec, so it
/// grows only with OPFORGE_ABI_VERSION, which loading checks.)
inline bool is_optional(const OpforgeArgSpec& a) { return a.kind == OPFORGE_ARG_TENSOR && a.tensor.optional != 0; }

/// True if `a` is a tensor argument the kernel writes in place (`Tensor(a!) name`).
inline bool is_mutated(const OpforgeArgSpec& a) { return a.kind == OPFORGE_ARG_TENSOR && a.tensor.mutated != 0; }

/// True if the op writes any of its inputs.
bool mutates_inputs(const OpforgeOpSpec& op);

/// The op's equivalent torch expression (OpforgeOpSpec::equivalent), or nullptr.
const char* equivalent(const OpforgeOpSpec& op);

/// The op's sharding kind (OpforgeSharding) and, for OPFORGE_SHARDING_DIMS, its dims bit set;
/// OPFORGE_SHARDING_NONE for records without the fields.
int32_t sharding(const OpforgeOpSpec& op);
uint32_t sharding_dims(const OpforgeOpSpec& op);

}  // namespace opforge::core
