// Input checks and output shape rules, evaluated over any integer type.
//
// Adapters describe the arguments of one call as ArgInfo<Int> and call check_args() and
// output_shapes(). `Int` is int64_t at run time and the framework's symbolic integer in a Meta
// kernel (c10::SymInt for torch), so one implementation serves both and dynamic dims stay
// symbolic (see Note [Shape expressions] in opforge/expr.h). An adapter with a symbolic type
// specialises IntOps for it.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "opforge/c_api.h"
#include "opforge/detail/names.h"
#include "opforge/detail/str.h"
#include "param_rules.h"
#include "records.h"
#include "schema.h"
#include "span.h"

namespace opforge::core {

/// Integer operations the shape rules need; specialise for a symbolic integer type.
template <class Int>
struct IntOps {
  static Int floordiv(const Int& a, const Int& b) { return a / b; }
  static Int min(const Int& a, const Int& b) { return std::min(a, b); }
  static Int max(const Int& a, const Int& b) { return std::max(a, b); }
  static bool eq(const Int& a, const Int& b) { return a == b; }
  static bool divisible(const Int& a, int64_t k) { return a % k == 0; }
  /// Whether `a <op> b` holds, `op` one of OPFORGE_EXPR_EQ .. OPFORGE_EXPR_GE.
  static bool compare(int32_t op, const Int& a, const Int& b) {
    switch (op) {
      case OPFORGE_EXPR_EQ:
        return a == b;
      case OPFORGE_EXPR_NE:
        return a != b;
      case OPFORGE_EXPR_LT:
        return a < b;
      case OPFORGE_EXPR_LE:
        return a <= b;
      case OPFORGE_EXPR_GT:
        return a > b;
      default:
        return a >= b;
    }
  }
  static std::string str(const Int& a) { return opforge::detail::cat(a); }
  /// The value of `a` (a symbolic integer specialises on it: used only to report a failed check).
  static int64_t concrete(const Int& a) { return static_cast<int64_t>(a); }
};

/// One argument of a call: a tensor's dtype, device and sizes, or a parameter value.
template <class Int>
struct ArgInfo {
  // tensors
  // Labels are static strings, so describing a call allocates nothing for them (it runs on
  // every op call); device strings are formatted only for a message.
  int32_t dtype = -1;                   // OpforgeDtype, or -1 for a dtype opforge does not know
  const char* dtype_label = "unknown";  // the framework's name for the dtype, used in messages
  const char* device_type = "cpu";      // the framework's device type name ("cuda")
  int32_t device_index = -1;            // -1: none
  // The tensor's sizes, borrowed from the caller (the framework's tensor or a buffer of its own)
  // for as long as the ArgInfo is in use: no copy on the per-call path.
  Span<const Int> sizes;
  bool defined = true;  // false: no tensor (None), e.g. an optional input left out

  bool same_device(const ArgInfo& o) const {
    return device_index == o.device_index && std::string_view(device_type) == o.device_type;
  }
  std::string device() const {
    return device_index < 0 ? std::string(device_type) : std::string(device_type) + ":" + std::to_string(device_index);
  }
  // parameters
  OpforgeValue value{};
  /// A size parameter (`SymInt`) whose value is symbolic while a framework traces: rules read
  /// this instead of value.i, and its own range and choices are checked when the call runs.
  std::optional<Int> symbolic;
};

template <class Int>
std::string sizes_string(Span<const Int> sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + IntOps<Int>::str(sizes[i]);
  return s + "]";
}

inline std::string dtype_set_string(uint32_t bits) {
  std::string s;
  int n = 0;
  for (int32_t d = 0; d < OPFORGE_NUM_DTYPES; ++d) {
    if (!((bits >> d) & 1u)) continue;
    s += (n++ ? ", " : "") + std::string(dtype_name(d));
  }
  return n == 1 ? s : "one of {" + s + "}";
}

/// Value of expression `e` for this call, or nullopt if it reads a dim that does not exist
/// (the argument's own rank error is reported instead), divides by zero, or, over int64,
/// overflows (then `*overflow`, if given, is set: a size or rule past 2^63 is refused, never
/// wrapped).
template <class Int>
std::optional<Int> eval_expr(const OpforgeExpr& e, Span<const ArgInfo<Int>> args, bool* overflow = nullptr) {
  // The operand stack, at most num_nodes deep: inline for the usual rule (this runs on every call).
  constexpr int32_t kInline = 16;
  Int inline_stack[kInline];
  std::vector<Int> heap_stack(e.num_nodes > kInline ? e.num_nodes : 0);
  Int* const st = e.num_nodes > kInline ? heap_stack.data() : inline_stack;
  int32_t top = 0;
  for (int32_t i = 0; i < e.num_nodes; ++i) {
    const OpforgeExprNode& n = e.nodes[i];
    switch (n.op) {
      case OPFORGE_EXPR_CONST:
        st[top++] = Int(n.value);
        continue;
      case OPFORGE_EXPR_PARAM:
        st[top++] = args[n.arg].symbolic ? *args[n.arg].symbolic : Int(args[n.arg].value.i);
        continue;
      case OPFORGE_EXPR_DIM: {
        const auto& s = args[n.arg].sizes;
        const int64_t r = static_cast<int64_t>(s.size());
        const int64_t d = n.value < 0 ? n.value + r : n.value;
        if (d < 0 || d >= r) return std::nullopt;
        st[top++] = s[d];
        continue;
      }
      default:
        break;
    }
    if (top < 2) return std::nullopt;
    Int b = std::move(st[--top]);
    Int a = std::move(st[--top]);
    if constexpr (std::is_integral_v<Int>) {
      if ((n.op == OPFORGE_EXPR_FLOORDIV || n.op == OPFORGE_EXPR_CEILDIV || n.op == OPFORGE_EXPR_MOD) && b == 0)
        return std::nullopt;
    }
    if constexpr (std::is_integral_v<Int>) {
      Int r{};
      const bool wrapped = n.op == OPFORGE_EXPR_ADD       ? __builtin_add_overflow(a, b, &r)
                           : n.op == OPFORGE_EXPR_SUB     ? __builtin_sub_overflow(a, b, &r)
                           : n.op == OPFORGE_EXPR_MUL     ? __builtin_mul_overflow(a, b, &r)
                           : n.op == OPFORGE_EXPR_CEILDIV ? __builtin_add_overflow(a, b - Int(1), &r)
                                                          : false;
      if (wrapped) {
        if (overflow) *overflow = true;
        return std::nullopt;
      }
    }
    switch (n.op) {
      case OPFORGE_EXPR_ADD:
        st[top++] = a + b;
        break;
      case OPFORGE_EXPR_SUB:
        st[top++] = a - b;
        break;
      case OPFORGE_EXPR_MUL:
        st[top++] = a * b;
        break;
      case OPFORGE_EXPR_FLOORDIV:
        st[top++] = IntOps<Int>::floordiv(a, b);
        break;
      case OPFORGE_EXPR_CEILDIV:
        st[top++] = IntOps<Int>::floordiv(a + b - Int(1), b);
        break;
      case OPFORGE_EXPR_MIN:
        st[top++] = IntOps<Int>::min(a, b);
        break;
      case OPFORGE_EXPR_MAX:
        st[top++] = IntOps<Int>::max(a, b);
        break;
      case OPFORGE_EXPR_MOD:
        st[top++] = a - IntOps<Int>::floordiv(a, b) * b;
        break;
      default:
        return std::nullopt;
    }
  }
  if (top != 1) return std::nullopt;
  return st[0];
}

namespace detail {
inline std::string number(double v) { return opforge::detail::cat(v); }

/// Appends "name: expected one of ..., got ..." unless `s` is one of the parameter's choices
/// (those of an int parameter are stored in decimal; strings are quoted in the message). Builds
/// no string when the value is allowed: this runs on every call.
inline void check_choice(const OpforgeArgSpec& a, std::string_view s, bool quote, std::vector<std::string>& out) {
  for (int32_t c = 0; c < a.param.num_choices; ++c)
    if (s == a.param.choices[c]) return;
  const std::string q = quote ? "'" : "";
  std::string list;
  for (int32_t c = 0; c < a.param.num_choices; ++c) list += (c ? ", " : "") + q + a.param.choices[c] + q;
  out.push_back(std::string(a.name) + ": expected one of " + list + ", got " + q + std::string(s) + q);
}

inline void check_range(const OpforgeArgSpec& a, double v, const std::string& what, std::vector<std::string>& out) {
  const OpforgeParamSpec& p = a.param;
  if ((p.has_min && v < p.min) || (p.has_max && v > p.max) || v != v) {
    std::string want = p.has_min && p.has_max ? "a value in [" + number(p.min) + ", " + number(p.max) + "]"
                       : p.has_min            ? "a value >= " + number(p.min)
                       : p.has_max            ? "a value <= " + number(p.max)
                                              : std::string("a number");  // NaN, for a parameter without bounds
    out.push_back(std::string(a.name) + what + ": expected " + want + ", got " + number(v));
  }
}
}  // namespace detail

/// Checks one parameter value against its range and choices; appends one line per problem.
inline void check_param(const OpforgeArgSpec& a, const OpforgeValue& v, std::vector<std::string>& out) {
  switch (a.kind) {
    case OPFORGE_ARG_INT:
      detail::check_range(a, static_cast<double>(v.i), "", out);
      if (a.param.num_choices > 0) {
        char digits[24];
        const auto end = std::to_chars(digits, digits + sizeof(digits), v.i).ptr;
        detail::check_choice(a, std::string_view(digits, static_cast<size_t>(end - digits)), false, out);
      }
      break;
    case OPFORGE_ARG_FLOAT:
      detail::check_range(a, v.f, "", out);
      break;
    case OPFORGE_ARG_INT_LIST:
      for (size_t k = 0; k < v.len; ++k)
        detail::check_range(a, static_cast<double>(v.ints[k]), "[" + std::to_string(k) + "]", out);
      break;
    case OPFORGE_ARG_FLOAT_LIST:
      for (size_t k = 0; k < v.len; ++k) detail::check_range(a, v.floats[k], "[" + std::to_string(k) + "]", out);
      break;
    case OPFORGE_ARG_STRING:
      if (a.param.num_choices > 0) detail::check_choice(a, std::string_view(v.s, v.len), true, out);
      break;
    default:
      break;
  }
}

/// Whether `dtype` (an OpforgeDtype, or -1 for one opforge does not know) is in `s`'s set.
inline bool dtype_allowed(const OpforgeTensorSpec& s, int32_t dtype) {
  return dtype >= 0 && ((s.dtypes >> dtype) & 1u);
}
/// "expected dtype one of {...}, got <label>".
inline std::string expected_dtype(const OpforgeTensorSpec& s, std::string_view label) {
  return "expected dtype " + dtype_set_string(s.dtypes) + ", got " + std::string(label);
}
/// Whether `dtype` passes a same_dtype rule whose model tensor has `model_dtype`: equal to it
/// (and in the input's own set), or one of the rule's alternatives.
inline bool same_dtype_allowed(const OpforgeTensorSpec& s, int32_t model_dtype, int32_t dtype) {
  return (dtype == model_dtype && dtype_allowed(s, dtype)) || (dtype >= 0 && ((s.dtype_alternatives >> dtype) & 1u));
}
/// Why a tensor argument whose dtype rule is `s` (its own, or the one a parameter's value selects:
/// ruled_spec) may not have `dtype` (labelled `label` in the message), or "" if it may: its own
/// set, or its same_dtype rule against the model tensor's `model_dtype` (labelled `model_label`).
/// "expected dtype bfloat16 (the dtype of x) or float32, got float16"; `where` (" where
/// kv_cache_dtype is 'fp8'") follows the expectation of a rule a parameter's value selected.
inline std::string dtype_problem(const OpforgeOpSpec& op, const OpforgeTensorSpec& s, int32_t dtype,
                                 std::string_view label, int32_t model_dtype, std::string_view model_label,
                                 std::string_view where = {}) {
  if (s.dtype_like < 0 ? dtype_allowed(s, dtype) : same_dtype_allowed(s, model_dtype, dtype)) return {};
  const std::string got = std::string(where) + ", got " + std::string(label);  // built for a problem only
  if (s.dtype_like < 0 || model_dtype == dtype) return "expected dtype " + dtype_set_string(s.dtypes) + got;
  std::string want =
      "expected dtype " + std::string(model_label) + " (the dtype of " + op.args[s.dtype_like].name + ")";
  // The model tensor's own dtype is named once, not again among the alternatives.
  const auto others = model_dtype >= 0 ? s.dtype_alternatives & ~(decltype(s.dtype_alternatives){1} << model_dtype)
                                       : s.dtype_alternatives;
  if (others) want += " or " + dtype_set_string(others);
  return want + got;
}
/// The line for a dtype `label` of kernel `k`'s dtype_arg that `k` does not take (Note [Kernel
/// dtypes] in opforge/op_builder.h), naming those it takes of the ones the argument admits: "q: expected
/// dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no other), got float32".
inline std::string kernel_dtype_problem(const OpforgeOpSpec& op, const OpforgeKernel& k, std::string_view label) {
  const std::string device = device_type_name(k.device_type);
  const uint32_t takes = k.dtypes & admitted_dtypes(op, k.dtype_arg);  // of those a call may have
  return std::string(op.args[k.dtype_arg].name) + ": expected dtype " + dtype_set_string(takes) + " on " + device +
         " (its " + device + " kernel takes no other), got " + std::string(label);
}
/// Index into a tensor of rank `rank` of the first dim its shape rule's `dims` describe: 0, or
/// with opforge::leading_dims, rank - num_dims.
inline int32_t first_ruled_dim(const OpforgeTensorSpec& s, int32_t rank) {
  return s.leading_dims ? rank - s.num_dims : 0;
}
/// Whether a dim rule is opforge::multiple_of(k) (k in its one node's value).
inline bool is_multiple_of(const OpforgeExpr& e) {
  return e.num_nodes == 1 && e.nodes[0].op == OPFORGE_EXPR_MULTIPLE_OF;
}

/// True if `e` reads a dim of a tensor the call left out (an optional input).
template <class Int>
bool reads_undefined(const OpforgeExpr& e, Span<const ArgInfo<Int>> args) {
  for (int32_t k = 0; k < e.num_nodes; ++k)
    if (e.nodes[k].op == OPFORGE_EXPR_DIM && !args[e.nodes[k].arg].defined) return true;
  return false;
}

/// Checks the op's cross-argument rules (`.require(...)`) and appends "expected <rule>, got
/// <values>" for each that fails. A rule gated on an optional input's presence the call does not
/// have (opforge::when_given, opforge::unless_given), a rule that reads a tensor left out, or one for which
/// `skip(expr)` says a side reads an argument already reported bad, is not checked.
template <class Int, class Skip>
void rule_problems(const OpforgeOpSpec& op, Span<const ArgInfo<Int>> args, std::vector<std::string>& out, Skip&& skip) {
  for (int32_t k = 0; k < num_rules(op); ++k) {
    const OpforgeRule& rule = op.rules[k];
    if (rule.when_arg >= 0 && args[rule.when_arg].defined != (rule.when_given != 0)) continue;
    if (skip(rule.lhs) || skip(rule.rhs) || reads_undefined(rule.lhs, args) || reads_undefined(rule.rhs, args))
      continue;
    bool overflow = false;
    const std::optional<Int> lhs = eval_expr(rule.lhs, args, &overflow), rhs = eval_expr(rule.rhs, args, &overflow);
    if (overflow) {
      out.push_back("expected " + rule_string(op, rule) + ", got a side that overflows int64");
      continue;
    }
    if (!lhs || !rhs || IntOps<Int>::compare(rule.op, *lhs, *rhs)) continue;
    out.push_back("expected " + rule_string(op, rule) + ", got " + IntOps<Int>::str(*lhs) + " " +
                  comparison_symbol(rule.op) + " " + IntOps<Int>::str(*rhs));
  }
}

/// The value of parameter argument `p` of a call (a symbolic int parameter at its value).
template <class Int>
OpforgeValue ruling_value(const ArgInfo<Int>& p) {
  OpforgeValue v = p.value;
  if (p.symbolic) v.i = IntOps<Int>::concrete(*p.symbolic);
  return v;
}
/// The value of parameter `p` of a call as OpforgeDtypeCase::value spells it.
template <class Int>
std::string ruling_text(const OpforgeOpSpec& op, Span<const ArgInfo<Int>> args, int32_t p) {
  return param_value_text(op.args[p], ruling_value(args[p]));
}

/// Checks every argument -- tensors (dtype, device, rank, shape, leading dims) and parameters
/// (range, choices), each after the tensors its rules read -- then the op's cross-argument rules
/// (`.require(...)`, those gated on an optional input's presence where it applies), and
/// appends one line per problem in the form "name: expected ..., got ..." (a rule's:
/// "expected <rule>, got <values>"). An optional tensor that is not defined passes unchecked (no
/// other argument's rule reads it); any other undefined tensor is a problem.
template <class Int>
void check_args(const OpforgeOpSpec& op, Span<const ArgInfo<Int>> args, std::vector<std::string>& out) {
  int32_t first = -1;  // the tensor that sets the device
  // A rule that reads a tensor whose dtype (or rank and shape) was already reported as bad would
  // only repeat that problem; rules reading its other, good properties still run.
  constexpr uint8_t kBadDtype = 1, kBadShape = 2;
  constexpr int32_t kInline = 64;  // checked on every call: no allocation for the usual op
  uint8_t inline_bad[kInline] = {};
  std::vector<uint8_t> heap_bad(op.num_args > kInline ? op.num_args : 0, 0);
  uint8_t* const bad = op.num_args > kInline ? heap_bad.data() : inline_bad;
  auto reads_bad = [&](const OpforgeExpr& e) {
    for (int32_t k = 0; k < e.num_nodes; ++k)
      if (e.nodes[k].op == OPFORGE_EXPR_DIM && (bad[e.nodes[k].arg] & kBadShape)) return true;
    return false;
  };
  for (int32_t i = 0; i < op.num_args && first < 0; ++i)
    if (op.args[i].kind == OPFORGE_ARG_TENSOR && args[i].defined) first = i;
  const auto check_one = [&](int32_t i) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind != OPFORGE_ARG_TENSOR) {
      if (!args[i].symbolic) {
        check_param(a, args[i].value, out);
        return;
      }
      // A symbolic size parameter: its range becomes guards (deferred checks where unbacked);
      // one that fails, or choices, need its value, which the message reports.
      const Int& v = *args[i].symbolic;
      const bool in_range =
          (!a.param.has_min ||
           IntOps<Int>::compare(OPFORGE_EXPR_GE, v, Int(static_cast<int64_t>(std::ceil(a.param.min))))) &&
          (!a.param.has_max ||
           IntOps<Int>::compare(OPFORGE_EXPR_LE, v, Int(static_cast<int64_t>(std::floor(a.param.max)))));
      if (!in_range || a.param.num_choices > 0) {
        OpforgeValue known = args[i].value;
        known.i = IntOps<Int>::concrete(v);
        check_param(a, known, out);
      }
      return;
    }
    const ArgInfo<Int>& t = args[i];
    if (!t.defined) {
      if (!is_optional(a)) {
        out.push_back(std::string(a.name) + ": expected a tensor, got None");
        bad[i] = kBadDtype | kBadShape;
      }
      return;
    }
    // A shape rule that follows a parameter: the one its value selects, named in its messages.
    // (Copied only where a parameter rules: this runs on every call.)
    const int32_t shape_ruling = shape_ruling_param(op, i);
    OpforgeTensorSpec shaped;
    const OpforgeTensorSpec& s =
        shape_ruling < 0 ? a.tensor
                         : (shaped = ruled_shape(op, i, a.tensor, [&](int32_t p) { return ruling_text(op, args, p); }));
    const std::string where =
        shape_ruling < 0 ? std::string()
                         : " where " + param_value_phrase(op.args[shape_ruling], ruling_value(args[shape_ruling]));
    std::vector<std::string> why;
    // A dtype rule that follows a parameter: the one its value selects (parameters are constants
    // while a framework traces; a symbolic int parameter is read at its value).
    const int32_t ruling = ruling_param(op, i);
    OpforgeTensorSpec ruled;
    const OpforgeTensorSpec& ds = ruling < 0 ? s : (ruled = ruled_spec(op, i, ruling_text(op, args, ruling)));
    if (ds.dtype_like < 0 || !(bad[ds.dtype_like] & kBadDtype)) {  // same_dtype: judged against that tensor's
      const ArgInfo<Int>& model = args[ds.dtype_like < 0 ? i : ds.dtype_like];
      std::string w = dtype_problem(op, ds, t.dtype, t.dtype_label, model.dtype, model.dtype_label);
      if (!w.empty() && ruling >= 0)
        w = dtype_problem(op, ds, t.dtype, t.dtype_label, model.dtype, model.dtype_label,
                          " where " + param_value_phrase(op.args[ruling], ruling_value(args[ruling])));
      if (!w.empty()) why.push_back(std::move(w));
    }
    if (!why.empty()) bad[i] |= kBadDtype;
    if (i != first && !args[first].same_device(t)) {
      why.push_back("expected device " + args[first].device() + " (the device of " + op.args[first].name + "), got " +
                    t.device());
    }
    const size_t before_shape = why.size();
    const int32_t r = static_cast<int32_t>(t.sizes.size());
    bool rank_ok = true;
    if ((s.min_rank >= 0 && r < s.min_rank) || (s.max_rank >= 0 && r > s.max_rank)) {
      rank_ok = false;
      std::string want = s.min_rank == s.max_rank ? std::to_string(s.min_rank)
                         : s.max_rank < 0         ? ">= " + std::to_string(s.min_rank)
                         : s.min_rank < 0
                             ? "<= " + std::to_string(s.max_rank)
                             : "in [" + std::to_string(s.min_rank) + ", " + std::to_string(s.max_rank) + "]";
      why.push_back("expected rank " + want + where + ", got rank " + std::to_string(r) + " (shape " +
                    sizes_string(t.sizes) + ")");
    }
    if (rank_ok && s.num_dims > 0) {
      // Compare first; build the message only for a mismatch (this runs on every call).
      const int32_t at = first_ruled_dim(s, r);
      bool ok = true, skip = false;
      std::vector<std::optional<Int>> values(s.num_dims);
      bool computed = false;  // some dim has a value to show (not only any / multiple_of)
      for (int32_t d = 0; d < s.num_dims && !skip; ++d) {
        if (s.dims[d].num_nodes == 0) continue;
        if (is_multiple_of(s.dims[d])) {
          if (!IntOps<Int>::divisible(t.sizes[at + d], s.dims[d].nodes[0].value)) ok = false;
          continue;
        }
        computed = true;
        skip = reads_bad(s.dims[d]);
        if (skip) break;
        bool overflow = false;
        values[d] = eval_expr(s.dims[d], args, &overflow);
        if (overflow || (values[d] && !IntOps<Int>::eq(*values[d], t.sizes[at + d]))) ok = false;
      }
      if (!ok && !skip) {
        std::string rule = s.leading_dims ? "[*, " : "[", want = rule;
        for (int32_t d = 0; d < s.num_dims; ++d) {
          const bool open = s.dims[d].num_nodes == 0 || is_multiple_of(s.dims[d]);
          rule += (d ? ", " : "") + expr_string(op, s.dims[d]);
          want += (d ? ", " : "") + (open        ? expr_string(op, s.dims[d])
                                     : values[d] ? IntOps<Int>::str(*values[d])
                                                 : std::string("?"));
        }
        why.push_back("expected shape " + rule + "]" + (computed ? " = " + want + "]" : std::string()) + where +
                      ", got " + sizes_string(t.sizes));
      }
    }
    if (rank_ok && s.shape_like >= 0 && !(bad[s.shape_like] & kBadShape)) {
      const auto& want = args[s.shape_like].sizes;
      bool same = want.size() == t.sizes.size();
      for (size_t d = 0; same && d < want.size(); ++d) same = IntOps<Int>::eq(want[d], t.sizes[d]);
      if (!same)
        why.push_back("expected shape " + sizes_string(want) + " (the shape of " + op.args[s.shape_like].name +
                      "), got " + sizes_string(t.sizes));
    }
    if (rank_ok && s.leading_dims && s.leading_like >= 0 && !(bad[s.leading_like] & kBadShape) &&
        args[s.leading_like].defined) {
      const auto& model = args[s.leading_like].sizes;
      const int32_t own = r - s.num_dims,
                    theirs = static_cast<int32_t>(model.size()) - op.args[s.leading_like].tensor.num_dims;
      bool same = own == theirs && theirs >= 0;
      for (int32_t d = 0; same && d < own; ++d) same = IntOps<Int>::eq(model[d], t.sizes[d]);
      if (!same)
        why.push_back("expected leading dims " +
                      sizes_string(Span<const Int>(model.data(), static_cast<size_t>(theirs < 0 ? 0 : theirs))) +
                      " (those of " + op.args[s.leading_like].name + ", shape " + sizes_string(model) + "), got " +
                      sizes_string(Span<const Int>(t.sizes.data(), static_cast<size_t>(own))) + " (shape " +
                      sizes_string(t.sizes) + ")");
    }
    if (why.size() > before_shape) bad[i] |= kBadShape;
    for (const auto& w : why) out.push_back(std::string(a.name) + ": " + w);
  };
  // Each argument is checked after the tensors its rules read, so that a rule over a tensor
  // already reported bad is skipped, whichever was declared first.
  uint8_t inline_done[kInline] = {};
  std::vector<uint8_t> heap_done(op.num_args > kInline ? op.num_args : 0, 0);
  in_rule_order(op, kReadsDtype | kReadsSizes, op.num_args > kInline ? heap_done.data() : inline_done, check_one);
  // Note [Kernel dtypes] in opforge/op_builder.h: the kernel of the call's device may take fewer dtypes
  // than the declaration admits (meta, where a trace runs, has no kernel: not checked).
  bool restricted = false;  // (most ops: no device name is looked at on their calls)
  for (int32_t k = 1; k < op.num_kernels; ++k) restricted = restricted || restricts_dtypes(op.kernels[k]);
  if (first >= 0 && restricted) {
    const int32_t device = device_type_code(args[first].device_type);
    const OpforgeKernel* k = device < 0 ? nullptr : device_kernel(op, device);
    if (k != nullptr && restricts_dtypes(*k) && k->dtype_arg < op.num_args) {
      const int32_t i = k->dtype_arg;
      if (args[i].defined && !(bad[i] & kBadDtype) && !kernel_takes(*k, i, args[i].dtype))
        out.push_back(kernel_dtype_problem(op, *k, args[i].dtype_label));
    }
  }
  rule_problems<Int>(op, args, out, [&](const OpforgeExpr& e) { return reads_bad(e); });
}

/// The message for a call (or a precompile request) that failed its checks: the op's schema
/// (its out= overload's for a call of that overload), then one line per problem, indented.
inline std::string invalid_arguments_message(const OpforgeOpSpec& op, const std::vector<std::string>& lines,
                                             bool out_overload = false) {
  std::string m = (out_overload ? qualified_out_schema(op) : qualified_schema(op)) + ": invalid arguments";
  for (const auto& l : lines) m += "\n  " + l;
  return m;
}

/// Shape and dtype of one output for this call; `defined` false for an output that exists only
/// with an optional input the call left out (OpforgeOutputSpec::present_with). Sizes: a
/// std::vector-like container of Int (assign, push_back, operator[], data, size), which an adapter
/// may give inline storage.
template <class Int, class Sizes = std::vector<Int>>
struct OutputInfo {
  int32_t dtype = -1;
  Sizes sizes;
  bool defined = true;
};

/// Evaluates every output's shape and dtype rule (an output that exists only with an optional
/// input the call left out is undefined) into `outs`, a std::vector-like container of
/// OutputInfo<Int> (clear, push_back, operator[]: an adapter may pass one with inline storage).
/// Returns false and appends lines on failure (a rule that reads a missing dim, or gives a
/// negative size on concrete input).
template <class Int, class Outs>
bool output_shapes(const OpforgeOpSpec& op, Span<const ArgInfo<Int>> args, Outs& outs,
                   std::vector<std::string>& errors) {
  outs.clear();
  const bool ruled = !rule_cases(op).empty();  // Note [Rules that follow a parameter]
  for (int32_t i = 0; i < op.num_outputs; ++i) {
    OpforgeOutputSpec selected;  // copied only where a parameter rules
    const OpforgeOutputSpec& o =
        ruled ? (selected = ruled_output(op, i, [&](int32_t p) { return ruling_text(op, args, p); })) : op.outputs[i];
    typename Outs::value_type info;
    if (o.present_with >= 0 && !args[o.present_with].defined) {
      info.defined = false;
      outs.push_back(std::move(info));
      continue;
    }
    info.dtype = o.dtype_like >= 0 ? args[o.dtype_like].dtype : o.dtype;
    if (o.shape_like >= 0) info.sizes.assign(args[o.shape_like].sizes.begin(), args[o.shape_like].sizes.end());
    const int64_t r = static_cast<int64_t>(info.sizes.size());
    for (int32_t d = 0; d < o.num_dims; ++d) {
      bool overflow = false;
      std::optional<Int> v = eval_expr(o.dims[d], args, &overflow);
      if (!v) {
        errors.push_back(std::string("output ") + o.name + ": the shape rule " + expr_string(op, o.dims[d]) +
                         (overflow ? " overflows int64 for these inputs" : " cannot be evaluated for these inputs"));
        return false;
      }
      if constexpr (std::is_integral_v<Int>) {
        if (*v < 0) {
          errors.push_back(std::string("output ") + o.name + ": the shape rule " + expr_string(op, o.dims[d]) +
                           " gives a negative size " + std::to_string(*v));
          return false;
        }
      }
      if (o.shape_like < 0) {
        info.sizes.push_back(*v);
        continue;
      }
      const int64_t k = o.dim_index[d] < 0 ? o.dim_index[d] + r : o.dim_index[d];
      if (k < 0 || k >= r) {
        errors.push_back(std::string("output ") + o.name + ": with_dim(" + std::to_string(o.dim_index[d]) +
                         ") is out of range for rank " + std::to_string(r));
        return false;
      }
      info.sizes[k] = *v;
    }
    if constexpr (std::is_integral_v<Int>) {
      Int numel = 1;
      for (const Int& n : info.sizes)
        if (__builtin_mul_overflow(numel, n, &numel)) {
          const Span<const Int> sizes(info.sizes.data(), info.sizes.size());
          errors.push_back(std::string("output ") + o.name + ": shape " + sizes_string<Int>(sizes) +
                           " has more elements than int64 counts");
          return false;
        }
    }
    outs.push_back(std::move(info));
  }
  return true;
}

/// Checks a call's arguments and evaluates its output rules: returns "" and fills `outs` (as
/// output_shapes), or returns the message (invalid_arguments_message) an adapter raises as its
/// framework's invalid-argument error.
template <class Int, class Outs>
std::string check_call(const OpforgeOpSpec& op, Span<const ArgInfo<Int>> args, Outs& outs) {
  std::vector<std::string> errors;
  check_args<Int>(op, args, errors);
  if (errors.empty()) output_shapes<Int>(op, args, outs, errors);
  return errors.empty() ? std::string() : invalid_arguments_message(op, errors);
}

/// check_call for a call of the op's out= overload, which also gets the caller's out tensors
/// (`given`, one per output: dtype and device; their sizes may differ, the adapter resizes them
/// by its framework's rules). An out tensor must have the dtype its output rule gives and the
/// device of the call's first tensor input.
template <class Int, class Outs>
std::string check_out_call(const OpforgeOpSpec& op, Span<const ArgInfo<Int>> args, Span<const ArgInfo<Int>> given,
                           Outs& outs) {
  std::vector<std::string> errors;
  check_args<Int>(op, args, errors);
  if (errors.empty()) output_shapes<Int>(op, args, outs, errors);
  int32_t first = 0;
  while (first < op.num_args && !(op.args[first].kind == OPFORGE_ARG_TENSOR && args[first].defined)) ++first;
  for (size_t k = 0; errors.empty() && k < given.size(); ++k) {
    const std::string name = op.outputs[k].name;
    if (!given[k].defined) {
      errors.push_back(name + ": expected a tensor, got None");
      continue;
    }
    if (given[k].dtype != outs[k].dtype)
      errors.push_back(name + ": expected dtype " + dtype_name(outs[k].dtype) + " (the dtype its rule gives), got " +
                       given[k].dtype_label);
    if (first < op.num_args && !args[first].same_device(given[k]))
      errors.push_back(name + ": expected device " + args[first].device() + " (the device of " + op.args[first].name +
                       "), got " + given[k].device());
  }
  return errors.empty() ? std::string() : invalid_arguments_message(op, errors, /*out_overload=*/true);
}

}  // namespace opforge::core
