// Rules that follow a parameter's value (Note [Rules that follow a parameter] in
// opforge/op_constraints.h): which dtype or shape rule an input, and which shape or dtype rule an
// output, follows for a parameter value, read off the record's OpforgeDtypeCase and
// OpforgeRuleCase entries for the call checks, output shapes, precompile requests, the
// combinations verify draws from, and the description.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/c_api.h"
#include "records.h"

namespace opforge::core {

/// The parameter (argument index) whose value tensor argument `arg`'s dtype rule follows, or -1
/// for an input with one rule.
int32_t ruling_param(const OpforgeOpSpec& op, int32_t arg);

/// Value `v` of parameter `a` as OpforgeDtypeCase::value spells it: a string as is, an int in
/// decimal, a bool "true" or "false".
std::string param_value_text(const OpforgeArgSpec& a, const OpforgeValue& v);

/// Value `v` of parameter `a` as messages show it: "kv_cache_dtype is 'fp8'" (strings quoted,
/// as parameter choices are in messages).
std::string param_value_phrase(const OpforgeArgSpec& a, const OpforgeValue& v);

/// The dtype rule tensor argument `arg` follows where its ruling parameter's value is spelled
/// `value` (param_value_text): the argument's OpforgeTensorSpec with dtypes, dtype_like and
/// dtype_alternatives taken from the case that names the value, unchanged where none does.
OpforgeTensorSpec ruled_spec(const OpforgeOpSpec& op, int32_t arg, const std::string& value);

/// The parameter whose value selects tensor input `arg`'s shape rule, or -1 for an input with one.
int32_t shape_ruling_param(const OpforgeOpSpec& op, int32_t arg);

/// The parameter whose value selects output `k`'s shape rule (`dtype` false) or dtype rule
/// (`dtype` true), or -1 for an output with one.
int32_t output_ruling_param(const OpforgeOpSpec& op, int32_t k, bool dtype);

/// Tensor input `arg`'s spec `s` with the shape rule of the case that names its ruling
/// parameter's value (`value_of(param)`, spelled as param_value_text): num_dims, dims,
/// leading_dims and the rank bounds they imply; unchanged where no case does.
template <class ValueOf>
OpforgeTensorSpec ruled_shape(const OpforgeOpSpec& op, int32_t arg, OpforgeTensorSpec s, ValueOf&& value_of) {
  for (const OpforgeRuleCase& c : rule_cases(op)) {
    if (c.arg != arg || !c.has_shape || value_of(c.param) != c.value) continue;
    s.num_dims = c.num_dims;
    s.dims = c.dims;
    s.leading_dims = c.leading_dims;
    s.leading_like = -1;
    s.min_rank = c.num_dims;
    s.max_rank = c.leading_dims ? -1 : c.num_dims;
  }
  return s;
}

/// Output `k`'s spec with the shape and dtype rules of the cases that name their ruling
/// parameters' values (`value_of(param)`, spelled as param_value_text); unchanged where none do.
template <class ValueOf>
OpforgeOutputSpec ruled_output(const OpforgeOpSpec& op, int32_t k, ValueOf&& value_of) {
  OpforgeOutputSpec o = op.outputs[k];
  for (const OpforgeRuleCase& c : rule_cases(op)) {
    if (c.output != k || value_of(c.param) != c.value) continue;
    if (c.has_shape) {
      o.shape_like = -1;
      o.num_dims = c.num_dims;
      o.dims = c.dims;
      o.dim_index = nullptr;
    }
    if (c.has_dtype) {
      o.dtype_like = c.dtype_like;
      o.dtype = c.dtype;
    }
  }
  return o;
}

/// The values of parameter `param` that select distinct dtype or shape rules, as param_value_text spells
/// them: every value a case names, then those of its choices (a bool's true and false) no case
/// names, which the `otherwise` rule covers. Empty for a parameter no rule follows.
std::vector<std::string> ruled_values(const OpforgeOpSpec& op, int32_t param);

/// `text` (param_value_text's spelling) as a value of parameter `a`, pointing into `text` for a
/// string (keep `text` alive while the value is used).
OpforgeValue param_value_from_text(const OpforgeArgSpec& a, const std::string& text);

}  // namespace opforge::core
