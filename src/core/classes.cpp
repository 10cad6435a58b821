// Custom classes: plans and load checks (classes.h).
#include "classes.h"

#include <set>

#include "backward.h"
#include "check.h"
#include "opforge/detail/names.h"
#include "records.h"
#include "schema.h"

namespace opforge::core {

std::string qualified_name(const OpforgeClassSpec& c) { return std::string(c.ns) + "::" + c.name; }

std::string method_label(const ClassPlan& plan, const MethodPlan& m) {
  return qualified_name(*plan.cls) + "." + m.name;
}

namespace {

std::string describe_kind(int32_t kind) { return kind == OPFORGE_ARG_TENSOR ? "Tensor" : schema_type(kind); }

}  // namespace

ClassPlan plan_class(const OpforgeLibrary& lib, const OpforgeClassSpec& c, std::vector<std::string>& problems) {
  ClassPlan plan;
  plan.cls = &c;
  const std::string at = opforge::detail::declared_at(c.file, c.line, qualified_name(c));
  const size_t before = problems.size();
  std::vector<std::string> method_ops;  // the names every method op's arguments take
  std::set<std::string> taken;
  for (int32_t m = 0; m < c.num_methods; ++m)
    if (const OpforgeOpSpec* op = find_op(lib, c.methods[m].op))
      for (int32_t i = 0; i < op->num_args; ++i) taken.insert(op->args[i].name);

  if (c.constructor != nullptr) {
    plan.constructor = find_op(lib, c.constructor);
    if (plan.constructor == nullptr) {
      problems.push_back(at + "constructor op " + c.constructor + ": not declared in this library");
    } else {
      const OpforgeOpSpec& ctor = *plan.constructor;
      if (mutates_inputs(ctor))
        problems.push_back(at + "constructor op " + c.constructor +
                           " writes its inputs (opforge::mutated): a constructor computes the object's fields");
      for (int32_t j = 0; j < ctor.num_outputs; ++j) {
        ClassField f;
        f.name = ctor.outputs[j].name;
        f.optional = ctor.outputs[j].present_with >= 0;
        f.output = j;
        plan.fields.push_back(f);
      }
      for (int32_t i = 0; i < ctor.num_args; ++i) {
        if (!taken.count(ctor.args[i].name)) continue;
        ClassField f;
        f.name = ctor.args[i].name;
        f.kind = ctor.args[i].kind;
        f.optional = is_optional(ctor.args[i]);
        f.init_arg = i;
        plan.fields.push_back(f);
      }
    }
  } else {
    for (int32_t i = 0; i < c.num_fields; ++i) {
      ClassField f;
      f.name = c.field_names[i];
      f.kind = c.field_kinds[i];
      f.init_arg = i;
      plan.fields.push_back(f);
    }
  }

  for (int32_t m = 0; m < c.num_methods; ++m) {
    MethodPlan mp;
    mp.name = c.methods[m].name;
    mp.op = find_op(lib, c.methods[m].op);
    const std::string where = at + "method " + mp.name + " (op " + c.methods[m].op + "): ";
    if (mp.op == nullptr) {
      problems.push_back(where + "not declared in this library");
      continue;
    }
    for (int32_t i = 0; i < mp.op->num_args; ++i) {
      const OpforgeArgSpec& a = mp.op->args[i];
      int32_t field = -1;
      for (size_t k = 0; k < plan.fields.size(); ++k)
        if (plan.fields[k].name == a.name) field = static_cast<int32_t>(k);
      mp.bound.push_back(field);
      if (field < 0) continue;
      const ClassField& f = plan.fields[field];
      if (f.kind != a.kind)
        problems.push_back(where + "argument " + a.name + " is " + describe_kind(a.kind) + ", but the field " + f.name +
                           " is " + describe_kind(f.kind));
      else if (is_mutated(a))
        problems.push_back(where + "argument " + a.name +
                           " is opforge::mutated: a method may not write the object's fields (torch.export and "
                           "AOTInductor treat an object's tensors as constants)");
      else if (f.optional && !is_optional(a))
        problems.push_back(where + "argument " + a.name + " is not opforge::optional, and the field " + f.name +
                           " may be None");
    }
    plan.methods.push_back(std::move(mp));
  }
  if (problems.size() != before) return ClassPlan{};
  return plan;
}

std::vector<std::string> check_classes(const OpforgeLibrary& lib) {
  std::vector<std::string> problems;
  for (const OpforgeClassSpec* c : library_classes(lib)) plan_class(lib, *c, problems);
  return problems;
}

std::vector<std::string> field_problems(const ClassPlan& plan, int32_t field, const OpforgeValue& v) {
  std::vector<std::string> out;
  for (const MethodPlan& m : plan.methods)
    for (size_t i = 0; i < m.bound.size(); ++i)
      if (m.bound[i] == field) check_param(m.op->args[i], v, out);
  return out;
}

}  // namespace opforge::core
