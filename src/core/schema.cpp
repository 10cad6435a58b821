// Schema strings: the torch form of a declaration (types, defaults, returns) and expressions.
#include "schema.h"

#include <charconv>
#include <cstddef>
#include <string_view>
#include <vector>

#include "opforge/detail/names.h"
#include "opforge/detail/str.h"

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

bool has_runtime_source(const OpforgeKernel& k) {
  return k.struct_size >= offsetof(OpforgeKernel, precompile) + sizeof(k.precompile) && k.source != nullptr &&
         k.precompile != nullptr;
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

std::string schema(const OpforgeOpSpec& op) {
  detail::StringBuilder os;
  os << op.name << "(";
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    if (i) os << ", ";
    if (is_optional(a)) {
      os << "Tensor? " << a.name << "=None";
      continue;
    }
    os << schema_type(a.kind) << " " << a.name;
    if (a.kind != OPFORGE_ARG_TENSOR && a.param.has_default) os << "=" << format_value(a.param.default_value);
  }
  os << ") -> ";
  if (op.num_outputs == 1) {
    os << "Tensor";
  } else {
    os << "(";
    for (int32_t i = 0; i < op.num_outputs; ++i) os << (i ? ", " : "") << "Tensor";
    os << ")";
  }
  return os.str();
}

std::string qualified_schema(const OpforgeOpSpec& op) { return std::string(op.ns) + "::" + schema(op); }

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
                                                       : " // ";
          stack.emplace_back(wrap(a) + sym + wrap(b), true);
        }
      }
    }
  }
  return stack.size() == 1 ? stack.back().first : "<malformed>";
}

std::string declared_at(const OpforgeOpSpec& op) { return detail::declared_at(op.file, op.line, qualified_name(op)); }

const char* equivalent(const OpforgeOpSpec& op) {
  return op.struct_size >= offsetof(OpforgeOpSpec, equivalent) + sizeof(op.equivalent) ? op.equivalent : nullptr;
}

int32_t sharding(const OpforgeOpSpec& op) {
  if (op.struct_size < offsetof(OpforgeOpSpec, sharding) + sizeof(op.sharding)) return OPFORGE_SHARDING_NONE;
  if (op.sharding == OPFORGE_SHARDING_DIMS &&
      op.struct_size < offsetof(OpforgeOpSpec, sharding_dims) + sizeof(op.sharding_dims))
    return OPFORGE_SHARDING_NONE;
  return op.sharding;
}

uint32_t sharding_dims(const OpforgeOpSpec& op) { return sharding(op) == OPFORGE_SHARDING_DIMS ? op.sharding_dims : 0; }

}  // namespace opforge::core
