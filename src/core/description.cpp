// The library description as JSON (see description.h), written with nlohmann::json.
#include "description.h"

#include <cmath>
#include <cstddef>

#include <nlohmann/json.hpp>

#include "backward.h"
#include "classes.h"
#include "dtypes.h"
#include "opforge/detail/names.h"
#include "param_rules.h"
#include "records.h"
#include "schema.h"
#include "sharding.h"

namespace opforge::core {
namespace {

using nlohmann::json;

json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

json text_or_null(const char* s) { return s ? json(s) : json(nullptr); }

json value_json(const OpforgeValue& v) {
  switch (v.kind) {
    case OPFORGE_ARG_INT:
      return v.i;
    case OPFORGE_ARG_FLOAT:
      return number(v.f);
    case OPFORGE_ARG_BOOL:
      return v.i != 0;
    case OPFORGE_ARG_STRING:
      return std::string(v.s, v.len);
    case OPFORGE_ARG_INT_LIST:
      return std::vector<int64_t>(v.ints, v.ints + v.len);
    case OPFORGE_ARG_FLOAT_LIST: {
      json out = json::array();
      for (size_t k = 0; k < v.len; ++k) out.push_back(number(v.floats[k]));
      return out;
    }
    default:
      return nullptr;
  }
}

const char* layout_name(int32_t layout) {
  switch (layout) {
    case OPFORGE_LAYOUT_STRIDED:
      return "strided";
    case OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM:
      return "contiguous_last_dim";
    default:
      return "contiguous";
  }
}

const char* sharding_name(int32_t s) {
  switch (s) {
    case OPFORGE_SHARDING_POINTWISE:
      return "pointwise";
    case OPFORGE_SHARDING_ROWWISE:
      return "rowwise";
    case OPFORGE_SHARDING_DIMS:
      return "dims";
    default:
      return "none";
  }
}

/// The names of the dtypes in bit set `bits`.
json dtype_names(uint32_t bits) {
  json out = json::array();
  for (int32_t d = 0; d < OPFORGE_NUM_DTYPES; ++d)
    if ((bits >> d) & 1u) out.push_back(dtype_name(d));
  return out;
}

/// Parameter `a`'s value spelled `text` (param_value_text) as a typed JSON value.
json typed_value(const OpforgeArgSpec& a, const std::string& text) {
  if (a.kind == OPFORGE_ARG_STRING) return text;
  if (a.kind == OPFORGE_ARG_BOOL) return text == "true";
  return param_value_from_text(a, text).i;
}

/// The rules of tensor input `arg` (or of output `output`) that follow a parameter's value
/// (OpforgeRuleCase): [{"param", "value": typed value, "shape": [text...] | null, "leading_dims":
/// bool, "dtype": name | null, "dtype_like": name | null}...].
json case_json(const OpforgeOpSpec& op, int32_t arg, int32_t output) {
  json cases = json::array();
  for (const OpforgeRuleCase& c : rule_cases(op)) {
    if (c.arg != arg || c.output != output || c.param < 0) continue;
    json shape = nullptr;
    if (c.has_shape) {
      shape = json::array();
      for (int32_t d = 0; d < c.num_dims; ++d) shape.push_back(expr_string(op, c.dims[d]));
    }
    json when = {{"param", op.args[c.param].name}, {"value", typed_value(op.args[c.param], c.value)}};
    when["shape"] = std::move(shape);
    when["leading_dims"] = c.leading_dims != 0;
    when["dtype"] = c.has_dtype && c.dtype_like < 0 ? json(dtype_name(c.dtype)) : json(nullptr);
    when["dtype_like"] = c.has_dtype && c.dtype_like >= 0 ? json(op.args[c.dtype_like].name) : json(nullptr);
    cases.push_back(std::move(when));
  }
  return cases;
}

json arg_json(const OpforgeOpSpec& op, int32_t i, const std::map<int32_t, std::map<int32_t, int32_t>>& follows) {
  const OpforgeArgSpec& a = op.args[i];
  json j = {{"name", a.name}, {"type", schema_type(a.kind)}};
  if (a.kind == OPFORGE_ARG_TENSOR) {
    const OpforgeTensorSpec& t = a.tensor;
    j["kind"] = "tensor";
    j["dtypes"] = dtype_names(t.dtypes);
    j["same_dtype"] = t.dtype_like >= 0 ? json(op.args[t.dtype_like].name) : json(nullptr);
    j["dtype_alternatives"] = dtype_names(t.dtype_alternatives);
    json cases = json::array();  // Note [Rules that follow a parameter]
    for (const OpforgeDtypeCase& c : dtype_cases(op)) {
      if (c.arg != i) continue;
      json when = {{"param", op.args[c.param].name},
                   {"value", typed_value(op.args[c.param], c.value)},
                   {"same_dtype", c.dtype_like >= 0 ? json(op.args[c.dtype_like].name) : json(nullptr)}};
      when["dtypes"] = dtype_names(c.dtypes);
      when["dtype_alternatives"] = dtype_names(c.dtype_alternatives);
      cases.push_back(std::move(when));
    }
    j["dtype_cases"] = std::move(cases);
    j["leading_dims"] = t.leading_dims != 0;
    j["leading_dims_of"] = t.leading_dims && t.leading_like >= 0 ? json(op.args[t.leading_like].name) : json(nullptr);
    j["same_shape"] = t.shape_like >= 0 ? json(op.args[t.shape_like].name) : json(nullptr);
    j["min_rank"] = t.min_rank;
    j["max_rank"] = t.max_rank;
    j["layout"] = layout_name(t.layout);
    j["optional"] = is_optional(a);
    j["default_none"] = has_schema_default(op, i);
    j["mutated"] = is_mutated(a);
    json values = nullptr;
    if (t.has_values)
      values = {{"low", expr_string(op, t.values_low)},
                {"high", expr_string(op, t.values_high)},
                {"unique", t.values_unique != 0},
                {"sentinel", t.has_sentinel ? json(t.sentinel) : json(nullptr)}};
    j["values"] = std::move(values);
    json shape = nullptr;
    if (t.num_dims > 0) {
      shape = json::array();
      for (int32_t d = 0; d < t.num_dims; ++d) shape.push_back(expr_string(op, t.dims[d]));
    }
    j["shape"] = std::move(shape);
    j["shape_cases"] = case_json(op, i, -1);
    json multiple = json::array();
    for (const auto& [d, k] : multiple_of_dims(a)) multiple.push_back({d, k});
    j["multiple_of"] = std::move(multiple);
    json follow = json::array();
    if (auto it = follows.find(i); it != follows.end())
      for (const auto& [d, own] : it->second) follow.push_back({d, own});
    j["follows"] = std::move(follow);
    return j;
  }
  const OpforgeParamSpec& p = a.param;
  j["kind"] = "param";
  if (p.has_default) j["default"] = value_json(p.default_value);
  if (p.has_min) j["min"] = number(p.min);
  if (p.has_max) j["max"] = number(p.max);
  json choices = nullptr;
  if (p.num_choices > 0) {
    choices = json::array();
    for (int32_t c = 0; c < p.num_choices; ++c)  // integer choices are stored in decimal
      choices.push_back(a.kind == OPFORGE_ARG_INT ? json(std::stoll(p.choices[c])) : json(p.choices[c]));
  }
  j["choices"] = std::move(choices);
  j["compile_time"] = p.compile_time != 0;
  return j;
}

json output_json(const OpforgeOpSpec& op, int32_t k) {
  const OpforgeOutputSpec& o = op.outputs[k];
  json j = {{"name", o.name}};
  j["dtype"] = o.dtype_like >= 0 ? json(nullptr) : json(dtype_name(o.dtype));
  j["dtype_like"] = o.dtype_like >= 0 ? json(op.args[o.dtype_like].name) : json(nullptr);
  j["like"] = o.shape_like >= 0 ? json(op.args[o.shape_like].name) : json(nullptr);
  j["present_with"] = o.present_with >= 0 ? json(op.args[o.present_with].name) : json(nullptr);
  j["size_from"] = o.size_from >= 0 ? json(op.outputs[o.size_from].name) : json(nullptr);
  json shape = json::array(), with = json::array();
  for (int32_t d = 0; d < o.num_dims; ++d) {
    if (o.shape_like >= 0) with.push_back({o.dim_index[d], expr_string(op, o.dims[d])});
    else shape.push_back(expr_string(op, o.dims[d]));
  }
  j["shape"] = std::move(shape);
  j["with_dims"] = std::move(with);
  j["cases"] = case_json(op, -1, k);
  return j;
}

json op_json(const OpforgeLibrary& lib, const OpforgeOpSpec& op) {
  json j = {{"name", qualified_name(op)},
            {"schema", qualified_schema(op)},
            {"doc", op.doc ? op.doc : ""},
            {"file", op.file},
            {"line", op.line}};
  j["out_schema"] = has_out_overload(op) ? json(qualified_out_schema(op)) : json(nullptr);
  j["equivalent"] = text_or_null(equivalent(op));
  const char* bwd_name = backward_name(op);
  j["backward"] = text_or_null(bwd_name);
  json sources = json::array(), gradients = json::array(), differentiable = json::array();
  if (bwd_name != nullptr) {
    std::vector<std::string> problems;  // none: the library was checked before it was described
    if (const OpforgeOpSpec* bwd = find_op(lib, bwd_name)) {
      const BackwardPlan plan = plan_backward(op, *bwd, problems);
      for (const auto& of : plan.targets) gradients.push_back(of);
      for (const bool d : plan.differentiable) differentiable.push_back(d);
      for (const auto& [source, index] : plan.sources)
        sources.push_back({source == BackwardPlan::Source::kGrad  ? "grad"
                           : source == BackwardPlan::Source::kArg ? "arg"
                                                                  : "result",
                           index});
    }
  }
  j["backward_sources"] = std::move(sources);
  j["backward_gradients"] = std::move(gradients);
  j["differentiable_results"] = std::move(differentiable);
  j["is_backward_op"] = is_backward_op(lib, op);
  j["sharding"] = sharding_name(sharding(op));
  j["autocast"] = autocast_name(autocast_policy(op));
  json tolerance = json::object();
  for (const OpforgeTolerance& t : tolerances(op)) tolerance[dtype_name(t.dtype)] = {t.atol, t.rtol};
  j["tolerances"] = std::move(tolerance);
  const double factor = tolerance_vs_equivalent(op);
  j["tolerance_vs_equivalent"] = factor > 0 ? json(factor) : json(nullptr);
  json dims = json::array();
  for (int32_t d = 0; d < 32; ++d)
    if (sharding_dims(op) >> d & 1u) dims.push_back(d);
  j["sharding_dims"] = std::move(dims);
  j["unshardable_dims"] = unshardable_dims(op);
  json batchable = json::array();
  for (int32_t i : batchable_args(op)) batchable.push_back(op.args[i].name);
  j["batchable"] = std::move(batchable);
  json rules = json::array();
  for (int32_t k = 0; k < num_rules(op); ++k)
    rules.push_back({{"text", rule_string(op, op.rules[k])}, {"op", comparison_symbol(op.rules[k].op)}});
  j["rules"] = std::move(rules);
  const auto follows = follow_dims(op);
  json args = json::array();
  for (int32_t i = 0; i < op.num_args; ++i) args.push_back(arg_json(op, i, follows));
  j["args"] = std::move(args);
  json outputs = json::array();
  for (int32_t i = 0; i < op.num_outputs; ++i) outputs.push_back(output_json(op, i));
  j["outputs"] = std::move(outputs);
  const auto combinations_json = [&](const std::vector<std::vector<int32_t>>& cs) {
    json combinations = json::array();
    for (const auto& c : cs) {
      json one = json::object();
      for (int32_t i = 0; i < op.num_args; ++i) {
        if (c[i] >= 0) one[op.args[i].name] = dtype_name(c[i]);
        if (c[i] <= -2) one[op.args[i].name] = typed_value(op.args[i], ruled_values(op, i)[ruled_value_index(c[i])]);
      }
      combinations.push_back(std::move(one));
    }
    return combinations;
  };
  j["dtype_combinations"] = combinations_json(dtype_combinations(op));
  json devices = json::array(), kernels = json::array(), on = json::object();
  for (int32_t i = 0; i < op.num_kernels; ++i) {
    const OpforgeKernel& k = op.kernels[i];
    if (k.fn == nullptr) continue;  // no C++ reference: the op does not run on the CPU
    const char* device = device_type_name(k.device_type);
    devices.push_back(device);
    if (!on.contains(device)) on[device] = combinations_json(dtype_combinations_on(op, k.device_type));
    if (has_runtime_source(k))
      kernels.push_back({{"source", k.source},
                         {"name", k.name},
                         {"backend", backend_name(k.backend)},
                         {"checks_values", k.checks_values != 0}});
  }
  j["devices"] = std::move(devices);
  j["dtype_combinations_on"] = std::move(on);
  j["runtime_kernels"] = std::move(kernels);
  return j;
}

}  // namespace

std::string description_json(const OpforgeLibrary& lib) {
  json j = {{"abi_version", lib.abi_version}};
  j["kernel_dir"] = kernel_dir(lib) ? json(kernel_dir(lib)) : json(nullptr);
  json ops = json::array();
  for (int32_t k = 0; k < lib.num_ops; ++k) ops.push_back(op_json(lib, *lib.ops[k]));
  j["ops"] = std::move(ops);
  json classes = json::array();
  for (const OpforgeClassSpec* c : library_classes(lib)) {
    std::vector<std::string> problems;
    const ClassPlan plan = plan_class(lib, *c, problems);
    json fields = json::array(), methods = json::array(), init = json::array();
    for (const ClassField& f : plan.fields)
      fields.push_back({{"name", f.name},
                        {"kind", f.kind == OPFORGE_ARG_TENSOR ? "Tensor" : schema_type(f.kind)},
                        {"optional", f.optional}});
    for (const MethodPlan& m : plan.methods) {
      json bound = json::array();
      for (int32_t f : m.bound) bound.push_back(f < 0 ? json(nullptr) : json(plan.fields[f].name));
      methods.push_back({{"name", m.name}, {"op", qualified_name(*m.op)}, {"bound", std::move(bound)}});
    }
    classes.push_back({{"name", c->name},
                       {"qualified_name", qualified_name(*c)},
                       {"doc", text_or_null(c->doc)},
                       {"file", c->file},
                       {"line", c->line},
                       {"constructor", plan.constructor ? json(qualified_name(*plan.constructor)) : json(nullptr)},
                       {"fields", std::move(fields)},
                       {"methods", std::move(methods)}});
  }
  j["classes"] = std::move(classes);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace opforge::core
