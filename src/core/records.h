// Reading the C ABI records (opforge/c_api.h): every accessor of a field that a record may lack
// (one appended after its struct's first version, read only where OPFORGE_HAS_FIELD says the
// record carries it: Note [ABI versioning]), and the facts read off one record that every
// reader asks. A reader reads such a field through these, never directly.
#pragma once

#include <cstdint>
#include <vector>

#include "opforge/c_api.h"
#include "span.h"

namespace opforge::core {

// ---- an op ------------------------------------------------------------------------------------

/// The op's equivalent torch expression (OpforgeOpSpec::equivalent), or nullptr.
const char* equivalent(const OpforgeOpSpec& op);

/// The op's sharding kind (OpforgeSharding) and, for OPFORGE_SHARDING_DIMS, its dims bit set;
/// OPFORGE_SHARDING_NONE for records without the fields.
int32_t sharding(const OpforgeOpSpec& op);
uint32_t sharding_dims(const OpforgeOpSpec& op);

/// The backward op `op` names ("ns::name"), if it has one and its record carries the field,
/// else nullptr.
const char* backward_name(const OpforgeOpSpec& op);

/// The op's cross-argument rules (OpforgeOpSpec::rules), 0 for records without the field.
int32_t num_rules(const OpforgeOpSpec& op);

/// The op's dtype rules that follow a parameter (OpforgeOpSpec::dtype_cases), none for records
/// without the field.
Span<const OpforgeDtypeCase> dtype_cases(const OpforgeOpSpec& op);

/// The op's shape rules and output dtype rules that follow a parameter (OpforgeOpSpec::rule_cases),
/// none for records without the field.
Span<const OpforgeRuleCase> rule_cases(const OpforgeOpSpec& op);

/// The op's autocast policy (OpforgeAutocast; NONE for records without the field).
int32_t autocast_policy(const OpforgeOpSpec& op);

/// The tolerances opforge verify compares the op's results with (OpforgeOpSpec::tolerances),
/// none for records without the field.
std::vector<OpforgeTolerance> tolerances(const OpforgeOpSpec& op);

/// The factor of OpforgeOpSpec::tolerance_vs_equivalent, 0 when not declared or for records
/// without the field.
double tolerance_vs_equivalent(const OpforgeOpSpec& op);

// ---- its arguments ----------------------------------------------------------------------------

/// True if `a` is a tensor argument the caller may leave out (`Tensor? name=None`). (The
/// field needs no OPFORGE_HAS_FIELD: OpforgeTensorSpec is embedded in OpforgeArgSpec, so it
/// grows only with OPFORGE_ABI_VERSION, which loading checks.)
inline bool is_optional(const OpforgeArgSpec& a) { return a.kind == OPFORGE_ARG_TENSOR && a.tensor.optional != 0; }

/// True if `a` is a tensor argument the kernel writes in place (`Tensor(a!) name`).
inline bool is_mutated(const OpforgeArgSpec& a) { return a.kind == OPFORGE_ARG_TENSOR && a.tensor.mutated != 0; }

/// True if the op writes any of its inputs.
bool mutates_inputs(const OpforgeOpSpec& op);

/// What an argument's rules read of another tensor: its dtype (same_dtype) or its sizes
/// (same_shape, leading_dims_of, the dims a shape rule reads).
enum RuleReads : uint8_t { kReadsDtype = 1, kReadsSizes = 2 };

/// Calls `f(j)` for each tensor argument `j` whose dtype or sizes (as `reads` selects) the
/// constraints of argument `a` read (possibly `j` more than once). A value domain's bounds are not
/// among them: values are checked after every shape. A call checks `a` after every such `j`, and
/// loading refuses rules that read each other's dtypes, or each other's sizes, in a cycle (Note
/// [Shape expressions] in opforge/expr.h).
template <class F>
void for_each_read(const OpforgeOpSpec& op, int32_t i, uint8_t reads, F&& f) {
  const OpforgeArgSpec& a = op.args[i];
  if (a.kind != OPFORGE_ARG_TENSOR) return;
  const OpforgeTensorSpec& t = a.tensor;
  if ((reads & kReadsDtype) && t.dtype_like >= 0) f(t.dtype_like);
  if (!(reads & kReadsSizes)) return;
  if (t.shape_like >= 0) f(t.shape_like);
  if (t.leading_dims && t.leading_like >= 0) f(t.leading_like);
  auto dims = [&](int32_t n, const OpforgeExpr* es) {
    for (int32_t d = 0; d < n; ++d)
      for (int32_t k = 0; k < es[d].num_nodes; ++k)
        if (es[d].nodes[k].op == OPFORGE_EXPR_DIM && es[d].nodes[k].arg >= 0) f(es[d].nodes[k].arg);
  };
  dims(t.num_dims, t.dims);
  for (const OpforgeRuleCase& c : rule_cases(op))  // the shapes a parameter's values select
    if (c.arg == i && c.has_shape) dims(c.num_dims, c.dims);
}

/// Calls `f(i)` once for each argument of `op`, each after the tensors whose dtype or sizes (as
/// `reads` selects) its rules read (for_each_read): in declaration order, an argument that reads a
/// later one waits for a later round. `done` is the caller's scratch of op.num_args zeros (no
/// allocation: calls check in this order). Arguments left waiting (a cycle, which loading refuses,
/// or dtype and size rules that wait on each other), come last in declaration order.
template <class F>
void in_rule_order(const OpforgeOpSpec& op, uint8_t reads, uint8_t* done, F&& f) {
  for (int32_t round = 0, pending = op.num_args; pending > 0 && round <= op.num_args; ++round) {
    for (int32_t i = 0; i < op.num_args; ++i) {
      if (done[i]) continue;
      bool ready = true;
      for_each_read(op, i, reads, [&](int32_t j) { ready = ready && (j == i || done[j]); });
      if (!ready) continue;
      done[i] = 1;
      --pending;
      f(i);
    }
  }
  for (int32_t i = 0; i < op.num_args; ++i)
    if (!done[i]) done[i] = 1, f(i);
}

/// The arguments of `op` in the order in_rule_order visits them.
std::vector<int32_t> rule_order(const OpforgeOpSpec& op, uint8_t reads);

// ---- its kernels ------------------------------------------------------------------------------

/// True if `k` is a run-time kernel (a source compiled at run time) of a library whose ABI
/// carries those fields.
bool has_runtime_source(const OpforgeKernel& k);

/// The kernel a call on `device_type` (OpforgeDeviceType) runs: the CPU reference for
/// OPFORGE_DEVICE_CPU, else the op's first kernel for that device; null if it has none. Every
/// adapter picks through this, so they agree on which kernel runs.
const OpforgeKernel* device_kernel(const OpforgeOpSpec& op, int32_t device_type);

/// Whether kernel `k` declares the dtypes it takes for one argument (Note [Kernel dtypes] in
/// opforge/op.h): a dtype_arg and a non-empty set.
inline bool restricts_dtypes(const OpforgeKernel& k) { return k.dtype_arg >= 0 && k.dtypes != 0; }

/// Whether kernel `k` takes `dtype` (OpforgeDtype) for tensor argument `arg`: true unless `k`
/// declares a dtype set for `arg` without it.
inline bool kernel_takes(const OpforgeKernel& k, int32_t arg, int32_t dtype) {
  return !restricts_dtypes(k) || k.dtype_arg != arg || (dtype >= 0 && ((k.dtypes >> dtype) & 1u));
}

// ---- a library --------------------------------------------------------------------------------

/// The library's classes; none for a record without OpforgeLibrary::classes.
std::vector<const OpforgeClassSpec*> library_classes(const OpforgeLibrary& lib);

/// The folder the library's run-time kernel sources are read from; nullptr for a record without
/// the field or an empty one.
const char* kernel_dir(const OpforgeLibrary& lib);

/// The library's OpforgeLibrary::reload, or nullptr for a record without the field or none.
using ReloadFn = void (*)(void);
ReloadFn reload_entry(const OpforgeLibrary& lib);

}  // namespace opforge::core
