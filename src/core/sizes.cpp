// Example input sizes from the shape rules (see sizes.h).
#include "sizes.h"

#include <map>
#include <numeric>

#include "check.h"
#include "sharding.h"

namespace opforge::core {
namespace {

int32_t example_rank(const OpforgeTensorSpec& t, int32_t leading) {
  if (t.num_dims > 0 && !t.leading_dims) return t.num_dims;
  const int32_t rank =
      t.leading_dims ? std::max(t.min_rank, t.num_dims + leading) : std::max(std::max(t.min_rank, 1), 2);
  return t.max_rank >= 0 ? std::min(rank, t.max_rank) : rank;
}

int64_t round_up(int64_t size, int64_t k) { return size > 0 ? (size + k - 1) / k * k : size; }

/// Per tensor argument, the factor each dim must be a multiple of: its own multiple_of rules and
/// those of the inputs declared same_shape of it (whose shapes are copies of its own).
std::vector<std::map<int32_t, int64_t>> factors(const OpforgeOpSpec& op) {
  std::vector<std::map<int32_t, int64_t>> out(op.num_args);
  for (int32_t i = 0; i < op.num_args; ++i) {
    for (const auto& [d, k] : multiple_of_dims(op.args[i])) {
      for (int32_t j = i, steps = 0; j >= 0 && steps <= op.num_args; j = op.args[j].tensor.shape_like, ++steps) {
        int64_t& f = out[j][d];
        f = f ? std::lcm(f, k) : k;
      }
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> example_shapes(const OpforgeOpSpec& op, int64_t lead, int64_t last,
                                                 const std::vector<OpforgeValue>& values, int32_t leading) {
  const auto factor = factors(op);
  // multiple_of_dims counts a leading-dims input's dims from the end (negative).
  auto multiple = [&](int32_t i, int32_t d, int32_t rank, int64_t size) {
    auto it = factor[i].find(d);
    if (it == factor[i].end()) it = factor[i].find(d - rank);
    return it == factor[i].end() ? size : round_up(size, it->second);
  };
  std::vector<ArgInfo<int64_t>> info(op.num_args);
  std::vector<std::vector<int64_t>> shapes(op.num_args);  // what info[i].sizes views, once done[i]
  std::vector<bool> done(op.num_args, false);
  for (int32_t i = 0; i < op.num_args; ++i) {
    info[i].value = i < static_cast<int32_t>(values.size()) ? values[i] : OpforgeValue{};
    done[i] = op.args[i].kind != OPFORGE_ARG_TENSOR;
  }
  // Each input's shape rule as the parameter values select it (Note [Rules that follow a parameter]).
  std::vector<OpforgeTensorSpec> spec(op.num_args);
  for (int32_t i = 0; i < op.num_args; ++i)
    spec[i] =
        ruled_shape(op, i, op.args[i].tensor, [&](int32_t p) { return param_value_text(op.args[p], info[p].value); });
  for (int32_t round = 0; round <= op.num_args; ++round) {
    for (int32_t i = 0; i < op.num_args; ++i) {
      if (done[i]) continue;
      const OpforgeTensorSpec& t = spec[i];
      const bool tied = t.leading_dims && t.leading_like >= 0;  // leading_dims_of: the model's leading dims
      if (tied && !done[t.leading_like]) continue;
      const std::vector<int64_t>* model = tied ? &shapes[t.leading_like] : nullptr;
      const int32_t rank =
          tied ? std::max<int32_t>(0, static_cast<int32_t>(model->size()) - op.args[t.leading_like].tensor.num_dims) +
                     t.num_dims
               : example_rank(t, leading);
      std::vector<int64_t> free;
      if (rank >= 2) {
        free.push_back(lead);
        free.insert(free.end(), rank - 2, 5);
        free.push_back(last);
      } else {
        free.assign(rank, last);
      }
      for (int32_t d = 0; d < rank; ++d) free[d] = multiple(i, d, rank, free[d]);
      if (t.shape_like >= 0) {
        if (done[t.shape_like]) shapes[i] = shapes[t.shape_like], info[i].sizes = shapes[i], done[i] = true;
        continue;
      }
      if (t.num_dims == 0) {
        shapes[i] = free, info[i].sizes = shapes[i], done[i] = true;
        continue;
      }
      std::vector<int64_t> dims(rank);
      bool complete = true;
      const int32_t at = first_ruled_dim(t, rank);
      for (int32_t d = 0; d < rank && complete; ++d) {
        if (d < at) {  // a leading dim
          dims[d] = model ? (*model)[d] : free[d];
          continue;
        }
        const OpforgeExpr& e = t.dims[d - at];
        if (e.num_nodes == 0 || is_multiple_of(e)) {
          dims[d] = free[d];
        } else if (auto v = eval_expr<int64_t>(e, info)) {
          dims[d] = *v;
        } else {
          complete = false;
        }
      }
      if (complete) shapes[i] = dims, info[i].sizes = shapes[i], done[i] = true;
    }
  }
  for (int32_t i = 0; i < op.num_args; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || done[i]) continue;
    const int32_t rank = example_rank(spec[i], leading);
    for (int32_t d = 0; d < rank; ++d) shapes[i].push_back(multiple(i, d, rank, lead));
  }
  return shapes;
}

ExampleFacts example_facts(const OpforgeOpSpec& op, const std::vector<std::vector<int64_t>>& shapes,
                           const std::vector<OpforgeValue>& values, bool omit_optional) {
  std::vector<ArgInfo<int64_t>> info(op.num_args);
  for (int32_t i = 0; i < op.num_args; ++i) {
    info[i].value = i < static_cast<int32_t>(values.size()) ? values[i] : OpforgeValue{};
    if (i < static_cast<int32_t>(shapes.size())) info[i].sizes = shapes[i];
    info[i].defined = !(omit_optional && is_optional(op.args[i]));
  }
  ExampleFacts facts;
  facts.bounds.resize(op.num_args);
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeTensorSpec& s = op.args[i].tensor;
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || !s.has_values) continue;
    const auto low = eval_expr<int64_t>(s.values_low, info), high = eval_expr<int64_t>(s.values_high, info);
    if (low && high) facts.bounds[i] = std::make_pair(*low, *high);
  }
  rule_problems<int64_t>(op, info, facts.rule_problems, [](const OpforgeExpr&) { return false; });
  return facts;
}

}  // namespace opforge::core
