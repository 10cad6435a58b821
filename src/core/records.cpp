// Reading the C ABI records (records.h).
#include "records.h"

#include <cstddef>

namespace opforge::core {

const char* equivalent(const OpforgeOpSpec& op) {
  return OPFORGE_HAS_FIELD(OpforgeOpSpec, op, equivalent) ? op.equivalent : nullptr;
}

int32_t sharding(const OpforgeOpSpec& op) {
  if (!OPFORGE_HAS_FIELD(OpforgeOpSpec, op, sharding)) return OPFORGE_SHARDING_NONE;
  if (op.sharding == OPFORGE_SHARDING_DIMS && !OPFORGE_HAS_FIELD(OpforgeOpSpec, op, sharding_dims))
    return OPFORGE_SHARDING_NONE;
  return op.sharding;
}

uint32_t sharding_dims(const OpforgeOpSpec& op) { return sharding(op) == OPFORGE_SHARDING_DIMS ? op.sharding_dims : 0; }

const char* backward_name(const OpforgeOpSpec& op) {
  return OPFORGE_HAS_FIELD(OpforgeOpSpec, op, backward) ? op.backward : nullptr;
}

int32_t num_rules(const OpforgeOpSpec& op) { return OPFORGE_HAS_FIELD(OpforgeOpSpec, op, rules) ? op.num_rules : 0; }

Span<const OpforgeDtypeCase> dtype_cases(const OpforgeOpSpec& op) {
  if (!OPFORGE_HAS_FIELD(OpforgeOpSpec, op, dtype_cases) || op.dtype_cases == nullptr || op.num_dtype_cases <= 0)
    return {};
  return {op.dtype_cases, static_cast<size_t>(op.num_dtype_cases)};
}

Span<const OpforgeRuleCase> rule_cases(const OpforgeOpSpec& op) {
  if (!OPFORGE_HAS_FIELD(OpforgeOpSpec, op, rule_cases) || op.rule_cases == nullptr || op.num_rule_cases <= 0)
    return {};
  return {op.rule_cases, static_cast<size_t>(op.num_rule_cases)};
}

int32_t autocast_policy(const OpforgeOpSpec& op) {
  return OPFORGE_HAS_FIELD(OpforgeOpSpec, op, autocast) ? op.autocast : OPFORGE_AUTOCAST_NONE;
}

std::vector<OpforgeTolerance> tolerances(const OpforgeOpSpec& op) {
  if (!OPFORGE_HAS_FIELD(OpforgeOpSpec, op, tolerances) || op.tolerances == nullptr || op.num_tolerances <= 0)
    return {};
  return {op.tolerances, op.tolerances + op.num_tolerances};
}

double tolerance_vs_equivalent(const OpforgeOpSpec& op) {
  return OPFORGE_HAS_FIELD(OpforgeOpSpec, op, tolerance_vs_equivalent) ? op.tolerance_vs_equivalent : 0.0;
}

bool mutates_inputs(const OpforgeOpSpec& op) {
  for (int32_t i = 0; i < op.num_args; ++i)
    if (is_mutated(op.args[i])) return true;
  return false;
}

std::vector<int32_t> rule_order(const OpforgeOpSpec& op, uint8_t reads) {
  std::vector<uint8_t> done(static_cast<size_t>(op.num_args), 0);
  std::vector<int32_t> order;
  in_rule_order(op, reads, done.data(), [&](int32_t i) { order.push_back(i); });
  return order;
}

bool has_runtime_source(const OpforgeKernel& k) {
  return OPFORGE_HAS_FIELD(OpforgeKernel, k, precompile) && k.source != nullptr && k.precompile != nullptr;
}

const OpforgeKernel* device_kernel(const OpforgeOpSpec& op, int32_t device_type) {
  if (device_type == OPFORGE_DEVICE_CPU)
    return op.num_kernels > 0 && op.kernels[0].fn != nullptr ? &op.kernels[0] : nullptr;
  for (int32_t k = 1; k < op.num_kernels; ++k)
    if (op.kernels[k].device_type == device_type) return &op.kernels[k];
  return nullptr;
}

std::vector<const OpforgeClassSpec*> library_classes(const OpforgeLibrary& lib) {
  if (!OPFORGE_HAS_FIELD(OpforgeLibrary, lib, classes) || lib.classes == nullptr) return {};
  return {lib.classes, lib.classes + lib.num_classes};
}

const char* kernel_dir(const OpforgeLibrary& lib) {
  return OPFORGE_HAS_FIELD(OpforgeLibrary, lib, kernel_dir) && lib.kernel_dir && *lib.kernel_dir ? lib.kernel_dir
                                                                                                 : nullptr;
}

ReloadFn reload_entry(const OpforgeLibrary& lib) {
  return OPFORGE_HAS_FIELD(OpforgeLibrary, lib, reload) ? lib.reload : nullptr;
}

}  // namespace opforge::core
