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

std::string quote_string(std::string_view s, char q) {
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\';
    out += c;
  }
  return out + q;
}

std::string format_value(const OpforgeValue& v) {
  detail::StringBuilder os;
  switch (v.kind) {
    case OPFORGE_ARG_INT: os << v.i; break;
    case OPFORGE_ARG_FLOAT: os << format_double(v.f); break;
    case OPFORGE_ARG_BOOL: os << (v.i ? "True" : "False"); break;
    case OPFORGE_ARG_STRING: os << quote_string({v.s, v.len}, '\''); break;
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

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

bool has_runtime_source(const OpforgeKernel& k) {
  return k.struct_size >= offsetof(OpforgeKernel, precompile) + sizeof(k.precompile) && k.source != nullptr &&
         k.precompile != nullptr;
}

const char* schema_type(int32_t kind) {
  switch (kind) {
    case OPFORGE_ARG_TENSOR: return "Tensor";
    case OPFORGE_ARG_INT: return "int";
    case OPFORGE_ARG_FLOAT: return "float";
    case OPFORGE_ARG_BOOL: return "bool";
    case OPFORGE_ARG_STRING: return "str";
    case OPFORGE_ARG_INT_LIST: return "int[]";
    case OPFORGE_ARG_FLOAT_LIST: return "float[]";
    default: return "?";
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
      case OPFORGE_EXPR_CONST: stack.emplace_back(std::to_string(n.value), false); break;
      case OPFORGE_EXPR_MULTIPLE_OF: stack.emplace_back("multiple of " + std::to_string(n.value), false); break;
      case OPFORGE_EXPR_DIM:
        stack.emplace_back(std::string(n.arg >= 0 ? op.args[n.arg].name : "?") + ".size(" + std::to_string(n.value) + ")",
                           false);
        break;
      case OPFORGE_EXPR_PARAM: stack.emplace_back(n.arg >= 0 ? op.args[n.arg].name : "?", false); break;
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
          const char* sym = n.op == OPFORGE_EXPR_ADD ? " + " : n.op == OPFORGE_EXPR_SUB ? " - " : n.op == OPFORGE_EXPR_MUL ? " * " : " // ";
          stack.emplace_back(wrap(a) + sym + wrap(b), true);
        }
      }
    }
  }
  return stack.size() == 1 ? stack.back().first : "<malformed>";
}

const char* backward_name(const OpforgeOpSpec& op) {
  return op.struct_size >= offsetof(OpforgeOpSpec, backward) + sizeof(op.backward) ? op.backward : nullptr;
}

const OpforgeOpSpec* find_op(const OpforgeLibrary& lib, const std::string& qualified) {
  for (int32_t k = 0; k < lib.num_ops; ++k)
    if (qualified_name(*lib.ops[k]) == qualified) return lib.ops[k];
  return nullptr;
}

bool is_backward_op(const OpforgeLibrary& lib, const OpforgeOpSpec& op) {
  const std::string name = qualified_name(op);
  for (int32_t k = 0; k < lib.num_ops; ++k)
    if (const char* b = backward_name(*lib.ops[k]); b != nullptr && name == b) return true;
  return false;
}

BackwardPlan plan_backward(const OpforgeOpSpec& fwd, const OpforgeOpSpec& bwd, std::string& problems) {
  static constexpr std::string_view kGrad = "grad_";
  auto index_of = [](auto names, int32_t n, std::string_view name) {
    for (int32_t i = 0; i < n; ++i)
      if (name == names(i)) return i;
    return int32_t{-1};
  };
  auto arg = [&](int32_t i) { return std::string_view(fwd.args[i].name); };
  auto out = [&](int32_t i) { return std::string_view(fwd.outputs[i].name); };
  auto grad_of = [&](std::string_view name) { return name.substr(0, kGrad.size()) == kGrad ? name.substr(kGrad.size()) : std::string_view(); };
  std::string accepted, differentiable;
  for (int32_t j = 0; j < fwd.num_outputs; ++j) accepted += (j ? ", grad_" : "grad_") + std::string(out(j));
  for (int32_t i = 0; i < fwd.num_args; ++i) accepted += ", " + std::string(arg(i));
  for (int32_t j = 0; j < fwd.num_outputs; ++j) accepted += ", " + std::string(out(j));
  for (int32_t i = 0; i < fwd.num_args; ++i)
    if (fwd.args[i].kind == OPFORGE_ARG_TENSOR) differentiable += (differentiable.empty() ? "grad_" : ", grad_") + std::string(arg(i));
  const std::string f = qualified_name(fwd), b = qualified_name(bwd);
  BackwardPlan plan;
  std::string found;
  for (int32_t i = 0; i < fwd.num_args + fwd.num_outputs; ++i) {
    const std::string_view name = i < fwd.num_args ? arg(i) : out(i - fwd.num_args);
    if (const auto of = grad_of(name); !of.empty() && index_of(out, fwd.num_outputs, of) >= 0)
      found += "\n  " + f + "'s " + (i < fwd.num_args ? "input '" : "output '") + std::string(name) +
               "' is named like the gradient of its output '" + std::string(of) +
               "'; rename it (the backward op could not tell the two apart)";
  }
  for (int32_t k = 0; k < bwd.num_args; ++k) {
    const std::string_view name = bwd.args[k].name;
    int32_t i;
    const bool tensor = bwd.args[k].kind == OPFORGE_ARG_TENSOR;
    if (const auto of = grad_of(name); !of.empty() && (i = index_of(out, fwd.num_outputs, of)) >= 0) {
      plan.sources.emplace_back(BackwardPlan::Source::kGrad, i);
      if (!tensor) found += "\n  input '" + std::string(name) + "' of " + b + " is " + schema_type(bwd.args[k].kind) + " but a gradient is a Tensor";
    } else if ((i = index_of(arg, fwd.num_args, name)) >= 0) {
      plan.sources.emplace_back(BackwardPlan::Source::kArg, i);
      const OpforgeArgSpec &a = fwd.args[i], &c = bwd.args[k];
      if (a.kind != c.kind || (is_optional(a) && !is_optional(c)))
        found += "\n  input '" + std::string(name) + "' of " + b + " is " + schema_type(c.kind) +
                 (is_optional(c) ? "?" : "") + " but " + f + "'s " + std::string(name) + " is " + schema_type(a.kind) +
                 (is_optional(a) ? "?" : "");
    } else if ((i = index_of(out, fwd.num_outputs, name)) >= 0) {
      plan.sources.emplace_back(BackwardPlan::Source::kOutput, i);
      if (!tensor) found += "\n  input '" + std::string(name) + "' of " + b + " is " + schema_type(bwd.args[k].kind) + " but " + f + "'s output " + std::string(name) + " is a Tensor";
    } else {
      found += "\n  input '" + std::string(name) + "' of " + b + " matches nothing of " + f + ": expected one of " + accepted;
    }
  }
  for (int32_t k = 0; k < bwd.num_outputs; ++k) {
    const std::string_view name = bwd.outputs[k].name;
    const auto of = grad_of(name);
    const int32_t i = of.empty() ? -1 : index_of(arg, fwd.num_args, of);
    if (i >= 0 && fwd.args[i].kind == OPFORGE_ARG_TENSOR) {
      plan.targets.push_back(i);
    } else {
      found += "\n  output '" + std::string(name) + "' of " + b + " is not the gradient of a tensor input of " + f +
               ": expected one of " + differentiable;
    }
  }
  if (found.empty()) return plan;
  problems = f + " (" + fwd.file + ":" + std::to_string(fwd.line) + ") names " + b + " as its backward op, but:" + found;
  return {};
}

std::string check_backward_ops(const OpforgeLibrary& lib) {
  std::string problems;
  for (int32_t k = 0; k < lib.num_ops; ++k) {
    const OpforgeOpSpec& op = *lib.ops[k];
    const char* name = backward_name(op);
    if (name == nullptr) continue;
    std::string these;
    if (const OpforgeOpSpec* bwd = find_op(lib, name)) {
      plan_backward(op, *bwd, these);
    } else {
      these = qualified_name(op) + " (" + op.file + ":" + std::to_string(op.line) + ") names " + name +
              " as its backward op, which this library does not declare (declare both ops in one library)";
    }
    if (!these.empty()) problems += (problems.empty() ? "" : "\n") + these;
  }
  return problems;
}

std::string library_json(const OpforgeLibrary& lib) {
  detail::StringBuilder os;
  os << "{\"abi_version\": " << lib.abi_version << ", \"ops\": [";
  for (int32_t k = 0; k < lib.num_ops; ++k) {
    const OpforgeOpSpec& op = *lib.ops[k];
    os << (k ? ", " : "") << "{\"name\": " << json_string(qualified_name(op))
       << ", \"schema\": " << json_string(qualified_schema(op)) << ", \"doc\": " << json_string(op.doc)
       << ", \"file\": " << json_string(op.file) << ", \"line\": " << op.line;
    if (op.struct_size >= offsetof(OpforgeOpSpec, equivalent) + sizeof(op.equivalent) && op.equivalent)
      os << ", \"equivalent\": " << json_string(op.equivalent);
    if (const char* name = backward_name(op); name != nullptr) {
      os << ", \"backward\": " << json_string(name);
      std::string problems;
      if (const OpforgeOpSpec* bwd = find_op(lib, name)) {
        const BackwardPlan plan = plan_backward(op, *bwd, problems);
        if (problems.empty()) {
          os << ", \"backward_targets\": [";
          for (size_t t = 0; t < plan.targets.size(); ++t) os << (t ? ", " : "") << plan.targets[t];
          os << "]";
        }
      }
    }
    if (op.struct_size >= offsetof(OpforgeOpSpec, sharding) + sizeof(op.sharding))
      os << ", \"sharding\": "
         << (op.sharding == OPFORGE_SHARDING_POINTWISE ? "\"pointwise\""
             : op.sharding == OPFORGE_SHARDING_ROWWISE ? "\"rowwise\""
             : op.sharding == OPFORGE_SHARDING_DIMS &&
                     op.struct_size >= offsetof(OpforgeOpSpec, sharding_dims) + sizeof(op.sharding_dims)
                 ? "\"dims\""
                 : "\"none\"");
    if (op.sharding == OPFORGE_SHARDING_DIMS &&
        op.struct_size >= offsetof(OpforgeOpSpec, sharding_dims) + sizeof(op.sharding_dims)) {
      os << ", \"sharding_dims\": [";
      for (int32_t d = 0, n = 0; d < 32; ++d)
        if (op.sharding_dims >> d & 1u) os << (n++ ? ", " : "") << d;
      os << "]";
    }
    os << ", \"args\": [";
    for (int32_t i = 0; i < op.num_args; ++i) {
      const OpforgeArgSpec& a = op.args[i];
      os << (i ? ", " : "") << "{\"name\": " << json_string(a.name) << ", \"type\": " << json_string(schema_type(a.kind));
      if (a.kind == OPFORGE_ARG_TENSOR) {
        os << ", \"dtypes\": [";
        bool first = true;
        for (int32_t d = 0; d < OPFORGE_NUM_DTYPES; ++d) {
          if (!((a.tensor.dtypes >> d) & 1u)) continue;
          os << (first ? "" : ", ") << json_string(dtype_name(d));
          first = false;
        }
        os << "], \"min_rank\": " << a.tensor.min_rank << ", \"max_rank\": " << a.tensor.max_rank
           << ", \"strided\": " << (a.tensor.layout == OPFORGE_LAYOUT_STRIDED ? "true" : "false");
        if (a.tensor.layout == OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM) os << ", \"contiguous_last_dim\": true";
        if (is_optional(a)) os << ", \"optional\": true";
        if (a.tensor.dtype_like >= 0) os << ", \"same_dtype\": " << json_string(op.args[a.tensor.dtype_like].name);
        if (a.tensor.shape_like >= 0)
          os << ", \"same_shape\": " << json_string(op.args[a.tensor.shape_like].name);
        if (a.tensor.num_dims > 0) {
          os << ", \"shape\": [";
          for (int32_t d = 0; d < a.tensor.num_dims; ++d)
            os << (d ? ", " : "") << json_string(expr_string(op, a.tensor.dims[d]));
          // The same rules as postfix nodes [op, arg, value] (OpforgeExprNode), for evaluation.
          os << "], \"shape_nodes\": [";
          for (int32_t d = 0; d < a.tensor.num_dims; ++d) {
            const OpforgeExpr& e = a.tensor.dims[d];
            os << (d ? ", " : "") << "[";
            for (int32_t k = 0; k < e.num_nodes; ++k)
              os << (k ? ", " : "") << "[" << e.nodes[k].op << ", " << e.nodes[k].arg << ", " << e.nodes[k].value << "]";
            os << "]";
          }
          os << "]";
        }
      } else {
        if (a.param.has_default) os << ", \"default\": " << json_string(format_value(a.param.default_value));
        if (a.param.compile_time) os << ", \"compile_time\": true";
        if (a.param.has_min) os << ", \"min\": " << format_double(a.param.min);
        if (a.param.has_max) os << ", \"max\": " << format_double(a.param.max);
        if (a.param.num_choices > 0) {
          os << ", \"choices\": [";
          for (int32_t c = 0; c < a.param.num_choices; ++c)  // integers as JSON numbers
            os << (c ? ", " : "") << (a.kind == OPFORGE_ARG_INT ? std::string(a.param.choices[c]) : json_string(a.param.choices[c]));
          os << "]";
        }
      }
      os << "}";
    }
    os << "], \"outputs\": [";
    for (int32_t i = 0; i < op.num_outputs; ++i) {
      const OpforgeOutputSpec& o = op.outputs[i];
      os << (i ? ", " : "") << "{\"name\": " << json_string(o.name);
      if (o.shape_like >= 0) os << ", \"like\": " << json_string(op.args[o.shape_like].name);
      os << ", \"dtype\": "
         << json_string(o.dtype_like >= 0 ? std::string("like ") + op.args[o.dtype_like].name : dtype_name(o.dtype))
         << "}";
    }
    os << "], \"devices\": [";
    for (int32_t i = 0; i < op.num_kernels; ++i)
      os << (i ? ", " : "") << (op.kernels[i].device_type == OPFORGE_DEVICE_CUDA ? "\"cuda\"" : "\"cpu\"");
    os << "], \"runtime_kernels\": [";
    bool first = true;
    for (int32_t i = 0; i < op.num_kernels; ++i) {
      const OpforgeKernel& k = op.kernels[i];
      if (!has_runtime_source(k)) continue;
      os << (first ? "" : ", ") << "{\"source\": " << json_string(k.source) << ", \"name\": " << json_string(k.name)
         << "}";
      first = false;
    }
    os << "]}";
  }
  os << "]";
  if (lib.struct_size >= offsetof(OpforgeLibrary, kernel_dir) + sizeof(lib.kernel_dir) && lib.kernel_dir)
    os << ", \"kernel_dir\": " << json_string(lib.kernel_dir);
  os << "}";
  return os.str();
}

}  // namespace opforge::core
