// Dtype rules that follow a parameter's value (Note [Rules that follow a parameter] in
// opforge/op_constraints.h): which rule an input follows for a parameter value, read off the
// record's OpforgeDtypeCase entries for the call checks, precompile requests, the dtype
// combinations verify draws from, and the description.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/c_api.h"

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

/// The values of parameter `param` that select distinct dtype rules, as param_value_text spells
/// them: every value a case names, then those of its choices (a bool's true and false) no case
/// names, which the `otherwise` rule covers. Empty for a parameter no rule follows.
std::vector<std::string> ruled_values(const OpforgeOpSpec& op, int32_t param);

/// `text` (param_value_text's spelling) as a value of parameter `a`, pointing into `text` for a
/// string (keep `text` alive while the value is used).
OpforgeValue param_value_from_text(const OpforgeArgSpec& a, const std::string& text);

}  // namespace opforge::core
