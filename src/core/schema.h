// Schema strings derived from an op's C ABI record: names, types, defaults, expressions. The
// accessors that read the records are in records.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "opforge/c_api.h"
#include "records.h"  // the accessors of the records, for readers that include this header only

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

/// A rule's text, e.g. "cos_sin_cache.size(1) <= query.size(-1)", with its presence condition
/// where it has one: "conv_state.size(0) == x.size(0) when conv_state_indices is not given".
std::string rule_string(const OpforgeOpSpec& op, const OpforgeRule& rule);

/// The name of an autocast policy (OpforgeAutocast): "none", "float32", "lower_precision",
/// "promote".
const char* autocast_name(int32_t policy);

/// Whether parameter `i` is a size: an int64_t parameter, not compile-time, that a shape rule,
/// value domain or cross-argument rule reads. Its schema type is `SymInt` (as torch's own size
/// arguments), so that torch.compile(dynamic=True) and torch.export keep a value derived from a
/// dynamic dim symbolic instead of specialising (recompiling) on each value.
bool is_size_param(const OpforgeOpSpec& op, int32_t i);

/// Whether argument `i` has a default in the schema: a parameter declared with one, or an
/// opforge::optional tensor input (`=None`) that only arguments with defaults follow. An optional
/// input before a required argument is `Tensor? key` with no default, as torch's schemas allow
/// (vLLM's `rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size,
/// ...)`): callers pass None for it.
bool has_schema_default(const OpforgeOpSpec& op, int32_t i);

/// Name of a schema type for an argument kind ("Tensor", "int", ...).
const char* schema_type(int32_t kind);

/// The OpforgeDeviceType a framework's device type name stands for ("cpu", "cuda"); -1 for
/// one no kernel runs on ("meta").
int32_t device_type_code(std::string_view name);

/// The name of OpforgeDeviceType `device_type` in messages and descriptions: "cuda" or "cpu".
inline const char* device_type_name(int32_t device_type) { return device_type == OPFORGE_DEVICE_CUDA ? "cuda" : "cpu"; }

}  // namespace opforge::core
