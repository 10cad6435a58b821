// How a sharded-tensor framework may split an op's work, derived from its declaration (see
// opforge::Sharding and opforge::shard_dims in opforge/op_builder.h). Adapters turn these into their
// framework's rules (torch.distributed.tensor strategies, JAX shardings).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// {dim: k} for each dim of tensor argument `a` declared opforge::multiple_of(k); dims of an input
/// declared shape({opforge::leading_dims, ...}) are counted from the end (-1 is the last).
std::map<int32_t, int64_t> multiple_of_dims(const OpforgeArgSpec& a);

/// Dims, counted from the end (-1 is the last), that some tensor input declares
/// opforge::multiple_of(k): a shard of such a dim need not be a multiple of k, so pointwise and
/// rowwise rules never shard it (inputs align from the right, as pointwise inputs do).
std::vector<int32_t> unshardable_dims(const OpforgeOpSpec& op);

/// For an op of sharding OPFORGE_SHARDING_DIMS, per argument index: {dim d of the first tensor
/// input: this argument's dim that is sharded with it}. The first tensor input maps each of
/// its sharding dims to itself; another input follows where its shape rule declares a dim
/// `dim(first, d)` (a negative d counts from the end of the first input, whose rank must then
/// be fixed), or through `same_shape` of an input that follows; every other dim is replicated.
/// Empty maps for other sharding kinds.
std::map<int32_t, std::map<int32_t, int32_t>> follow_dims(const OpforgeOpSpec& op);

/// The tensor arguments a batching transform (torch.func.vmap, jax.vmap) may give one more
/// leading dim, the batch, so that one call computes every batch element: for a pointwise or
/// rowwise op whose first tensor input has a free rank (no fixed shape; shape({leading_dims,
/// ...}) or rank bounds without a maximum), whose outputs are all like() that input with only
/// last dims replaced (negative with_dim), which writes no input, and whose rules read that input's
/// dims only from the end: the first tensor input and the inputs declared same_shape of it
/// (batched alike, or broadcast to the batch). Lower-rank inputs (a bias) are shared by every
/// batch element and must not be batched. Empty for any other op: batching then calls the op once
/// per batch element.
std::vector<int32_t> batchable_args(const OpforgeOpSpec& op);

}  // namespace opforge::core
