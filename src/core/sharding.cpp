// Sharding rules derived from declarations (see sharding.h).
#include "sharding.h"

#include "check.h"
#include "records.h"
#include "schema.h"

namespace opforge::core {

std::map<int32_t, int64_t> multiple_of_dims(const OpforgeArgSpec& a) {
  std::map<int32_t, int64_t> out;
  if (a.kind != OPFORGE_ARG_TENSOR) return out;
  const int32_t from = a.tensor.leading_dims ? -a.tensor.num_dims : 0;  // leading dims: counted from the end
  for (int32_t d = 0; d < a.tensor.num_dims; ++d)
    if (is_multiple_of(a.tensor.dims[d])) out[from + d] = a.tensor.dims[d].nodes[0].value;
  return out;
}

std::vector<int32_t> unshardable_dims(const OpforgeOpSpec& op) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < op.num_args; ++i)
    for (const auto& [d, k] : multiple_of_dims(op.args[i])) {
      const int32_t from_end = d < 0 ? d : d - op.args[i].tensor.num_dims;
      bool seen = false;
      for (int32_t e : out) seen = seen || e == from_end;
      if (!seen) out.push_back(from_end);
    }
  return out;
}

std::map<int32_t, std::map<int32_t, int32_t>> follow_dims(const OpforgeOpSpec& op) {
  std::map<int32_t, std::map<int32_t, int32_t>> maps;
  if (sharding(op) != OPFORGE_SHARDING_DIMS) return maps;
  int32_t first = -1;
  for (int32_t i = 0; i < op.num_args && first < 0; ++i)
    if (op.args[i].kind == OPFORGE_ARG_TENSOR) first = i;
  if (first < 0) return maps;
  const OpforgeTensorSpec& lead = op.args[first].tensor;
  const int32_t rank = lead.num_dims > 0 ? lead.num_dims : lead.min_rank == lead.max_rank ? lead.max_rank : -1;
  const uint32_t dims = sharding_dims(op);
  for (int32_t d = 0; d < 32; ++d)
    if (dims >> d & 1u) maps[first][d] = d;
  for (int32_t i : rule_order(op, kReadsSizes)) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind != OPFORGE_ARG_TENSOR || i == first) continue;
    auto& map = maps[i];
    if (a.tensor.shape_like >= 0) {  // an input before it in rule order, whose map is complete
      map = maps[a.tensor.shape_like];
      continue;
    }
    if (a.tensor.leading_dims) continue;  // its rank varies: replicated
    for (int32_t j = 0; j < a.tensor.num_dims; ++j) {
      const OpforgeExpr& e = a.tensor.dims[j];
      if (e.num_nodes != 1 || e.nodes[0].op != OPFORGE_EXPR_DIM || e.nodes[0].arg != first) continue;
      const int64_t d = e.nodes[0].value;
      if (d >= 0) map[static_cast<int32_t>(d)] = j;
      else if (rank >= 0) map[static_cast<int32_t>(d + rank)] = j;
    }
  }
  return maps;
}

namespace {
/// Whether expression `e` reads a dim of argument `arg` counted from the front (d >= 0).
bool reads_front_dim(const OpforgeExpr& e, int32_t arg) {
  for (int32_t k = 0; k < e.num_nodes; ++k)
    if (e.nodes[k].op == OPFORGE_EXPR_DIM && e.nodes[k].arg == arg && e.nodes[k].value >= 0) return true;
  return false;
}
}  // namespace

std::vector<int32_t> batchable_args(const OpforgeOpSpec& op) {
  const int32_t kind = sharding(op);
  if ((kind != OPFORGE_SHARDING_POINTWISE && kind != OPFORGE_SHARDING_ROWWISE) || mutates_inputs(op)) return {};
  int32_t first = -1;
  for (int32_t i = 0; i < op.num_args && first < 0; ++i)
    if (op.args[i].kind == OPFORGE_ARG_TENSOR) first = i;
  if (first < 0) return {};
  const OpforgeTensorSpec& f = op.args[first].tensor;
  if ((f.num_dims > 0 && !f.leading_dims) || f.max_rank >= 0) return {};
  bool front = false;
  for (int32_t i = 0; i < op.num_args; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR) continue;
    const OpforgeTensorSpec& t = op.args[i].tensor;
    for (int32_t d = 0; d < t.num_dims; ++d) front = front || reads_front_dim(t.dims[d], first);
    if (t.has_values) front = front || reads_front_dim(t.values_low, first) || reads_front_dim(t.values_high, first);
  }
  for (int32_t k = 0; k < num_rules(op); ++k)
    front = front || reads_front_dim(op.rules[k].lhs, first) || reads_front_dim(op.rules[k].rhs, first);
  for (int32_t k = 0; k < op.num_outputs; ++k) {
    const OpforgeOutputSpec& o = op.outputs[k];
    if (o.shape_like != first || o.size_from >= 0) return {};
    for (int32_t d = 0; d < o.num_dims; ++d) front = front || o.dim_index[d] >= 0 || reads_front_dim(o.dims[d], first);
  }
  if (front || op.num_outputs == 0) return {};
  std::vector<int32_t> out = {first};
  for (int32_t i = first + 1; i < op.num_args; ++i)
    if (op.args[i].kind == OPFORGE_ARG_TENSOR && op.args[i].tensor.shape_like == first) out.push_back(i);
  return out;
}

}  // namespace opforge::core
