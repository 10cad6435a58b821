// Schema strings: the torch form of a declaration (types, defaults, returns) and expressions.
#include "schema.h"

#include <charconv>
#include <cstddef>
#include <string_view>
#include <vector>

#include "opforge/detail/names.h"
#include "opforge/detail/str.h"
#include "records.h"

namespace opforge::core {

namespace {

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // keep it a float literal
  return s;
}

/// A string literal torch's schema parser reads back exactly (its escapes: parse_string_literal.h):
/// the quote and backslash escaped, newline and tab as \n and \t, other control bytes as \xHH.
std::string quote_string(std::string_view s, char q) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(1, q);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + q;
}

std::string format_value(const OpforgeValue& v) {
  detail::StringBuilder os;
  switch (v.kind) {
    case OPFORGE_ARG_INT:
      os << v.i;
      break;
    case OPFORGE_ARG_FLOAT:
      os << format_double(v.f);
      break;
    case OPFORGE_ARG_BOOL:
      os << (v.i ? "True" : "False");
      break;
    case OPFORGE_ARG_STRING:
      os << quote_string({v.s, v.len}, '\'');
      break;
    case OPFORGE_ARG_INT_LIST:
    case OPFORGE_ARG_FLOAT_LIST:
      os << "[";
      for (size_t i = 0; i < v.len; ++i) {
        if (i) os << ", ";
        if (v.kind == OPFORGE_ARG_INT_LIST) os << v.ints[i];
        else os << format_double(v.floats[i]);
      }
      os << "]";
      break;
  }
  return os.str();
}

}  // namespace

int32_t device_type_code(std::string_view name) {
  return name == "cuda" ? OPFORGE_DEVICE_CUDA : name == "cpu" ? OPFORGE_DEVICE_CPU : -1;
}

const char* schema_type(int32_t kind) {
  switch (kind) {
    case OPFORGE_ARG_TENSOR:
      return "Tensor";
    case OPFORGE_ARG_INT:
      return "int";
    case OPFORGE_ARG_FLOAT:
      return "float";
    case OPFORGE_ARG_BOOL:
      return "bool";
    case OPFORGE_ARG_STRING:
      return "str";
    case OPFORGE_ARG_INT_LIST:
      return "int[]";
    case OPFORGE_ARG_FLOAT_LIST:
      return "float[]";
    default:
      return "?";
  }
}

std::string qualified_name(const OpforgeOpSpec& op) { return std::string(op.ns) + "::" + op.name; }

namespace {

/// The alias set of the k-th written tensor: a, b, ..., z, then a26, a27, ...
std::string alias_set(int32_t k) {
  return k < 26 ? std::string(1, static_cast<char>('a' + k)) : "a" + std::to_string(k);
}

/// "name(args...": every argument with its type, alias annotation and default; `*aliases`
/// counts the alias sets used.
void arguments(const OpforgeOpSpec& op, detail::StringBuilder& os, int32_t* aliases) {
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    if (i) os << ", ";
    if (a.kind == OPFORGE_ARG_TENSOR) {
      os << "Tensor";
      if (is_mutated(a)) os << "(" << alias_set((*aliases)++) << "!)";
      if (is_optional(a)) os << "?";
      os << " " << a.name << (has_schema_default(op, i) ? "=None" : "");
      continue;
    }
    os << (is_size_param(op, i) ? "SymInt" : schema_type(a.kind)) << " " << a.name;
    if (a.param.has_default) os << "=" << format_value(a.param.default_value);
  }
}

/// "Tensor", "(Tensor, Tensor)" or "()"; with `alias_from` >= 0 each return is annotated with
/// alias sets from that one on (an out= overload returns its out arguments).
std::string returns(const OpforgeOpSpec& op, int32_t alias_from) {
  auto one = [&](int32_t i) {
    if (alias_from >= 0) return "Tensor(" + alias_set(alias_from + i) + "!)";
    return std::string(op.outputs[i].present_with >= 0 ? "Tensor?" : "Tensor");
  };
  if (op.num_outputs == 1) return one(0);
  std::string out = "(";
  for (int32_t i = 0; i < op.num_outputs; ++i) out += (i ? ", " : "") + one(i);
  return out + ")";
}

}  // namespace

std::string schema(const OpforgeOpSpec& op) {
  detail::StringBuilder os;
  int32_t aliases = 0;
  os << op.name << "(";
  arguments(op, os, &aliases);
  os << ") -> " << returns(op, -1);
  return os.str();
}

std::string out_schema(const OpforgeOpSpec& op) {
  detail::StringBuilder os;
  int32_t aliases = 0;
  os << op.name << ".out(";
  arguments(op, os, &aliases);
  const int32_t first = aliases;
  os << (op.num_args ? ", *" : "*");
  for (int32_t i = 0; i < op.num_outputs; ++i) os << ", Tensor(" << alias_set(aliases++) << "!) " << op.outputs[i].name;
  os << ") -> " << returns(op, first);
  return os.str();
}

bool has_data_dependent_sizes(const OpforgeOpSpec& op) {
  for (int32_t k = 0; k < op.num_outputs; ++k)
    if (op.outputs[k].size_from >= 0) return true;
  return false;
}

std::string fake_companion_name(const OpforgeOpSpec& op) { return std::string("_opforge_fake_") + op.name; }

std::string fake_companion_schema(const OpforgeOpSpec& op) {
  const std::string s = schema(op);
  const size_t open = s.find('('), close = s.find(") -> ");
  return fake_companion_name(op) + s.substr(open, close - open) + (op.num_args ? ", " : "") +
         "*, SymInt[] data_dependent_sizes" + s.substr(close);
}

std::string qualified_schema(const OpforgeOpSpec& op) { return std::string(op.ns) + "::" + schema(op); }

const char* comparison_symbol(int32_t op) {
  switch (op) {
    case OPFORGE_EXPR_EQ:
      return "==";
    case OPFORGE_EXPR_NE:
      return "!=";
    case OPFORGE_EXPR_LT:
      return "<";
    case OPFORGE_EXPR_LE:
      return "<=";
    case OPFORGE_EXPR_GT:
      return ">";
    case OPFORGE_EXPR_GE:
      return ">=";
    default:
      return "?";
  }
}

std::string rule_string(const OpforgeOpSpec& op, const OpforgeRule& rule) {
  std::string text = expr_string(op, rule.lhs) + " " + comparison_symbol(rule.op) + " " + expr_string(op, rule.rhs);
  if (rule.when_arg >= 0 && rule.when_arg < op.num_args)
    text += std::string(" when ") + op.args[rule.when_arg].name + (rule.when_given ? " is given" : " is not given");
  return text;
}

const char* autocast_name(int32_t policy) {
  switch (policy) {
    case OPFORGE_AUTOCAST_FLOAT32:
      return "float32";
    case OPFORGE_AUTOCAST_LOWER_PRECISION:
      return "lower_precision";
    case OPFORGE_AUTOCAST_PROMOTE:
      return "promote";
    default:
      return "none";
  }
}

std::string qualified_out_schema(const OpforgeOpSpec& op) { return std::string(op.ns) + "::" + out_schema(op); }

std::string expr_string(const OpforgeOpSpec& op, const OpforgeExpr& e) {
  if (e.num_nodes == 0) return "*";
  std::vector<std::pair<std::string, bool>> stack;  // text, is compound
  for (int32_t i = 0; i < e.num_nodes; ++i) {
    const OpforgeExprNode& n = e.nodes[i];
    switch (n.op) {
      case OPFORGE_EXPR_CONST:
        stack.emplace_back(std::to_string(n.value), false);
        break;
      case OPFORGE_EXPR_MULTIPLE_OF:
        stack.emplace_back("multiple of " + std::to_string(n.value), false);
        break;
      case OPFORGE_EXPR_DIM:
        stack.emplace_back(
            std::string(n.arg >= 0 ? op.args[n.arg].name : "?") + ".size(" + std::to_string(n.value) + ")", false);
        break;
      case OPFORGE_EXPR_PARAM:
        stack.emplace_back(n.arg >= 0 ? op.args[n.arg].name : "?", false);
        break;
      default: {
        if (stack.size() < 2) return "<malformed>";
        auto b = stack.back();
        stack.pop_back();
        auto a = stack.back();
        stack.pop_back();
        auto wrap = [](const std::pair<std::string, bool>& t) { return t.second ? "(" + t.first + ")" : t.first; };
        const char* fn = n.op == OPFORGE_EXPR_CEILDIV ? "ceildiv"
                         : n.op == OPFORGE_EXPR_MIN   ? "min"
                         : n.op == OPFORGE_EXPR_MAX   ? "max"
                                                      : nullptr;
        if (fn) {
          stack.emplace_back(std::string(fn) + "(" + a.first + ", " + b.first + ")", false);
        } else {
          const char* sym = n.op == OPFORGE_EXPR_ADD   ? " + "
                            : n.op == OPFORGE_EXPR_SUB ? " - "
                            : n.op == OPFORGE_EXPR_MUL ? " * "
                            : n.op == OPFORGE_EXPR_MOD ? " % "
                                                       : " // ";
          stack.emplace_back(wrap(a) + sym + wrap(b), true);
        }
      }
    }
  }
  return stack.size() == 1 ? stack.back().first : "<malformed>";
}

namespace {
bool reads_param(const OpforgeExpr& e, int32_t i) {
  for (int32_t k = 0; k < e.num_nodes; ++k)
    if (e.nodes[k].op == OPFORGE_EXPR_PARAM && e.nodes[k].arg == i) return true;
  return false;
}
}  // namespace

bool has_schema_default(const OpforgeOpSpec& op, int32_t i) {
  const OpforgeArgSpec& a = op.args[i];
  if (a.kind != OPFORGE_ARG_TENSOR) return a.param.has_default != 0;
  if (!is_optional(a)) return false;
  for (int32_t j = i + 1; j < op.num_args; ++j) {  // each later one optional or with a default
    const OpforgeArgSpec& later = op.args[j];
    if (later.kind == OPFORGE_ARG_TENSOR ? !is_optional(later) : later.param.has_default == 0) return false;
  }
  return true;
}

bool is_size_param(const OpforgeOpSpec& op, int32_t i) {
  const OpforgeArgSpec& a = op.args[i];
  if (a.kind != OPFORGE_ARG_INT || a.param.compile_time) return false;
  for (int32_t j = 0; j < op.num_args; ++j) {
    const OpforgeTensorSpec& t = op.args[j].tensor;
    if (op.args[j].kind != OPFORGE_ARG_TENSOR) continue;
    for (int32_t d = 0; d < t.num_dims; ++d)
      if (reads_param(t.dims[d], i)) return true;
    if (t.has_values && (reads_param(t.values_low, i) || reads_param(t.values_high, i))) return true;
  }
  for (int32_t k = 0; k < op.num_outputs; ++k)
    for (int32_t d = 0; d < op.outputs[k].num_dims; ++d)
      if (reads_param(op.outputs[k].dims[d], i)) return true;
  for (int32_t k = 0; k < num_rules(op); ++k)
    if (reads_param(op.rules[k].lhs, i) || reads_param(op.rules[k].rhs, i)) return true;
  for (const OpforgeRuleCase& c : rule_cases(op))
    for (int32_t d = 0; c.has_shape && d < c.num_dims; ++d)
      if (reads_param(c.dims[d], i)) return true;
  return false;
}

bool has_out_overload(const OpforgeOpSpec& op) {
  for (int32_t k = 0; k < op.num_outputs; ++k)
    if (op.outputs[k].present_with >= 0 || op.outputs[k].size_from >= 0) return false;
  return op.num_outputs > 0 && !mutates_inputs(op);
}

std::string declared_at(const OpforgeOpSpec& op) { return detail::declared_at(op.file, op.line, qualified_name(op)); }

}  // namespace opforge::core
