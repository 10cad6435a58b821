// The support code compiled into every op library: turns OPFORGE_OP declarations into the C
// ABI records of opforge/c_api.h and exports `opforge_library_v1`. It reports only what keeps it
// from writing a record that says what was declared; the core checks the records' meaning at
// load (Note [Where a rule goes] in src/core/library.h).
//
// Compiled with hidden visibility (opforge_add_library sets it), so each op library keeps its
// own registry even when several are loaded into one process.
#include <algorithm>
#include <deque>
#include <map>

#include "opforge/detail/names.h"
#include "opforge/op.h"

namespace opforge::detail {

struct OpDef::Storage {
  std::deque<std::vector<OpforgeExprNode>> nodes;
  std::deque<std::vector<OpforgeExpr>> exprs;
  std::deque<std::vector<int32_t>> ints;
  std::deque<std::string> strings;
  std::deque<std::vector<const char*>> cstrs;
  std::deque<std::vector<int64_t>> i64s;
  std::deque<std::vector<double>> f64s;
  std::vector<OpforgeArgSpec> args;
  std::vector<OpforgeOutputSpec> outputs;
  std::vector<OpforgeRule> rules;
  std::vector<OpforgeDtypeCase> dtype_cases;
  std::vector<OpforgeRuleCase> rule_cases;
};

namespace {

/// Resolves names and flattens expression trees into postfix nodes.
class Resolver {
 public:
  Resolver(const OpDef& def, std::vector<std::string>& errors) : def_(def), errors_(errors) {
    for (size_t i = 0; i < def.args.size(); ++i) index_.emplace(def.args[i].name, static_cast<int32_t>(i));
  }

  std::string where() const { return declared_at(def_.file, def_.line, def_.ns + "::" + def_.name); }
  void error(const std::string& context, const std::string& msg) { errors_.push_back(where() + context + msg); }

  std::string inputs_list(bool tensors) const {
    std::string out;
    for (const auto& a : def_.args) {
      if ((a.kind == OPFORGE_ARG_TENSOR) != tensors) continue;
      out += (out.empty() ? "" : ", ") + a.name;
    }
    return out.empty() ? "none" : out;
  }

  /// Index of the tensor input `name`, or -1 after recording an error. Every caller refers to
  /// the input from elsewhere (a constraint, shape rule, output or launch rule), which an
  /// optional input, absent in some calls, cannot serve.
  int32_t tensor(const std::string& name, const std::string& context) {
    auto it = index_.find(name);
    if (it == index_.end() || def_.args[it->second].kind != OPFORGE_ARG_TENSOR) {
      error(context, "\"" + name + "\" names no tensor input (tensor inputs: " + inputs_list(true) + ")");
      return -1;
    }
    if (def_.args[it->second].tensor.optional && it->second == given_) return it->second;
    if (def_.args[it->second].tensor.optional && gate_ != nullptr && (*gate_ < 0 || *gate_ == it->second)) {
      *gate_ = it->second;  // an output's rule: the output exists when this input is given
      return it->second;
    }
    if (def_.args[it->second].tensor.optional) {
      error(context,
            "\"" + name + "\" is an opforge::optional input, which may be absent, so nothing " +
                (gate_ != nullptr ? "but one output's rules (an output that exists when it is given) " : "else ") +
                "may refer to it");
      return -1;
    }
    return it->second;
  }

  /// Index of the parameter `name`, or -1 after recording an error.
  int32_t param(const std::string& name, const std::string& context) {
    auto it = index_.find(name);
    if (it == index_.end() || def_.args[it->second].kind == OPFORGE_ARG_TENSOR) {
      error(context, "\"" + name + "\" names no parameter (parameters: " + inputs_list(false) + ")");
      return -1;
    }
    return it->second;
  }

  /// While set, tensor() admits one optional input and records it in `*gate` (the rules of an
  /// output that exists only when that input is given); nullptr: none is admitted.
  void admit_optional(int32_t* gate) { gate_ = gate; }
  /// While >= 0, tensor() admits that optional input (a rule checked only on calls that give it).
  void admit_given(int32_t arg) { given_ = arg; }

  void flatten(const std::shared_ptr<const Expr::Node>& n, std::vector<OpforgeExprNode>& out,
               const std::string& context) {
    if (n == nullptr) {  // opforge::any inside arithmetic
      error(context,
            "opforge::any stands for a whole dim of an input's shape({...}); it cannot be part of an expression");
      return;
    }
    switch (n->op) {
      case OPFORGE_EXPR_CONST:
        out.push_back({OPFORGE_EXPR_CONST, -1, n->value});
        return;
      case OPFORGE_EXPR_SIZE_OF:
        error(context, "opforge::size_of(\"" + n->name + "\", ...) is allowed only as the first dim of an output's " +
                           "shape({...})");
        return;
      case OPFORGE_EXPR_MULTIPLE_OF:
        error(context, "opforge::multiple_of(" + std::to_string(n->value) +
                           ") stands for a whole dim of an input's shape({...}); it cannot be part of an expression");
        return;
      case OPFORGE_EXPR_DIM:
        out.push_back({OPFORGE_EXPR_DIM, tensor(n->name, context + "dim(): "), n->value});
        return;
      case OPFORGE_EXPR_PARAM: {
        auto it = index_.find(n->name);
        int32_t idx = -1;
        if (it != index_.end() && def_.args[it->second].kind != OPFORGE_ARG_INT) {
          static constexpr const char* kKinds[] = {"tensor", "int64_t",   "double",  "bool",
                                                   "string", "int64_t[]", "double[]"};
          const int32_t kind = def_.args[it->second].kind;
          error(context, "int_param(\"" + n->name + "\") names " +
                             (kind == OPFORGE_ARG_TENSOR ? std::string("a tensor input")
                                                         : std::string("a ") + kKinds[kind] + " parameter") +
                             ": shape rules read int64_t parameters only (opforge::dim for a tensor's sizes)");
        } else if (it == index_.end()) {
          error(context,
                "int_param(\"" + n->name + "\") names no int64_t parameter (parameters: " + inputs_list(false) + ")");
        } else {
          idx = it->second;
        }
        out.push_back({OPFORGE_EXPR_PARAM, idx, 0});
        return;
      }
      default:
        flatten(n->lhs, out, context);
        flatten(n->rhs, out, context);
        out.push_back({n->op, -1, 0});
    }
  }

 private:
  const OpDef& def_;
  std::vector<std::string>& errors_;
  std::map<std::string, int32_t> index_;
  int32_t* gate_ = nullptr;
  int32_t given_ = -1;
};

/// Resolves .kernel_dtypes() declarations into their kernels' dtype_arg and dtypes (Note
/// [Kernel dtypes] in opforge/op.h), as declared; every other kernel takes every dtype
/// (dtype_arg -1). A kernel holds one set, and an empty one would read as every dtype.
void resolve_kernel_dtypes(OpDef& def, Resolver& r) {
  for (auto& k : def.kernels) {
    k.dtype_arg = -1;
    k.dtypes = 0;
  }
  std::string inputs;  // the names a declaration may give, for its message
  for (const auto& a : def.args)
    if (a.kind == OPFORGE_ARG_TENSOR && !a.tensor.optional) inputs += (inputs.empty() ? "" : ", ") + a.name;
  for (const auto& kd : def.kernel_dtypes) {
    const std::string ctx = "kernel_dtypes(\"" + kd.input + "\"): ";
    if (kd.kernel < 0) {
      r.error(ctx, "must follow the device kernel it applies to (.cuda() or .cuda_source())");
      continue;
    }
    OpforgeKernel& k = def.kernels[static_cast<size_t>(kd.kernel)];
    const auto it =
        std::find_if(def.args.begin(), def.args.end(), [&](const ArgDecl& a) { return a.name == kd.input; });
    if (it == def.args.end() || it->kind != OPFORGE_ARG_TENSOR || it->tensor.optional) {
      const std::string what = it == def.args.end()             ? "names no input"
                               : it->kind != OPFORGE_ARG_TENSOR ? "names a parameter"
                                                                : "names an optional input, which a call may leave out";
      r.error(ctx, what + "; expected a required tensor input (" + inputs + ")");
      continue;
    }
    if (k.dtype_arg >= 0) {
      r.error(ctx, "a second kernel_dtypes() for one kernel (name one input, whose dtype the others follow)");
      continue;
    }
    if (kd.dtypes == 0) {
      r.error(ctx, "the dtype set is empty");
      continue;
    }
    k.dtype_arg = static_cast<int32_t>(it - def.args.begin());
    k.dtypes = kd.dtypes;
  }
}

/// The context of a declaration error in the rule that follows `param` where it is `value`:
/// `ctx` then `when("param", "value"): `.
std::string when_context(const std::string& ctx, const std::string& param, const std::string& value) {
  return ctx + "when(\"" + param + "\", \"" + value + "\"): ";
}

/// A record of a rule that follows parameter `param` (an index, -1 if it names none) where it is
/// spelled `value`, of tensor input `arg` or output `output` (the other -1); no rule set yet.
OpforgeRuleCase rule_case(int32_t arg, int32_t output, int32_t param, const char* value) {
  OpforgeRuleCase rec{};
  rec.struct_size = sizeof(OpforgeRuleCase);
  rec.arg = arg;
  rec.output = output;
  rec.param = param;
  rec.value = value;
  rec.dtype_like = -1;
  rec.dtype = -1;
  return rec;
}

/// Resolves the launch rules of run-time kernels, which records do not carry, and checks them.
void resolve_launch_rules(OpDef& def, Resolver& r, const std::vector<OpforgeOutputSpec>& outs) {
  const auto& args = def.args;
  const auto& outputs = def.outputs;
  if (def.launch_without_source) r.error("", ".launch() comes after the .cuda_source() it applies to");
  if (def.waits_without_cuda_source)
    r.error("", ".waits_for_value_checks() comes after the .cuda_source() or .cuda_binary() kernel it applies to");
  if (def.checks_without_cuda_source)
    r.error("", ".checks_values_in_kernel() comes after the .cuda_source() or .cuda_binary() kernel it applies to");
  const bool any_values = std::any_of(args.begin(), args.end(), [](const ArgDecl& a) { return a.tensor.has_values; });
  for (const auto& rk : def.runtime_kernels) {
    const std::string step = std::string(backend_step(rk->backend)) + "(\"" + rk->file + "\"): ";
    if (rk->waits_for_value_checks && !any_values)
      r.error(step,
              ".waits_for_value_checks() but no input declares opforge::values_in(...): there is no check to wait for");
    if (rk->checks_values && !any_values)
      r.error(step,
              ".checks_values_in_kernel() but no input declares opforge::values_in(...): there is no value to check");
    if (rk->checks_values && rk->waits_for_value_checks)
      r.error(step,
              ".checks_values_in_kernel() and .waits_for_value_checks(): a kernel that checks its own values has no "
              "separate check to wait for; keep one");
  }
  for (auto& rk : def.runtime_kernels) {
    const std::string ctx = std::string(backend_step(rk->backend)) + "(\"" + rk->file + "\"): ";
    const LaunchRule& rule = rk->rule;
    if (rule.kind == LaunchRule::kNone)
      r.error(ctx, "no launch rule: add .launch(opforge::elementwise(...)) or another");
    const bool triton = rk->backend == RuntimeKernel::kTriton;
    if (rule.kind == LaunchRule::kGrid && (triton ? rule.triton_grid_entry == nullptr : rule.grid_entry == nullptr))
      r.error(ctx, triton ? "a Triton kernel's grid function returns opforge::TritonLaunch"
                          : "a CUDA kernel's grid function returns opforge::LaunchConfig (opforge::TritonLaunch is a "
                            ".triton_source() kernel's)");
    if (rule.kind == LaunchRule::kElementwise || rule.kind == LaunchRule::kRows) {
      rk->rule_tensor = -1;
      for (size_t o = 0; o < outs.size(); ++o)
        if (outputs[o].name == rule.tensor) {
          rk->rule_tensor = static_cast<int32_t>(args.size() + o);
          if (outs[o].present_with >= 0)
            r.error(ctx, "launch rule: \"" + rule.tensor + "\" exists only when '" + args[outs[o].present_with].name +
                             "' is given; launch by a tensor every call has");
        }
      bool is_input = false;
      for (const auto& a : def.args) is_input = is_input || (a.kind == OPFORGE_ARG_TENSOR && a.name == rule.tensor);
      if (rk->rule_tensor < 0 && !is_input) {
        std::string names;
        for (const auto& a : def.args)
          if (a.kind == OPFORGE_ARG_TENSOR) names += (names.empty() ? "" : ", ") + a.name;
        for (const auto& o : def.outputs) names += (names.empty() ? "" : ", ") + o.name;
        r.error(ctx, "launch rule: \"" + rule.tensor + "\" names no tensor input or output (tensors: " + names + ")");
      } else if (rk->rule_tensor < 0) {
        rk->rule_tensor = r.tensor(rule.tensor, ctx + "launch rule: ");
      }
    }
    const bool auto_threads = rule.kind == LaunchRule::kRows && rule.threads == 0;
    if (!auto_threads && (rule.threads <= 0 || rule.threads > 1024))
      r.error(ctx, "threads per block must be in [1, 1024]" +
                       std::string(rule.kind == LaunchRule::kRows ? " (or 0: chosen per call)" : ""));
    if (rule.kind == LaunchRule::kRows && rule.threads % 32 != 0)
      r.error(ctx, "threads per block of a row kernel must be a multiple of 32 (whole warps)");
    if (rule.items_per_thread <= 0 || rule.bytes_per_thread < 0)
      r.error(ctx, "items (or bytes) per thread must be positive");
  }
}

}  // namespace

std::vector<std::string> OpDef::finalize() {
  std::vector<std::string> errors;
  Resolver r(*this, errors);
  storage_ = std::make_shared<Storage>();
  Storage& s = *storage_;

  auto exprs = [&](const std::vector<Expr>& es, bool allow_any, const std::string& context) {
    auto& arr = s.exprs.emplace_back();
    for (size_t i = 0; i < es.size(); ++i) {
      auto& nodes = s.nodes.emplace_back();
      if (es[i].is_leading_dims()) {
        r.error(context,
                std::string(es[i].leading_of().empty() ? "opforge::leading_dims"
                                                       : "opforge::leading_dims_of(\"" + es[i].leading_of() + "\")") +
                    " is allowed only as the first entry of an input's shape({...})");
      } else if (es[i].is_any()) {
        if (!allow_any) r.error(context, "opforge::any is allowed only in an input's shape({...})");
      } else if (es[i].node()->op == OPFORGE_EXPR_MULTIPLE_OF) {
        if (allow_any) nodes.push_back({OPFORGE_EXPR_MULTIPLE_OF, -1, es[i].node()->value});
        else r.error(context, "opforge::multiple_of is allowed only in an input's shape({...})");
      } else {
        r.flatten(es[i].node(), nodes, context);
      }
      arr.push_back(OpforgeExpr{static_cast<int32_t>(nodes.size()), nodes.data()});
    }
    return arr.data();
  };
  auto cstr = [&](const std::string& str) { return s.strings.emplace_back(str).c_str(); };

  if (output_after_kernel)
    r.error("",
            "declare every .output() before the kernels (.reference(), .cuda()): kernels take the outputs as "
            "arguments");

  for (size_t i = 0; i < args.size(); ++i) {
    const ArgDecl& a = args[i];
    const std::string ctx = (a.kind == OPFORGE_ARG_TENSOR ? "input '" : "param '") + a.name + "': ";
    OpforgeArgSpec spec{};
    spec.struct_size = sizeof(OpforgeArgSpec);
    spec.name = cstr(a.name);
    spec.kind = a.kind;
    spec.tensor.struct_size = sizeof(OpforgeTensorSpec);
    spec.tensor.leading_like = -1;
    spec.param.struct_size = sizeof(OpforgeParamSpec);
    if (a.kind == OPFORGE_ARG_TENSOR) {
      const TensorDecl& t = a.tensor;
      spec.tensor.dtypes = t.dtypes.bits;
      spec.tensor.dtype_like = t.dtype_like.empty() ? -1 : r.tensor(t.dtype_like, ctx + "same_dtype(): ");
      spec.tensor.dtype_alternatives = t.dtype_alternatives.bits;
      spec.tensor.shape_like = t.shape_like.empty() ? -1 : r.tensor(t.shape_like, ctx + "same_shape(): ");
      spec.tensor.min_rank = t.min_rank;
      spec.tensor.max_rank = t.max_rank;
      if (t.has_shape) {  // the record holds one rank range, which the shape's dims bound
        const bool leading = !t.shape.empty() && t.shape.front().is_leading_dims();
        const std::vector<Expr> dims(t.shape.begin() + (leading ? 1 : 0), t.shape.end());
        const int32_t n = static_cast<int32_t>(dims.size());
        spec.tensor.num_dims = n;
        spec.tensor.dims = exprs(dims, true, ctx + "shape(): ");
        spec.tensor.leading_dims = leading;
        if (leading && !t.shape.front().leading_of().empty())
          spec.tensor.leading_like = r.tensor(t.shape.front().leading_of(), ctx + "leading_dims_of(): ");
        if (leading) {
          spec.tensor.min_rank = std::max(t.min_rank, n);
        } else {
          if ((t.min_rank >= 0 || t.max_rank >= 0) && !(t.min_rank == n && t.max_rank == n))
            r.error(ctx, "a rank constraint beside shape({...}) of " + std::to_string(n) +
                             " dims, which fixes the rank at " + std::to_string(n) +
                             ": for any number of leading dims, write shape({opforge::leading_dims, ...})");
          spec.tensor.min_rank = spec.tensor.max_rank = n;
        }
      }
      spec.tensor.layout = t.layout;
      spec.tensor.optional = t.optional;
      spec.tensor.mutated = t.mutated;
      if (t.has_values) {
        spec.tensor.has_values = 1;
        spec.tensor.values_unique = t.values_unique;
        spec.tensor.has_sentinel = t.has_sentinel;
        spec.tensor.sentinel = t.sentinel;
        spec.tensor.values_low = exprs({t.values_low}, false, ctx + "values_in(): ")[0];
        spec.tensor.values_high = exprs({t.values_high}, false, ctx + "values_in(): ")[0];
      }
      for (const DtypeCaseDecl& c : t.dtype_cases) {
        const std::string at = when_context(ctx, c.param, c.value);
        OpforgeDtypeCase rec{};
        rec.struct_size = sizeof(OpforgeDtypeCase);
        rec.arg = static_cast<int32_t>(i);
        rec.param = r.param(c.param, at);
        rec.value = cstr(c.value);
        rec.dtypes = c.dtypes.bits;
        rec.dtype_like = c.dtype_like.empty() ? -1 : r.tensor(c.dtype_like, at + "same_dtype(): ");
        rec.dtype_alternatives = c.dtype_alternatives.bits;
        s.dtype_cases.push_back(rec);
      }
      for (const ShapeCaseDecl& c : t.shape_cases) {
        const std::string at = when_context(ctx, c.param, c.value);
        const bool leading = !c.shape.empty() && c.shape.front().is_leading_dims();
        if (leading && !c.shape.front().leading_of().empty())
          r.error(at, "opforge::leading_dims_of is not allowed in a shape that follows a parameter");
        const std::vector<Expr> dims(c.shape.begin() + (leading ? 1 : 0), c.shape.end());
        OpforgeRuleCase rec = rule_case(static_cast<int32_t>(i), -1, r.param(c.param, at), cstr(c.value));
        rec.has_shape = 1;
        rec.num_dims = static_cast<int32_t>(dims.size());
        rec.dims = exprs(dims, true, at + "shape(): ");
        rec.leading_dims = leading;
        s.rule_cases.push_back(rec);
      }
    } else {
      const ParamDecl& p = a.param;
      spec.param.compile_time = p.compile_time;
      spec.param.has_min = p.has_min;
      spec.param.has_max = p.has_max;
      spec.param.min = p.min;
      spec.param.max = p.max;
      // The record holds choices for int64_t (in decimal) and std::string parameters only.
      if (!p.choices.empty() && a.kind != (p.integer_choices ? OPFORGE_ARG_INT : OPFORGE_ARG_STRING)) {
        r.error(ctx, p.integer_choices ? "one_of() with integers applies to int64_t parameters only"
                                       : "one_of() with strings applies to std::string parameters only");
      } else if (!p.choices.empty()) {
        auto& cs = s.cstrs.emplace_back();
        for (const auto& c : p.choices) cs.push_back(cstr(c));
        spec.param.num_choices = static_cast<int32_t>(cs.size());
        spec.param.choices = cs.data();
      }
      OpforgeValue& v = spec.param.default_value;
      v.kind = a.kind;
      spec.param.has_default = !std::holds_alternative<std::monostate>(p.default_value);
      std::visit(
          [&](const auto& d) {
            using D = std::decay_t<decltype(d)>;
            if constexpr (std::is_same_v<D, int64_t> || std::is_same_v<D, bool>) {
              v.i = d;
            } else if constexpr (std::is_same_v<D, double>) {
              v.f = d;
            } else if constexpr (std::is_same_v<D, std::string>) {
              v.s = cstr(d);
              v.len = d.size();
            } else if constexpr (std::is_same_v<D, std::vector<int64_t>>) {
              v.ints = s.i64s.emplace_back(d).data();
              v.len = d.size();
            } else if constexpr (std::is_same_v<D, std::vector<double>>) {
              v.floats = s.f64s.emplace_back(d).data();
              v.len = d.size();
            }
          },
          p.default_value);
    }
    s.args.push_back(spec);
  }

  for (const auto& o : outputs) {
    const std::string ctx = "output '" + o.name + "': ";
    OpforgeOutputSpec spec{};
    spec.struct_size = sizeof(OpforgeOutputSpec);
    spec.name = cstr(o.name);
    spec.dtype = o.dtype;
    spec.present_with = -1;
    r.admit_optional(&spec.present_with);
    spec.shape_like = o.shape_like.empty() ? -1 : r.tensor(o.shape_like, ctx + "like(): ");
    spec.dtype_like = o.dtype_like.empty()           ? -1
                      : o.dtype_like == o.shape_like ? spec.shape_like  // like(): reported once
                                                     : r.tensor(o.dtype_like, ctx + "dtype_of(): ");
    spec.num_dims = static_cast<int32_t>(o.dims.size());
    spec.size_from = -1;
    std::vector<Expr> dims = o.dims;  // a data-dependent first dim: its bound, and the output it reads
    const auto& first = dims.empty() ? nullptr : dims[0].node();
    if (first != nullptr && first->op == OPFORGE_EXPR_SIZE_OF) {
      dims[0] = Expr::from_node(first->lhs);
      int32_t count = -1;
      for (size_t k = 0; k < outputs.size(); ++k)
        if (outputs[k].name == first->name) count = static_cast<int32_t>(k);
      if (!o.shape_like.empty())
        r.error(ctx, "opforge::size_of is allowed only as the first dim of an output's shape({...})");
      else if (count < 0) r.error(ctx, "size_of(\"" + first->name + "\"): names no output of this op");
      else spec.size_from = count;
    }
    spec.dims = exprs(dims, false, ctx);
    const int32_t index = static_cast<int32_t>(s.outputs.size());
    for (const ShapeCaseDecl& c : o.shape_cases) {
      const std::string at = when_context(ctx, c.param, c.value);
      OpforgeRuleCase rec = rule_case(-1, index, r.param(c.param, at), cstr(c.value));
      rec.has_shape = 1;
      rec.num_dims = static_cast<int32_t>(c.shape.size());
      rec.dims = exprs(c.shape, false, at);
      s.rule_cases.push_back(rec);
    }
    for (const DtypeCaseDecl& c : o.dtype_cases) {
      const std::string at = when_context(ctx, c.param, c.value);
      OpforgeRuleCase rec = rule_case(-1, index, r.param(c.param, at), cstr(c.value));
      rec.has_dtype = 1;
      rec.dtype_like = c.dtype_like.empty() ? -1 : r.tensor(c.dtype_like, at + "same_dtype(): ");
      rec.dtype = c.dtype_like.empty() ? single_dtype(c.dtypes) : -1;
      if (c.dtype_like.empty() && rec.dtype < 0)
        r.error(at, "an output's dtype rule is one dtype or a same_dtype, not a set of dtypes");
      s.rule_cases.push_back(rec);
    }
    r.admit_optional(nullptr);
    if (!o.dim_index.empty()) spec.dim_index = s.ints.emplace_back(o.dim_index).data();
    if (o.dtype_like.empty() && (spec.dtype < 0 || spec.dtype >= OPFORGE_NUM_DTYPES))
      r.error(ctx, o.dtype_cases.empty() ? "no dtype rule"
                                         : "otherwise(): an output's dtype rule is one dtype or a same_dtype, not a "
                                           "set of dtypes");
    s.outputs.push_back(spec);
  }

  for (const Condition& c : rules) {
    OpforgeRule rule{};
    rule.struct_size = sizeof(OpforgeRule);
    rule.op = c.op;
    rule.when_arg = -1;
    rule.when_given = c.given;
    const std::string ctx =
        c.input.empty() ? "require(): " : (c.given ? "when_given(\"" : "unless_given(\"") + c.input + "\"): ";
    if (!c.input.empty()) {
      const auto it = std::find_if(args.begin(), args.end(), [&](const ArgDecl& a) { return a.name == c.input; });
      if (it == args.end() || it->kind != OPFORGE_ARG_TENSOR || !it->tensor.optional)
        r.error(ctx, "names no opforge::optional input (a rule by presence needs an input a call may leave out)");
      else rule.when_arg = static_cast<int32_t>(it - args.begin());
    }
    r.admit_given(rule.when_given ? rule.when_arg : -1);
    rule.lhs = exprs({c.lhs}, false, ctx)[0];
    rule.rhs = exprs({c.rhs}, false, ctx)[0];
    r.admit_given(-1);
    s.rules.push_back(rule);
  }

  resolve_launch_rules(*this, r, s.outputs);
  resolve_kernel_dtypes(*this, r);

  spec_.struct_size = sizeof(OpforgeOpSpec);
  spec_.ns = ns.c_str();
  spec_.name = name.c_str();
  spec_.doc = doc.c_str();
  spec_.file = file.c_str();
  spec_.line = line;
  spec_.num_args = static_cast<int32_t>(s.args.size());
  spec_.args = s.args.data();
  spec_.num_outputs = static_cast<int32_t>(s.outputs.size());
  spec_.outputs = s.outputs.data();
  spec_.num_kernels = static_cast<int32_t>(kernels.size());
  spec_.kernels = kernels.data();
  spec_.equivalent = equivalent.empty() ? nullptr : equivalent.c_str();
  spec_.backward = backward.empty() ? nullptr : backward.c_str();
  spec_.num_rules = static_cast<int32_t>(s.rules.size());
  spec_.rules = s.rules.data();
  spec_.autocast = autocast;
  spec_.num_tolerances = static_cast<int32_t>(tolerances.size());
  spec_.tolerances = tolerances.data();
  spec_.tolerance_vs_equivalent = tolerance_vs_equivalent;
  spec_.num_dtype_cases = static_cast<int32_t>(s.dtype_cases.size());
  spec_.dtype_cases = s.dtype_cases.data();
  spec_.num_rule_cases = static_cast<int32_t>(s.rule_cases.size());
  spec_.rule_cases = s.rule_cases.data();
  spec_.sharding = sharding >= 0 ? sharding : OPFORGE_SHARDING_NONE;
  spec_.sharding_dims = 0;
  for (int32_t d : sharding_dims) {  // a bit per dim
    if (d < 0 || d >= 32) r.error("", "shard_dims(): dim " + std::to_string(d) + " is outside [0, 32)");
    else spec_.sharding_dims |= 1u << d;
  }
  if (sharding < 0) {
    for (const auto& rk : runtime_kernels) {
      if (rk->rule.kind == LaunchRule::kElementwise) spec_.sharding = OPFORGE_SHARDING_POINTWISE;
      if (rk->rule.kind == LaunchRule::kRows) spec_.sharding = OPFORGE_SHARDING_ROWWISE;
    }
  }
  return errors;
}

// ---- the builder's steps ----------------------------------------------------------------------

OpDef::OpDef(const char* ns_, const char* name_, const char* file_, int line_)
    : ns(ns_), name(name_), file(file_), line(line_) {
  kernels.push_back(OpforgeKernel{sizeof(OpforgeKernel), OPFORGE_DEVICE_CPU, nullptr, nullptr});
}

OpDef::~OpDef() = default;

ArgDecl& OpDef::add_arg(std::string arg_name, OpforgeArgKind kind) {
  args.push_back(ArgDecl{std::move(arg_name), kind, {}, {}});
  return args.back();
}

OutputDecl& OpDef::add_output(std::string output_name) {
  output_after_kernel = output_after_kernel || kernels_declared;
  outputs.emplace_back().name = std::move(output_name);
  return outputs.back();
}

void OpDef::set_doc(std::string text) { doc = std::move(text); }

void OpDef::set_equivalent(std::string python_expression) { equivalent = std::move(python_expression); }

void OpDef::set_backward(std::string op) {
  backward = op.find("::") == std::string::npos ? ns + "::" + op : std::move(op);
}

void OpDef::add_rule(Condition rule) { rules.push_back(std::move(rule)); }

void OpDef::set_sharding(int32_t s, std::vector<int32_t> dims) {
  sharding = s;
  sharding_dims = std::move(dims);
}

void OpDef::add_kernel(const OpforgeKernel& kernel, bool reference) {
  kernels_declared = true;  // an .output() after this is a declaration error (finalize)
  if (reference) {
    kernels[0] = kernel;
  } else {
    kernels.push_back(kernel);
  }
}

void OpDef::add_runtime_kernel(RuntimeKernel::Backend backend, std::string file, std::string name,
                               OpforgeKernelFn launch, OpforgePrecompileFn precompile, void (*reload)()) {
  auto rk = std::make_unique<RuntimeKernel>();
  rk->def = this;
  rk->backend = backend;
  rk->file = std::move(file);
  rk->name = std::move(name);
  OpforgeKernel k{};
  k.struct_size = sizeof(OpforgeKernel);
  k.device_type = OPFORGE_DEVICE_CUDA;
  k.fn = launch;
  k.user = rk.get();
  k.source = rk->file.c_str();
  k.name = rk->name.c_str();
  k.precompile = precompile;
  k.backend = backend;
  kernels.push_back(k);
  runtime_kernels.push_back(std::move(rk));
  registry().add_reload(reload);
}

void OpDef::set_kernel_dtypes(std::string input, uint32_t dtypes) {
  kernel_dtypes.push_back(
      {kernels.size() > 1 ? static_cast<int32_t>(kernels.size() - 1) : -1, std::move(input), dtypes});
}

/// The kernel declared last, where it is a .cuda_source() or .cuda_binary() kernel; null otherwise
/// (none yet, a .cuda() host function or a Triton kernel).
static RuntimeKernel* last_cuda_runtime_kernel(OpDef& def) {
  if (def.runtime_kernels.empty() || def.kernels.back().user != def.runtime_kernels.back().get()) return nullptr;
  RuntimeKernel* rk = def.runtime_kernels.back().get();
  return rk->backend == RuntimeKernel::kTriton ? nullptr : rk;
}

void OpDef::set_waits_for_value_checks() {
  if (RuntimeKernel* rk = last_cuda_runtime_kernel(*this)) rk->waits_for_value_checks = true;
  else waits_without_cuda_source = true;
}

void OpDef::set_checks_values_in_kernel() {
  if (RuntimeKernel* rk = last_cuda_runtime_kernel(*this)) {
    rk->checks_values = true;
    kernels.back().checks_values = 1;
  } else {
    checks_without_cuda_source = true;
  }
}

void OpDef::set_launch(LaunchRule rule) {
  if (!runtime_kernels.empty()) runtime_kernels.back()->rule = std::move(rule);
  else launch_without_source = true;
}

void set_output(OutputDecl& o, const Like& rule) {
  o.shape_like = rule.tensor;
  if (rule.dtype < 0) o.dtype_like = rule.tensor;
  o.dtype = rule.dtype;
  for (const auto& [d, e] : rule.overrides) {
    o.dim_index.push_back(d);
    o.dims.push_back(e);
  }
}

ClassDef::ClassDef(const char* ns_, const char* name_, const char* file_, int line_)
    : ns(ns_), name(name_), file(file_), line(line_) {}

void ClassDef::finalize() {
  field_name_ptrs_.clear();
  for (const auto& f : field_names) field_name_ptrs_.push_back(f.c_str());
  method_specs_.clear();
  auto qualify = [&](std::string& op) {
    if (!op.empty() && op.find("::") == std::string::npos) op = ns + "::" + op;
  };
  qualify(constructor);
  for (auto& [m, op] : methods) {
    qualify(op);
    method_specs_.push_back({sizeof(OpforgeMethodSpec), m.c_str(), op.c_str()});
  }
  spec_ = OpforgeClassSpec{};
  spec_.struct_size = sizeof(OpforgeClassSpec);
  spec_.ns = ns.c_str();
  spec_.name = name.c_str();
  spec_.doc = doc.c_str();
  spec_.file = file.c_str();
  spec_.line = line;
  spec_.num_fields = static_cast<int32_t>(field_names.size());
  spec_.field_names = field_name_ptrs_.data();
  spec_.field_kinds = field_kinds.data();
  spec_.constructor = constructor.empty() ? nullptr : constructor.c_str();
  spec_.num_methods = static_cast<int32_t>(method_specs_.size());
  spec_.methods = method_specs_.data();
}

void Registry::add(std::unique_ptr<OpDef> def) {
  defs_.push_back(std::move(def));
  built_ = false;
}

void Registry::add(std::unique_ptr<ClassDef> def) {
  class_defs_.push_back(std::move(def));
  built_ = false;
}

const OpforgeLibrary* Registry::library() {
  if (!built_) {
    specs_.clear();
    errors_.clear();
    for (auto& d : defs_) {
      for (const auto& e : d->finalize()) errors_ += e + "\n";
      specs_.push_back(d->spec());
    }
    class_specs_.clear();
    for (auto& c : class_defs_) {
      c->finalize();
      class_specs_.push_back(c->spec());
    }
    lib_.struct_size = sizeof(OpforgeLibrary);
    lib_.num_classes = static_cast<int32_t>(class_specs_.size());
    lib_.classes = class_specs_.data();
    lib_.abi_version = OPFORGE_ABI_VERSION;
    lib_.num_ops = static_cast<int32_t>(specs_.size());
    lib_.ops = specs_.data();
    lib_.error = errors_.empty() ? nullptr : errors_.c_str();
    lib_.kernel_dir = kernel_dir().c_str();
    lib_.reload = reloads_[0] != nullptr ? &Registry::reload_all : nullptr;
    built_ = true;
  }
  return &lib_;
}

void Registry::reload_all() {
  for (auto* r : registry().reloads_)
    if (r != nullptr) r();
}

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace opforge::detail

extern "C" __attribute__((visibility("default"))) const OpforgeLibrary* opforge_library_v1() {
  return opforge::detail::registry().library();
}
