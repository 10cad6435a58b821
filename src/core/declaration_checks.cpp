// The checks of declarations on their records (declaration_checks.h).
#include "declaration_checks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "backward.h"
#include "classes.h"
#include "dtypes.h"
#include "opforge/detail/kernel_name.h"
#include "opforge/detail/names.h"
#include "opforge/detail/str.h"
#include "records.h"
#include "schema.h"

namespace opforge::core {
namespace {

/// Python's keywords (keyword.kwlist): torch.fx and Inductor turn an op's schema into a Python
/// signature, where an argument so named fails (`lambda`) or is generated as invalid code (`from`).
constexpr const char* kPythonKeywords[] = {"False",  "None",   "True",    "and",      "as",       "assert", "async",
                                           "await",  "break",  "class",   "continue", "def",      "del",    "elif",
                                           "else",   "except", "finally", "for",      "from",     "global", "if",
                                           "import", "in",     "is",      "lambda",   "nonlocal", "not",    "or",
                                           "pass",   "raise",  "return",  "try",      "while",    "with",   "yield"};

bool is_identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

bool starts_with_two_underscores(std::string_view s) { return s.substr(0, 2) == "__"; }

/// Why `name` cannot name a schema argument, or "": a Python keyword.
std::string keyword_problem(std::string_view name) {
  for (const char* k : kPythonKeywords)
    if (name == k)
      return "\"" + std::string(name) +
             "\" is a Python keyword, which torch.compile and AOTInductor cannot take as an argument name; rename it";
  return {};
}

/// The C++ type a parameter of `kind` (OpforgeArgKind) is declared with, for messages.
const char* declared_type(int32_t kind) {
  static constexpr const char* kTypes[] = {
      "tensor", "int64_t", "double", "bool", "std::string", "std::vector<int64_t>", "std::vector<double>"};
  return kind >= 0 && kind <= OPFORGE_ARG_FLOAT_LIST ? kTypes[kind] : "?";
}

/// Collects one op's problems, each prefixed with its declaration's site.
class Problems {
 public:
  explicit Problems(const OpforgeOpSpec& op) : op_(op), at_(declared_at(op)) {}
  void add(const std::string& context, const std::string& what) { lines_.push_back(at_ + context + what); }
  std::vector<std::string> take() { return std::move(lines_); }

  /// The argument of `op_` called `name`, or -1.
  int32_t arg(std::string_view name) const {
    for (int32_t i = 0; i < op_.num_args; ++i)
      if (name == op_.args[i].name) return i;
    return -1;
  }
  /// The output of `op_` called `name`, or -1.
  int32_t output(std::string_view name) const {
    for (int32_t k = 0; k < op_.num_outputs; ++k)
      if (name == op_.outputs[k].name) return k;
    return -1;
  }

 private:
  const OpforgeOpSpec& op_;
  std::string at_;
  std::vector<std::string> lines_;
};

void check_op_names(const OpforgeOpSpec& op, Problems& p) {
  if (!is_identifier(op.ns) || !is_identifier(op.name)) p.add("", "namespace and op name must be identifiers");
  else if (starts_with_two_underscores(op.ns) || starts_with_two_underscores(op.name))
    p.add("",
          "namespace and op name must not start with \"__\": C++ reserves such names, and Python mangles them "
          "inside classes (torch.ops.ns.__op in a method is looked up as _Class__op)");
  // Without a C++ reference an op needs what verify compares its device kernels with instead: an
  // .equivalent() torch expression (Note [Equivalent-only ops] in opforge/op_builder.h).
  if ((op.num_kernels < 1 || op.kernels[0].fn == nullptr) && (op.num_kernels < 2 || equivalent(op) == nullptr))
    p.add("", "no CPU reference: add .reference(fn), or an .equivalent() torch expression beside a device kernel");
  bool any_tensor = false;
  for (int32_t i = 0; i < op.num_args; ++i) any_tensor = any_tensor || op.args[i].kind == OPFORGE_ARG_TENSOR;
  if (!any_tensor) p.add("", "an op takes at least one tensor .input() (it sets the device outputs are allocated on)");
  int32_t num_cuda = 0;
  for (int32_t k = 1; k < op.num_kernels; ++k) num_cuda += op.kernels[k].device_type == OPFORGE_DEVICE_CUDA;
  if (num_cuda > 1) p.add("", "more than one CUDA kernel (.cuda() or .cuda_source())");
}

// Names torch.compile cannot take. torch.fx writes a schema as a Python signature in which an
// argument named "self" is called "input" (torch/fx/operator_schemas.py), so "self" beside an
// "input" repeats a name; and the out= overload takes the outputs as keyword arguments, where
// "self" is the name torch's operator methods give their own object.

/// Why argument `name` of `op` cannot be so named, or "".
std::string argument_name_problem(const OpforgeOpSpec& op, std::string_view name, const Problems& p) {
  if (std::string why = keyword_problem(name); !why.empty()) return why;
  if (name != "self") return {};
  const char* collision =
      "torch's Python signatures call a \"self\" argument \"input\", so the two collide under torch.compile; rename "
      "one";
  if (p.arg("input") >= 0) return std::string("\"self\" beside an argument named \"input\": ") + collision;
  if (has_out_overload(op) && p.output("input") >= 0)
    return std::string("\"self\" beside an output named \"input\", an argument of the out= overload: ") + collision;
  return {};
}

/// Why output `name` of `op` cannot be so named, or "".
std::string output_name_problem(const OpforgeOpSpec& op, std::string_view name) {
  if (std::string why = keyword_problem(name); !why.empty()) return why;
  if (name == "self" && has_out_overload(op))
    return "\"self\" is a keyword argument of the out= overload, which torch.compile cannot pass (torch's operator "
           "methods take their own \"self\"); rename it";
  return {};
}

bool in_range(const OpforgeParamSpec& p, double v) { return !(p.has_min && v < p.min) && !(p.has_max && v > p.max); }

/// "the default 5 is outside the declared range [0, 4]" (or "... range [0, inf)", or "the
/// declared range [5, 0] is empty").
std::string range_problem(const OpforgeParamSpec& p, double v) {
  const std::string range = (p.has_min ? detail::cat("[", p.min) : std::string("(-inf")) + ", " +
                            (p.has_max ? detail::cat(p.max, "]") : std::string("inf)"));
  if (p.has_min && p.has_max && p.min > p.max) return "the declared range " + range + " is empty";
  return detail::cat("the default ", v, " is outside the declared range ", range);
}

bool is_choice(const OpforgeParamSpec& p, std::string_view value) {
  for (int32_t c = 0; c < p.num_choices; ++c)
    if (value == p.choices[c]) return true;
  return false;
}

void check_tensor(const OpforgeOpSpec& op, int32_t i, const std::string& ctx, Problems& p) {
  const OpforgeTensorSpec& t = op.args[i].tensor;
  if (t.leading_dims && t.leading_like >= 0 && !op.args[t.leading_like].tensor.leading_dims)
    p.add(ctx, "leading_dims_of(\"" + std::string(op.args[t.leading_like].name) + "\"): '" +
                   op.args[t.leading_like].name +
                   "' has no leading dims to share: declare its shape as shape({opforge::leading_dims, ...})");
  for (int32_t d = 0; d < t.num_dims; ++d) {
    const OpforgeExpr& e = t.dims[d];
    if (e.num_nodes == 1 && e.nodes[0].op == OPFORGE_EXPR_MULTIPLE_OF && e.nodes[0].value <= 0)
      p.add(ctx + "shape(): ", "opforge::multiple_of(" + std::to_string(e.nodes[0].value) + "): expected a factor > 0");
  }
  if (t.leading_dims && t.max_rank >= 0 && t.max_rank < t.num_dims)
    p.add(ctx, "a rank of at most " + std::to_string(t.max_rank) + " is below the " + std::to_string(t.num_dims) +
                   " dims its shape({opforge::leading_dims, ...}) rules");
  else if (t.min_rank >= 0 && t.max_rank >= 0 && t.min_rank > t.max_rank)
    p.add(ctx, "the rank range [" + std::to_string(t.min_rank) + ", " + std::to_string(t.max_rank) + "] is empty");
  if (t.dtypes == 0) p.add(ctx, "the dtype set is empty");
  if (t.has_values) {
    constexpr uint32_t kIntegers = (1u << OPFORGE_DTYPE_INT8) | (1u << OPFORGE_DTYPE_INT16) |
                                   (1u << OPFORGE_DTYPE_INT32) | (1u << OPFORGE_DTYPE_INT64) |
                                   (1u << OPFORGE_DTYPE_UINT8);
    if (t.dtypes & ~kIntegers)
      p.add(ctx, "values_in() applies to integer inputs, but its dtypes include " +
                     std::string(dtype_name(__builtin_ctz(t.dtypes & ~kIntegers))));
  }
}

void check_param(const OpforgeArgSpec& a, const std::string& ctx, Problems& p) {
  const OpforgeParamSpec& s = a.param;
  if ((s.has_min || s.has_max) && (a.kind == OPFORGE_ARG_STRING || a.kind == OPFORGE_ARG_BOOL))
    p.add(ctx, std::string("a range applies to numeric parameters only, not ") + declared_type(a.kind));
  if (!s.has_default) return;
  const OpforgeValue& v = s.default_value;
  if (a.kind == OPFORGE_ARG_INT) {
    if (!in_range(s, static_cast<double>(v.i))) p.add(ctx, range_problem(s, static_cast<double>(v.i)));
    if (s.num_choices > 0 && !is_choice(s, std::to_string(v.i)))
      p.add(ctx, "the default " + std::to_string(v.i) + " is not one of the declared choices");
  } else if (a.kind == OPFORGE_ARG_FLOAT) {
    if (!in_range(s, v.f)) p.add(ctx, range_problem(s, v.f));
  } else if (a.kind == OPFORGE_ARG_STRING) {
    const std::string text(v.s, v.len);
    if (s.num_choices > 0 && !is_choice(s, text))
      p.add(ctx, "the default \"" + text + "\" is not one of the declared choices");
  }
}

/// Whether parameter `a` can select a rule by its value `v` (Note [Rules that follow a parameter]):
/// a string, int or bool parameter, `v` one of its values (one of its one_of choices where it has
/// them). Reports why not under `ctx`, the rule being of `what` ("a dtype rule").
bool check_case_value(const OpforgeArgSpec& a, std::string_view v, const std::string& what, const std::string& ctx,
                      Problems& p) {
  if (a.kind != OPFORGE_ARG_STRING && a.kind != OPFORGE_ARG_INT && a.kind != OPFORGE_ARG_BOOL) {
    p.add(ctx, what + " follows a std::string, int64_t or bool parameter, and '" + a.name + "' is a " +
                   declared_type(a.kind));
    return false;
  }
  std::string choices;
  for (int32_t i = 0; i < a.param.num_choices; ++i) choices += (i ? ", " : "") + std::string(a.param.choices[i]);
  const bool decimal = !v.empty() && v.find_first_not_of("-0123456789") == std::string_view::npos;
  if ((a.kind == OPFORGE_ARG_BOOL && v != "true" && v != "false") || (a.kind == OPFORGE_ARG_INT && !decimal))
    p.add(ctx,
          "\"" + std::string(v) + "\" is not a value of the " + declared_type(a.kind) + " parameter '" + a.name + "'");
  else if (a.param.num_choices > 0 && !is_choice(a.param, std::string(v)))
    p.add(ctx, "\"" + std::string(v) + "\" is not one of the values of '" + a.name + "' (one_of: " + choices + ")");
  return true;
}

/// Note [Rules that follow a parameter]: each case follows a string, int or bool parameter, names
/// one of its values, and has a dtype rule of its own; an input's cases follow one parameter.
void check_dtype_cases(const OpforgeOpSpec& op, Problems& p) {
  const Span<const OpforgeDtypeCase> cases = dtype_cases(op);
  for (size_t k = 0; k < cases.size(); ++k) {
    const OpforgeDtypeCase& c = cases[k];
    if (c.arg < 0 || c.arg >= op.num_args || c.param < 0 || c.param >= op.num_args) continue;  // reported at build
    const OpforgeArgSpec& a = op.args[c.param];
    const std::string ctx =
        "input '" + std::string(op.args[c.arg].name) + "': when(\"" + a.name + "\", \"" + c.value + "\"): ";
    if (!check_case_value(a, c.value, "a dtype rule", ctx, p)) continue;
    for (size_t e = 0; e < k; ++e) {
      if (cases[e].arg != c.arg) continue;
      if (cases[e].param != c.param) {
        p.add(ctx, "the input's dtype rule already follows '" + std::string(op.args[cases[e].param].name) +
                       "'; one input's rule follows one parameter");
        break;
      }
      if (std::string_view(cases[e].value) == c.value) {
        p.add(ctx, "a second rule for this value");
        break;
      }
    }
    if (c.dtype_like >= c.arg)
      p.add(ctx, "same_dtype(\"" + std::string(op.args[c.dtype_like].name) + "\") must name an earlier tensor input");
    if (c.dtype_like < 0 && c.dtypes == 0) p.add(ctx, "the dtype set is empty");
  }
}

/// The same for shape rules (of inputs and outputs) and output dtype rules (OpforgeRuleCase): each
/// rule of an input or output follows one parameter, one case per value.
void check_rule_cases(const OpforgeOpSpec& op, Problems& p) {
  const Span<const OpforgeRuleCase> cases = rule_cases(op);
  for (size_t k = 0; k < cases.size(); ++k) {
    const OpforgeRuleCase& c = cases[k];
    if (c.param < 0 || c.param >= op.num_args) continue;  // reported at build
    const OpforgeArgSpec& a = op.args[c.param];
    const std::string of = c.arg >= 0 ? "input '" + std::string(op.args[c.arg].name) + "'"
                                      : "output '" + std::string(op.outputs[c.output].name) + "'";
    const std::string ctx = of + ": when(\"" + a.name + "\", \"" + c.value + "\"): ";
    const std::string what = c.has_shape ? "a shape rule" : "a dtype rule";
    if (!check_case_value(a, c.value, what, ctx, p)) continue;
    for (size_t e = 0; e < k; ++e) {
      const OpforgeRuleCase& d = cases[e];
      if (d.arg != c.arg || d.output != c.output || d.has_shape != c.has_shape) continue;
      if (d.param != c.param) {
        p.add(ctx, "its " + what.substr(2) + " already follows '" + std::string(op.args[d.param].name) +
                       "'; one rule follows one parameter");
        break;
      }
      if (std::string_view(d.value) == c.value) {
        p.add(ctx, "a second rule for this value");
        break;
      }
    }
  }
}

void check_arguments(const OpforgeOpSpec& op, std::set<std::string>& seen, Problems& p) {
  std::string after_default;  // the first argument with a default: torch schemas put defaults last
  bool first_tensor = true;
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    const bool tensor = a.kind == OPFORGE_ARG_TENSOR;
    const std::string ctx = (tensor ? "input '" : "param '") + std::string(a.name) + "': ";
    if (!is_identifier(a.name)) p.add(ctx, "the name must be an identifier");
    else if (std::string why = argument_name_problem(op, a.name, p); !why.empty()) p.add(ctx, why);
    if (!seen.insert(a.name).second) p.add(ctx, "declared twice");
    if (tensor && is_optional(a) && first_tensor)
      p.add(ctx,
            "the first tensor input cannot be opforge::optional (it sets the outputs' device and the run-time "
            "kernels' {T})");
    // An optional input takes a default only where every later argument has one (schema.h's
    // has_schema_default), so a required argument can follow only a parameter's default.
    const bool has_default = has_schema_default(op, i);
    if (!after_default.empty() && !has_default && !is_optional(a))  // torch's parser asserts on such a schema
      p.add(ctx, "follows " + after_default + (tensor ? ", so it must be optional too" : ", so it needs a default") +
                     " (torch schemas put arguments with defaults last)");
    if (has_default && after_default.empty() && !tensor)
      after_default = "the param '" + std::string(a.name) + "' with a default";
    if (tensor) {
      first_tensor = false;
      check_tensor(op, i, ctx, p);
    } else {
      check_param(a, ctx, p);
    }
  }
}

void check_outputs(const OpforgeOpSpec& op, std::set<std::string>& seen, Problems& p) {
  const bool has_backward = backward_name(op) != nullptr;
  for (int32_t k = 0; k < op.num_outputs; ++k) {
    const OpforgeOutputSpec& o = op.outputs[k];
    const std::string ctx = "output '" + std::string(o.name) + "': ";
    if (!is_identifier(o.name)) p.add(ctx, "the name must be an identifier");
    else if (std::string why = output_name_problem(op, o.name); !why.empty()) p.add(ctx, why);
    if (!seen.insert(o.name).second) p.add(ctx, "the name is already used by an argument or output");
    if (o.size_from >= 0) {
      const OpforgeOutputSpec& count = op.outputs[o.size_from];
      if (count.dtype_like >= 0 || count.dtype != OPFORGE_DTYPE_INT64 || count.shape_like >= 0 || count.num_dims != 0)
        p.add(ctx, "size_of(\"" + std::string(count.name) + "\"): the size must come from a 0-dim int64 output, " +
                       "opforge::shape({}) with opforge::kInt64");
      if (has_backward) p.add(ctx, "has a data-dependent size, and an op with one cannot name a backward op");
    }
    if (o.present_with >= 0 && has_backward)
      p.add(ctx, "exists only when '" + std::string(op.args[o.present_with].name) +
                     "' is given, and an op with such an output cannot name a backward op");
  }
}

/// Rules that read each other's dtypes, or each other's sizes, in a cycle (for_each_read: an
/// input's rules read another's, whose rules read back), which no order of checks can satisfy and
/// no generator can size: one line per cycle, "input 'a': its rules read each other in a cycle: a
/// -> b -> a".
void check_rule_cycles(const OpforgeOpSpec& op, uint8_t reads, Problems& p) {
  enum : uint8_t { kNew, kOnPath, kDone };
  std::vector<uint8_t> state(op.num_args, kNew);
  std::vector<int32_t> path;
  std::function<void(int32_t)> visit = [&](int32_t i) {
    state[i] = kOnPath;
    path.push_back(i);
    std::vector<bool> seen(op.num_args, false);  // for_each_read may name an input more than once
    for_each_read(op, i, reads, [&](int32_t j) {
      if (j < 0 || j >= op.num_args || seen[j]) return;
      seen[j] = true;
      if (state[j] == kNew) {
        visit(j);
      } else if (state[j] == kOnPath) {
        std::string cycle;
        for (auto it = std::find(path.begin(), path.end(), j); it != path.end(); ++it)
          cycle += std::string(op.args[*it].name) + " -> ";
        p.add("input '" + std::string(op.args[j].name) + "': ",
              "its rules read each other in a cycle: " + cycle + op.args[j].name +
                  " (each input's rules may read only inputs whose rules do not read it back)");
      }
    });
    path.pop_back();
    state[i] = kDone;
  };
  for (int32_t i = 0; i < op.num_args; ++i)
    if (state[i] == kNew) visit(i);
}

/// "x, mask": the names of the op's tensor inputs, or "none".
std::string tensor_inputs(const OpforgeOpSpec& op) {
  std::string out;
  for (int32_t i = 0; i < op.num_args; ++i)
    if (op.args[i].kind == OPFORGE_ARG_TENSOR) out += (out.empty() ? "" : ", ") + std::string(op.args[i].name);
  return out.empty() ? "none" : out;
}

/// The placeholders of a run-time kernel's name template (opforge/detail/kernel_name.h): each
/// names the first tensor input's type, a tensor every call has, or a compile-time parameter.
void check_kernel_name(const OpforgeOpSpec& op, const OpforgeKernel& k, const std::string& ctx, Problems& p) {
  std::vector<detail::KernelNamePiece> pieces;
  const bool closed = detail::parse_kernel_name(k.name != nullptr ? k.name : "", pieces);
  for (const auto& piece : pieces) {
    const std::string key = "{" + piece.key + "}";
    if (piece.kind == detail::KernelNamePiece::kTypeOf) {
      const std::string& t = piece.text;
      if (const int32_t o = p.output(t); o >= 0) {
        if (op.outputs[o].present_with >= 0)
          p.add(ctx, key + ": \"" + t + "\" exists only when '" + op.args[op.outputs[o].present_with].name +
                         "' is given, so its dtype cannot name an instantiation");
        continue;
      }
      const int32_t i = p.arg(t);
      if (i < 0 || op.args[i].kind != OPFORGE_ARG_TENSOR)
        p.add(ctx + key + ": ", "\"" + t + "\" names no tensor input (tensor inputs: " + tensor_inputs(op) + ")");
      else if (is_optional(op.args[i]))
        p.add(ctx + key + ": ", "\"" + t +
                                    "\" is an opforge::optional input, which may be absent, so nothing else may refer "
                                    "to it");
    } else if (piece.kind == detail::KernelNamePiece::kParam) {
      const int32_t i = p.arg(piece.text);
      if (i < 0 || op.args[i].kind == OPFORGE_ARG_TENSOR)
        p.add(ctx, key + " names no parameter (use {T}, {T_<tensor>} or {<compile_time param>})");
      else if (!op.args[i].param.compile_time) p.add(ctx, key + " names a parameter that is not opforge::compile_time");
    }
  }
  if (!closed) p.add(ctx, "unclosed '{' in the kernel name \"" + std::string(k.name) + "\"");
}

void check_runtime_kernels(const OpforgeOpSpec& op, Problems& p) {
  bool any_compile_time = false, any_runtime = false;
  for (int32_t i = 0; i < op.num_args; ++i)
    any_compile_time = any_compile_time || (op.args[i].kind != OPFORGE_ARG_TENSOR && op.args[i].param.compile_time);
  for (int32_t k = 0; k < op.num_kernels; ++k) any_runtime = any_runtime || has_runtime_source(op.kernels[k]);
  if (!any_runtime) {
    if (any_compile_time) p.add("", "compile_time parameters need a run-time kernel (.cuda_source())");
    return;
  }
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind == OPFORGE_ARG_TENSOR) continue;
    const std::string ctx = "param '" + std::string(a.name) + "': ";
    if (a.param.compile_time && a.kind != OPFORGE_ARG_INT && a.kind != OPFORGE_ARG_BOOL && a.kind != OPFORGE_ARG_STRING)
      p.add(ctx, "compile_time applies to int64_t, bool and std::string parameters");
    if (!a.param.compile_time && a.kind != OPFORGE_ARG_INT && a.kind != OPFORGE_ARG_BOOL && a.kind != OPFORGE_ARG_FLOAT)
      p.add(ctx, "run-time kernels take int64_t, double and bool arguments; mark it opforge::compile_time");
  }
  for (int32_t k = 0; k < op.num_kernels; ++k) {
    const OpforgeKernel& kernel = op.kernels[k];
    if (!has_runtime_source(kernel)) continue;
    const std::string file = kernel.source;
    const std::string ctx = std::string(backend_step(kernel.backend)) + "(\"" + file + "\"): ";
    if (file.empty() || file[0] == '/' || file.find("..") != std::string::npos)
      p.add(ctx, "the file must be a relative path inside the library's kernel folder");
    check_kernel_name(op, kernel, ctx, p);
  }
}

void check_kernel_dtypes(const OpforgeOpSpec& op, Problems& p) {
  for (int32_t k = 1; k < op.num_kernels; ++k) {
    const OpforgeKernel& kernel = op.kernels[k];
    if (!restricts_dtypes(kernel) || kernel.dtype_arg >= op.num_args) continue;
    if ((kernel.dtypes & admitted_dtypes(op, kernel.dtype_arg)) == 0)
      p.add("kernel_dtypes(\"" + std::string(op.args[kernel.dtype_arg].name) + "\"): ",
            "none of these dtypes is one the input admits, so the kernel would never run");
  }
}

void check_shard_dims(const OpforgeOpSpec& op, Problems& p) {
  const uint32_t dims = sharding_dims(op);
  if (dims == 0) return;
  int32_t first_rank = -1;  // the first tensor input's rank, if fixed
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeTensorSpec& t = op.args[i].tensor;
    if (op.args[i].kind != OPFORGE_ARG_TENSOR) continue;
    first_rank = t.leading_dims ? -1 : t.min_rank == t.max_rank ? t.max_rank : -1;
    break;
  }
  for (int32_t d = 0; d < 32; ++d)
    if (((dims >> d) & 1u) && first_rank >= 0 && d >= first_rank)
      p.add("", "shard_dims(): dim " + std::to_string(d) + " is not a dim of the first tensor input (rank " +
                    std::to_string(first_rank) + ")");
}

/// The problem of `op`'s autocast policy with `combinations`, the dtypes of the kernel that
/// `refuser` names ("its dtype rules", "its cuda kernel's dtypes (kernel_dtypes)"); "" if none.
std::string autocast_problem_with(const OpforgeOpSpec& op, const std::vector<std::vector<int32_t>>& combinations,
                                  const std::string& refuser) {
  const int32_t policy = autocast_policy(op);
  const auto takes = [&](int32_t dtype) { return accepts_floating_as(op, dtype, combinations); };
  if (policy == OPFORGE_AUTOCAST_FLOAT32 && !takes(OPFORGE_DTYPE_FLOAT32))
    return declared_at(op) + "autocast(kFloat32) casts every floating input to float32, which " + refuser + " refuse";
  if (policy == OPFORGE_AUTOCAST_LOWER_PRECISION && !takes(OPFORGE_DTYPE_FLOAT16) && !takes(OPFORGE_DTYPE_BFLOAT16))
    return declared_at(op) + "autocast(kLowerPrecision) casts every floating input to float16 or bfloat16, which " +
           refuser + " refuse";
  if (policy == OPFORGE_AUTOCAST_PROMOTE) {
    // Each call's floating inputs are cast to the widest among them, which the op must then
    // take for all of them.
    std::vector<int32_t> accepted(OPFORGE_NUM_DTYPES, -1);  // -1 not asked yet, 0 refused, 1 taken
    for (const auto& c : combinations) {
      const int32_t widest = promoted_floating(c);
      if (widest < 0) continue;
      if (accepted[widest] < 0) accepted[widest] = takes(widest) ? 1 : 0;
      if (accepted[widest] == 0) {
        std::string inputs;  // "x=float16, w=float32"
        for (int32_t i = 0; i < op.num_args; ++i)
          if (c[i] >= 0) inputs += (inputs.empty() ? "" : ", ") + std::string(op.args[i].name) + "=" + dtype_name(c[i]);
        return declared_at(op) + "autocast(kPromote) casts every floating input to the widest among them, " +
               dtype_name(widest) + " for inputs of " + inputs + ", which " + refuser + " refuse";
      }
    }
  }
  return {};
}

}  // namespace

std::string autocast_problem(const OpforgeOpSpec& op) {
  const int32_t policy = autocast_policy(op);
  if (policy < OPFORGE_AUTOCAST_NONE || policy > OPFORGE_AUTOCAST_PROMOTE)
    return declared_at(op) + "autocast policy " + std::to_string(policy) +
           " is not one of kNone, kFloat32, kLowerPrecision, kPromote";
  if (policy == OPFORGE_AUTOCAST_NONE) return {};
  std::string problem = autocast_problem_with(op, dtype_combinations(op, size_t{1} << 16), "its dtype rules");
  // Autocast on CUDA casts for the CUDA kernel, which may take fewer dtypes (Note [Kernel dtypes]).
  const OpforgeKernel* cuda = device_kernel(op, OPFORGE_DEVICE_CUDA);
  if (problem.empty() && cuda != nullptr && restricts_dtypes(*cuda))
    problem = autocast_problem_with(op, dtype_combinations_on(op, OPFORGE_DEVICE_CUDA, size_t{1} << 16),
                                    "its cuda kernel's dtypes (kernel_dtypes)");
  return problem;
}

std::vector<std::string> tolerance_problems(const OpforgeOpSpec& op) {
  std::vector<std::string> problems;
  std::vector<bool> seen(OPFORGE_NUM_DTYPES, false);
  for (const OpforgeTolerance& t : tolerances(op)) {
    const bool known = t.dtype >= 0 && t.dtype < OPFORGE_NUM_DTYPES;
    const std::string name = known ? dtype_name(t.dtype) : "dtype " + std::to_string(t.dtype);
    if (!is_floating(t.dtype) && !is_float8(t.dtype))
      problems.push_back(declared_at(op) + "tolerance for " + name + ": expected a floating or float8 dtype");
    else if (seen[t.dtype]) problems.push_back(declared_at(op) + "tolerance for " + name + " declared twice");
    else seen[t.dtype] = true;
    for (const auto& [what, value] : {std::pair{"atol", t.atol}, std::pair{"rtol", t.rtol}})
      if (!(std::isfinite(value) && value >= 0))
        problems.push_back(declared_at(op) + "tolerance for " + name + ": expected " + what + " finite and >= 0, got " +
                           std::to_string(value));
  }
  // A factor of 0 bounds the error by 0: the same as declaring none.
  const double factor = tolerance_vs_equivalent(op);
  if (!(std::isfinite(factor) && factor >= 0))
    problems.push_back(declared_at(op) + "tolerance_vs_equivalent: expected a finite factor >= 0, got " +
                       std::to_string(factor));
  else if (factor > 0 && equivalent(op) == nullptr)
    problems.push_back(declared_at(op) +
                       "tolerance_vs_equivalent needs the .equivalent() torch expression it is "
                       "measured against");
  return problems;
}

std::vector<std::string> op_declaration_problems(const OpforgeOpSpec& op) {
  Problems p(op);
  std::set<std::string> seen;  // argument and output names
  check_op_names(op, p);
  check_arguments(op, seen, p);
  check_dtype_cases(op, p);
  check_rule_cases(op, p);
  check_outputs(op, seen, p);
  check_rule_cycles(op, kReadsDtype, p);
  check_rule_cycles(op, kReadsSizes, p);
  check_runtime_kernels(op, p);
  check_kernel_dtypes(op, p);
  check_shard_dims(op, p);
  std::vector<std::string> problems = p.take();
  // The autocast policy is judged over the dtype combinations, which a declaration with other
  // problems (an empty dtype set) may not describe.
  if (problems.empty())
    if (std::string a = autocast_problem(op); !a.empty()) problems.push_back(std::move(a));
  for (std::string& t : tolerance_problems(op)) problems.push_back(std::move(t));
  return problems;
}

std::vector<std::string> class_declaration_problems(const OpforgeClassSpec& c) {
  std::vector<std::string> problems;
  const std::string at = detail::declared_at(c.file, c.line, qualified_name(c));
  auto problem = [&](const std::string& what) { problems.push_back(at + what); };
  if (!is_identifier(c.name) || starts_with_two_underscores(c.name))
    problem("a class name must be an identifier that does not start with \"__\"");
  if (c.constructor != nullptr && c.num_fields > 0)
    problem(
        ".field() and .constructor() together: with a constructor op, the object's fields are its outputs and "
        "the arguments a method takes");
  if (c.num_methods == 0) problem("no .method(): a class is used through its methods");
  std::set<std::string> fields;
  for (int32_t i = 0; i < c.num_fields; ++i) {
    const std::string f = c.field_names[i];
    if (!is_identifier(f) || starts_with_two_underscores(f))
      problem("field \"" + f + "\": expected an identifier that does not start with \"__\"");
    else if (std::string why = keyword_problem(f); !why.empty()) problem("field " + why);
    else if (!fields.insert(f).second) problem("field \"" + f + "\" declared twice");
  }
  std::set<std::string> methods;
  for (int32_t m = 0; m < c.num_methods; ++m) {
    const std::string name = c.methods[m].name;
    if (!is_identifier(name) || starts_with_two_underscores(name))
      problem("method \"" + name +
              "\": expected an identifier that does not start with \"__\" (torch reserves __init__, __getstate__, "
              "__setstate__ and __obj_flatten__ for what opforge derives)");
    else if (!methods.insert(name).second) problem("method \"" + name + "\" declared twice");
    else if (fields.count(name))
      problem("method \"" + name + "\" has the name of a field (both are attributes of the object)");
  }
  return problems;
}

std::vector<std::string> library_declaration_problems(const OpforgeLibrary& lib) {
  // The builder's lines, by the op whose site they start with.
  std::vector<std::vector<std::string>> built(static_cast<size_t>(lib.num_ops));
  std::vector<std::string> unplaced;
  const std::string text = lib.error != nullptr ? lib.error : "";
  for (size_t start = 0, end; start < text.size(); start = end + 1) {
    end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end == start) continue;
    const std::string line = text.substr(start, end - start);
    int32_t owner = -1;
    for (int32_t k = 0; k < lib.num_ops && owner < 0; ++k)
      if (line.rfind(declared_at(*lib.ops[k]), 0) == 0) owner = k;
    (owner >= 0 ? built[static_cast<size_t>(owner)] : unplaced).push_back(line);
  }
  std::vector<std::string> problems;
  const auto twice = [](const std::string& at, const char* file, int32_t line) {
    return at + "declared twice (first at " + file + ":" + std::to_string(line) + ")";
  };
  std::map<std::string, const OpforgeOpSpec*> ops;
  for (int32_t k = 0; k < lib.num_ops; ++k) {
    const OpforgeOpSpec& op = *lib.ops[k];
    for (std::string& line : built[static_cast<size_t>(k)]) problems.push_back(std::move(line));
    for (std::string& line : op_declaration_problems(op)) problems.push_back(std::move(line));
    if (auto [it, fresh] = ops.emplace(qualified_name(op), &op); !fresh)
      problems.push_back(twice(declared_at(op), it->second->file, it->second->line));
  }
  for (std::string& line : unplaced) problems.push_back(std::move(line));
  std::map<std::string, const OpforgeClassSpec*> classes;
  for (const OpforgeClassSpec* c : library_classes(lib)) {
    for (std::string& line : class_declaration_problems(*c)) problems.push_back(std::move(line));
    if (auto [it, fresh] = classes.emplace(qualified_name(*c), c); !fresh)
      problems.push_back(
          twice(detail::declared_at(c->file, c->line, qualified_name(*c)), it->second->file, it->second->line));
  }
  if (!problems.empty()) return problems;
  for (std::string& line : check_backward_ops(lib)) problems.push_back(std::move(line));
  for (std::string& line : check_classes(lib)) problems.push_back(std::move(line));
  return problems;
}

}  // namespace opforge::core
