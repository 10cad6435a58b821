// Input sizes that satisfy an op's shape rules, for tools that generate inputs (opforge verify,
// benchmarks, fuzzers) without re-implementing the rules.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// A shape for every tensor argument of `op` (empty vectors for parameters) that its rules
/// accept, built from two free sizes: `lead` for the first dim and `last` for the last dim of
/// each tensor whose dims are free, 5 for the dims between (rank: the declared shape's, else
/// the smallest rank >= 2 the rank bounds allow). Dims a shape rule fixes are evaluated from the
/// tensors they read and the parameter `values` (per argument, as in a call); `same_shape` copies
/// its model; a dim declared multiple_of(k), here or on an input that copies this one's shape,
/// is rounded up to a multiple of k (0 stays 0). An input declared shape({leading_dims, ...})
/// gets `leading` leading dims (within its rank bounds; `lead`, then 5s), one declared
/// shape({leading_dims_of("x"), ...}) those of x. Rules that read each
/// other fall back to `lead` for every dim. A rule may still give a size the op refuses (a
/// negative one): the call's own checks report it.
std::vector<std::vector<int64_t>> example_shapes(const OpforgeOpSpec& op, int64_t lead, int64_t last,
                                                 const std::vector<OpforgeValue>& values, int32_t leading = 1);

/// For a call with these shapes (per argument; empty for parameters) and parameter values, with
/// the optional tensor inputs given or (`omit_optional`) left out: the bounds [low, high) of each
/// input with a value domain (nullopt for others), and the op's cross-argument rules that fail
/// (those gated on an optional input's presence where it applies), one line each as a call's
/// check reports them. Tools that generate inputs draw indices within the bounds and pick sizes
/// for which no rule fails.
struct ExampleFacts {
  std::vector<std::optional<std::pair<int64_t, int64_t>>> bounds;
  std::vector<std::string> rule_problems;
};
ExampleFacts example_facts(const OpforgeOpSpec& op, const std::vector<std::vector<int64_t>>& shapes,
                           const std::vector<OpforgeValue>& values, bool omit_optional = false);

}  // namespace opforge::core
