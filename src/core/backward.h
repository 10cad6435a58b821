// Backward ops: how an op's values reach the op that computes its input gradients (Note
// [Backward ops] in opforge/op_builder.h), matched by argument names, and the load-time check.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// How an op's values reach the backward op it names, matched by argument names.
struct BackwardPlan {
  enum class Source { kGrad, kArg, kOutput };
  /// Per argument of the backward op, in schema order: the gradient of forward result `index`
  /// (kGrad), forward argument `index`, tensor or parameter (kArg), or forward result `index`
  /// (kOutput). An op's results (result_names) are its outputs, then its mutated inputs' values
  /// after the op, in argument order; autograd sees them in that order.
  std::vector<std::pair<Source, int32_t>> sources;
  /// Per output of the backward op: the indices of the forward arguments it is the gradient of
  /// (one, or several for `grad_<a>_and_<b>`).
  std::vector<std::vector<int32_t>> targets;
  /// Per output of the backward op: its name, for messages.
  std::vector<std::string> output_names;
  /// Per forward result (result_names' order): whether the backward op takes its gradient
  /// (`grad_<result>`). A result whose gradient it does not take is not differentiable, as an
  /// output marked `output_differentiability: False` in torch's derivatives.yaml (the
  /// logsumexp of _scaled_dot_product_flash_attention): autograd records no history for it,
  /// so a loss through it alone raises instead of getting a gradient that was silently dropped.
  std::vector<bool> differentiable;
};

/// The names of `op`'s results as a backward op sees them: its outputs, then `<input>_out` for
/// each mutated input (its value after the op), in argument order.
std::vector<std::string> result_names(const OpforgeOpSpec& op);

/// Matches `bwd`'s arguments and outputs to `fwd` by name: an argument `grad_<result>` or named
/// like an argument or result of `fwd` (a mutated input only as `<input>_out`: its value before
/// the op is overwritten); outputs `grad_<tensor argument>`, the gradient of the argument as given,
/// or `grad_<a>_and_<b>...`, the one gradient of several (distinct) tensor arguments. Returns the plan,
/// or appends one line per mismatch to `problems` ("file:line: ns::fwd: backward op ns::bwd: ...", naming the argument
/// and what it may be called) and returns an empty plan.
BackwardPlan plan_backward(const OpforgeOpSpec& fwd, const OpforgeOpSpec& bwd, std::vector<std::string>& problems);

/// True if another op of `lib` names `op` as its backward op.
bool is_backward_op(const OpforgeLibrary& lib, const OpforgeOpSpec& op);

/// The op of `lib` called `qualified` ("ns::name"), or nullptr.
const OpforgeOpSpec* find_op(const OpforgeLibrary& lib, const std::string& qualified);

/// Every problem with the backward ops `lib`'s ops name, one line each (empty if none): a
/// backward op the library does not declare, or names that do not match (plan_backward).
std::vector<std::string> check_backward_ops(const OpforgeLibrary& lib);

}  // namespace opforge::core
