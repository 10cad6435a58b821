// Dtype combinations of a declaration (see dtypes.h).
#include "dtypes.h"

#include <utility>

#include "check.h"
#include "records.h"
#include "schema.h"

namespace opforge::core {
namespace {

/// Extends `current` from the `k`th argument of `order` (rule_order: a same_dtype model comes
/// before the inputs that name it).
void extend(const OpforgeOpSpec& op, const std::vector<int32_t>& order, size_t k, std::vector<int32_t>& current,
            size_t limit, std::vector<std::vector<int32_t>>& out) {
  if (out.size() >= limit) return;
  if (k == order.size()) {
    out.push_back(current);
    return;
  }
  const int32_t i = order[k];
  const OpforgeArgSpec& a = op.args[i];
  if (a.kind != OPFORGE_ARG_TENSOR) {
    current[i] = -1;
    extend(op, order, k + 1, current, limit, out);
    return;
  }
  const OpforgeTensorSpec& s = a.tensor;
  for (int32_t d = 0; d < OPFORGE_NUM_DTYPES; ++d) {
    const bool ok = s.dtype_like < 0 ? dtype_allowed(s, d) : same_dtype_allowed(s, current[s.dtype_like], d);
    if (!ok) continue;
    current[i] = d;
    extend(op, order, k + 1, current, limit, out);
  }
}

}  // namespace

std::vector<std::vector<int32_t>> dtype_combinations(const OpforgeOpSpec& op, size_t limit) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> current(op.num_args, -1);
  extend(op, rule_order(op, kReadsDtype), 0, current, limit, out);
  return out;
}

std::vector<std::vector<int32_t>> dtype_combinations_on(const OpforgeOpSpec& op, int32_t device_type, size_t limit) {
  const OpforgeKernel* k = device_kernel(op, device_type);
  if (k == nullptr) return {};
  if (!restricts_dtypes(*k)) return dtype_combinations(op, limit);
  std::vector<std::vector<int32_t>> out;
  for (auto& c : dtype_combinations(op, size_t{1} << 16)) {
    if (out.size() >= limit) break;
    if (kernel_takes(*k, k->dtype_arg, c[k->dtype_arg])) out.push_back(std::move(c));
  }
  return out;
}

namespace {

/// The floating dtypes, as bits (1 << OpforgeDtype).
constexpr uint32_t kFloating = (1u << OPFORGE_DTYPE_FLOAT32) | (1u << OPFORGE_DTYPE_FLOAT64) |
                               (1u << OPFORGE_DTYPE_FLOAT16) | (1u << OPFORGE_DTYPE_BFLOAT16);

}  // namespace

bool is_floating(int32_t dtype) { return dtype >= 0 && dtype < OPFORGE_NUM_DTYPES && ((kFloating >> dtype) & 1u); }

bool is_float8(int32_t dtype) {
  return dtype == OPFORGE_DTYPE_FLOAT8_E4M3FN || dtype == OPFORGE_DTYPE_FLOAT8_E5M2 ||
         dtype == OPFORGE_DTYPE_FLOAT8_E8M0FNU;
}

uint32_t admitted_dtypes(const OpforgeOpSpec& op, int32_t arg) {
  // Follows same_dtype from `arg` to the input that names none; a cycle (refused at load) admits none.
  int32_t model = arg;
  for (int32_t steps = 0; op.args[model].tensor.dtype_like >= 0; ++steps) {
    if (steps == op.num_args) return 0;
    model = op.args[model].tensor.dtype_like;
  }
  const OpforgeTensorSpec& s = op.args[arg].tensor;
  if (s.dtype_like < 0) return s.dtypes;
  const uint32_t models = admitted_dtypes(op, s.dtype_like);
  uint32_t out = 0;
  for (int32_t m = 0; m < OPFORGE_NUM_DTYPES; ++m) {
    if (!((models >> m) & 1u)) continue;
    for (int32_t d = 0; d < OPFORGE_NUM_DTYPES; ++d)
      if (same_dtype_allowed(s, m, d)) out |= 1u << d;
  }
  return out;
}

bool accepts_floating_as(const OpforgeOpSpec& op, int32_t dtype,
                         const std::vector<std::vector<int32_t>>& combinations) {
  std::vector<bool> floating(op.num_args, false);
  for (const auto& c : combinations)
    for (int32_t i = 0; i < op.num_args; ++i) floating[i] = floating[i] || is_floating(c[i]);
  for (const auto& c : combinations) {
    bool all = true;
    for (int32_t i = 0; i < op.num_args && all; ++i) all = !floating[i] || c[i] == dtype;
    if (all) return true;
  }
  return false;
}

bool accepts_floating_as(const OpforgeOpSpec& op, int32_t dtype) {
  return accepts_floating_as(op, dtype, dtype_combinations(op, size_t{1} << 16));
}

int32_t promoted_floating(const std::vector<int32_t>& combination) {
  bool f64 = false, f32 = false, f16 = false, bf16 = false;
  for (int32_t d : combination) {
    f64 = f64 || d == OPFORGE_DTYPE_FLOAT64;
    f32 = f32 || d == OPFORGE_DTYPE_FLOAT32;
    f16 = f16 || d == OPFORGE_DTYPE_FLOAT16;
    bf16 = bf16 || d == OPFORGE_DTYPE_BFLOAT16;
  }
  if (f64) return OPFORGE_DTYPE_FLOAT64;
  if (f32 || (f16 && bf16)) return OPFORGE_DTYPE_FLOAT32;
  return f16 ? OPFORGE_DTYPE_FLOAT16 : bf16 ? OPFORGE_DTYPE_BFLOAT16 : -1;
}

}  // namespace opforge::core
