// Dtype combinations of a declaration (see dtypes.h).
#include "dtypes.h"

#include "check.h"

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

}  // namespace

std::vector<std::vector<int32_t>> dtype_combinations(const OpforgeOpSpec& op, size_t limit) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> current(op.num_args, -1);
  extend(op, 0, current, limit, out);
  return out;
}

}  // namespace opforge::core
