// Dtype combinations of a declaration (see dtypes.h).
#include "dtypes.h"

#include <cmath>
#include <utility>

#include "check.h"
#include "records.h"
#include "schema.h"

namespace opforge::core {
namespace {

void extend(const OpforgeOpSpec& op, int32_t i, std::vector<int32_t>& current, size_t limit,
            std::vector<std::vector<int32_t>>& out) {
  if (out.size() >= limit) return;
  if (i == op.num_args) {
    out.push_back(current);
    return;
  }
  const OpforgeArgSpec& a = op.args[i];
  if (a.kind != OPFORGE_ARG_TENSOR) {
    current[i] = -1;
    extend(op, i + 1, current, limit, out);
    return;
  }
  const OpforgeTensorSpec& s = a.tensor;
  for (int32_t d = 0; d < OPFORGE_NUM_DTYPES; ++d) {
    const bool ok = s.dtype_like < 0 ? dtype_allowed(s, d) : same_dtype_allowed(s, current[s.dtype_like], d);
    if (!ok) continue;
    current[i] = d;
    extend(op, i + 1, current, limit, out);
  }
}

/// The dtype a call's floating dtypes `c` (-1 for non-tensors) promote to, or -1 if none is
/// floating: float64 over float32 over the 16-bit types; float16 with bfloat16 gives float32.
int32_t widest_floating(const std::vector<int32_t>& c) {
  bool f64 = false, f32 = false, f16 = false, bf16 = false;
  for (int32_t d : c) {
    f64 = f64 || d == OPFORGE_DTYPE_FLOAT64;
    f32 = f32 || d == OPFORGE_DTYPE_FLOAT32;
    f16 = f16 || d == OPFORGE_DTYPE_FLOAT16;
    bf16 = bf16 || d == OPFORGE_DTYPE_BFLOAT16;
  }
  if (f64) return OPFORGE_DTYPE_FLOAT64;
  if (f32 || (f16 && bf16)) return OPFORGE_DTYPE_FLOAT32;
  return f16 ? OPFORGE_DTYPE_FLOAT16 : bf16 ? OPFORGE_DTYPE_BFLOAT16 : -1;
}

/// "x=float16, w=float32": the tensor arguments of `op` with their dtypes in `c`.
std::string combination_string(const OpforgeOpSpec& op, const std::vector<int32_t>& c) {
  std::string s;
  for (int32_t i = 0; i < op.num_args; ++i)
    if (c[i] >= 0) s += (s.empty() ? "" : ", ") + std::string(op.args[i].name) + "=" + dtype_name(c[i]);
  return s;
}

}  // namespace

std::vector<std::vector<int32_t>> dtype_combinations(const OpforgeOpSpec& op, size_t limit) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> current(op.num_args, -1);
  extend(op, 0, current, limit, out);
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

/// accepts_floating_as over the given combinations (those of one device's kernel).
bool accepts_floating_as(const OpforgeOpSpec& op, int32_t dtype, const std::vector<std::vector<int32_t>>& combinations) {
  std::vector<bool> floating(op.num_args, false);
  for (const auto& c : combinations)
    for (int32_t i = 0; i < op.num_args; ++i) floating[i] = floating[i] || (c[i] >= 0 && ((kFloating >> c[i]) & 1u));
  for (const auto& c : combinations) {
    bool all = true;
    for (int32_t i = 0; i < op.num_args && all; ++i) all = !floating[i] || c[i] == dtype;
    if (all) return true;
  }
  return false;
}

/// The problem of `op`'s autocast policy with `combinations`, the dtypes of the kernel that
/// `refuser` names ("its dtype rules", "its cuda kernel's dtypes (kernel_dtypes)"); "" if none.
std::string autocast_problem_with(const OpforgeOpSpec& op, const std::vector<std::vector<int32_t>>& combinations,
                                  const std::string& refuser) {
  const int32_t policy = autocast_policy(op);
  const auto takes = [&](int32_t dtype) { return accepts_floating_as(op, dtype, combinations); };
  if (policy == OPFORGE_AUTOCAST_FLOAT32 && !takes(OPFORGE_DTYPE_FLOAT32))
    return declared_at(op) + "autocast(kFloat32) casts every floating input to float32, which " + refuser + " refuse";
  if (policy == OPFORGE_AUTOCAST_LOWER_PRECISION && !takes(OPFORGE_DTYPE_FLOAT16) && !takes(OPFORGE_DTYPE_BFLOAT16))
    return declared_at(op) + "autocast(kLowerPrecision) casts every floating input to float16 or bfloat16, which " +
           refuser + " refuse";
  if (policy == OPFORGE_AUTOCAST_PROMOTE) {
    // Each call's floating inputs are cast to the widest among them (torch.promote_types:
    // float16 with bfloat16 gives float32), which the op must then take for all of them.
    std::vector<int32_t> accepted(OPFORGE_NUM_DTYPES, -1);  // -1 not asked yet, 0 refused, 1 taken
    for (const auto& c : combinations) {
      const int32_t widest = widest_floating(c);
      if (widest < 0) continue;
      if (accepted[widest] < 0) accepted[widest] = takes(widest) ? 1 : 0;
      if (accepted[widest] == 0)
        return declared_at(op) + "autocast(kPromote) casts every floating input to the widest among them, " +
               dtype_name(widest) + " for inputs of " + combination_string(op, c) + ", which " + refuser + " refuse";
    }
  }
  return {};
}

}  // namespace

bool accepts_floating_as(const OpforgeOpSpec& op, int32_t dtype) {
  return accepts_floating_as(op, dtype, dtype_combinations(op, size_t{1} << 16));
}

std::vector<std::string> tolerance_problems(const OpforgeOpSpec& op) {
  std::vector<std::string> problems;
  std::vector<bool> seen(OPFORGE_NUM_DTYPES, false);
  for (const OpforgeTolerance& t : tolerances(op)) {
    const bool known = t.dtype >= 0 && t.dtype < OPFORGE_NUM_DTYPES;
    const std::string name = known ? dtype_name(t.dtype) : "dtype " + std::to_string(t.dtype);
    if (!known || !((kFloating >> t.dtype) & 1u))
      problems.push_back(declared_at(op) + "tolerance for " + name + ": expected a floating dtype");
    else if (seen[t.dtype]) problems.push_back(declared_at(op) + "tolerance for " + name + " declared twice");
    else seen[t.dtype] = true;
    for (const auto& [what, value] : {std::pair{"atol", t.atol}, std::pair{"rtol", t.rtol}})
      if (!(std::isfinite(value) && value >= 0))
        problems.push_back(declared_at(op) + "tolerance for " + name + ": expected " + what + " finite and >= 0, got " +
                           std::to_string(value));
  }
  // A factor of 0 bounds the error by 0: the same as declaring none.
  const double factor = tolerance_vs_equivalent(op);
  if (!(std::isfinite(factor) && factor >= 0))
    problems.push_back(declared_at(op) + "tolerance_vs_equivalent: expected a finite factor >= 0, got " +
                       std::to_string(factor));
  else if (factor > 0 && equivalent(op) == nullptr)
    problems.push_back(declared_at(op) +
                       "tolerance_vs_equivalent needs the .equivalent() torch expression it is "
                       "measured against");
  return problems;
}

std::string autocast_problem(const OpforgeOpSpec& op) {
  const int32_t policy = autocast_policy(op);
  if (policy < OPFORGE_AUTOCAST_NONE || policy > OPFORGE_AUTOCAST_PROMOTE)
    return declared_at(op) + "autocast policy " + std::to_string(policy) +
           " is not one of kNone, kFloat32, kLowerPrecision, kPromote";
  if (policy == OPFORGE_AUTOCAST_NONE) return {};
  std::string problem = autocast_problem_with(op, dtype_combinations(op, size_t{1} << 16), "its dtype rules");
  // Autocast on CUDA casts for the CUDA kernel, which may take fewer dtypes (Note [Kernel dtypes]).
  const OpforgeKernel* cuda = device_kernel(op, OPFORGE_DEVICE_CUDA);
  if (problem.empty() && cuda != nullptr && restricts_dtypes(*cuda))
    problem = autocast_problem_with(op, dtype_combinations_on(op, OPFORGE_DEVICE_CUDA, size_t{1} << 16),
                                    "its cuda kernel's dtypes (kernel_dtypes)");
  return problem;
}

}  // namespace opforge::core
