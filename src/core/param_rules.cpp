// Rules that follow a parameter's value (see param_rules.h).
#include "param_rules.h"

#include <cstdlib>

#include "records.h"

namespace opforge::core {

int32_t ruling_param(const OpforgeOpSpec& op, int32_t arg) {
  for (const OpforgeDtypeCase& c : dtype_cases(op))
    if (c.arg == arg) return c.param;
  return -1;
}

int32_t shape_ruling_param(const OpforgeOpSpec& op, int32_t arg) {
  for (const OpforgeRuleCase& c : rule_cases(op))
    if (c.arg == arg && c.has_shape) return c.param;
  return -1;
}

int32_t output_ruling_param(const OpforgeOpSpec& op, int32_t k, bool dtype) {
  for (const OpforgeRuleCase& c : rule_cases(op))
    if (c.output == k && (dtype ? c.has_dtype : c.has_shape)) return c.param;
  return -1;
}

std::string param_value_text(const OpforgeArgSpec& a, const OpforgeValue& v) {
  switch (a.kind) {
    case OPFORGE_ARG_STRING:
      return std::string(v.s == nullptr ? "" : v.s, v.len);
    case OPFORGE_ARG_BOOL:
      return v.i ? "true" : "false";
    default:
      return std::to_string(v.i);
  }
}

std::string param_value_phrase(const OpforgeArgSpec& a, const OpforgeValue& v) {
  const std::string text = param_value_text(a, v);
  return std::string(a.name) + " is " + (a.kind == OPFORGE_ARG_STRING ? "'" + text + "'" : text);
}

OpforgeTensorSpec ruled_spec(const OpforgeOpSpec& op, int32_t arg, const std::string& value) {
  OpforgeTensorSpec s = op.args[arg].tensor;
  for (const OpforgeDtypeCase& c : dtype_cases(op)) {
    if (c.arg != arg || value != c.value) continue;
    s.dtypes = c.dtypes;
    s.dtype_like = c.dtype_like;
    s.dtype_alternatives = c.dtype_alternatives;
  }
  return s;
}

std::vector<std::string> ruled_values(const OpforgeOpSpec& op, int32_t param) {
  std::vector<std::string> out;
  auto add = [&](const std::string& v) {
    for (const auto& o : out)
      if (o == v) return;
    out.push_back(v);
  };
  for (const OpforgeDtypeCase& c : dtype_cases(op))
    if (c.param == param) add(c.value);
  for (const OpforgeRuleCase& c : rule_cases(op))
    if (c.param == param) add(c.value);
  if (out.empty()) return out;
  const OpforgeArgSpec& a = op.args[param];
  if (a.kind == OPFORGE_ARG_BOOL) {
    add("true");
    add("false");
  }
  for (int32_t k = 0; k < a.param.num_choices; ++k) add(a.param.choices[k]);
  return out;
}

OpforgeValue param_value_from_text(const OpforgeArgSpec& a, const std::string& text) {
  OpforgeValue v{};
  v.kind = a.kind;
  if (a.kind == OPFORGE_ARG_STRING) {
    v.s = text.c_str();
    v.len = text.size();
  } else if (a.kind == OPFORGE_ARG_BOOL) {
    v.i = text == "true";
  } else {
    v.i = std::strtoll(text.c_str(), nullptr, 10);
  }
  return v;
}

}  // namespace opforge::core
