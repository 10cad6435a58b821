// Backward ops: the name-matching rules of Note [Backward ops] (opforge/op_builder.h).
#include "backward.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include "records.h"
#include "schema.h"

namespace opforge::core {

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

std::vector<std::string> result_names(const OpforgeOpSpec& op) {
  std::vector<std::string> names;
  for (int32_t j = 0; j < op.num_outputs; ++j) names.emplace_back(op.outputs[j].name);
  for (int32_t i = 0; i < op.num_args; ++i)
    if (is_mutated(op.args[i])) names.push_back(std::string(op.args[i].name) + "_out");
  return names;
}

BackwardPlan plan_backward(const OpforgeOpSpec& fwd, const OpforgeOpSpec& bwd, std::vector<std::string>& problems) {
  static constexpr std::string_view kGrad = "grad_";
  const std::vector<std::string> results = result_names(fwd);
  const auto num_results = static_cast<int32_t>(results.size());
  auto index_of = [](auto names, int32_t n, std::string_view name) {
    for (int32_t i = 0; i < n; ++i)
      if (name == names(i)) return i;
    return int32_t{-1};
  };
  auto arg = [&](int32_t i) { return std::string_view(fwd.args[i].name); };
  auto out = [&](int32_t i) { return std::string_view(results[static_cast<size_t>(i)]); };
  auto grad_of = [&](std::string_view name) {
    return name.substr(0, kGrad.size()) == kGrad ? name.substr(kGrad.size()) : std::string_view();
  };
  auto type = [](const OpforgeArgSpec& a) { return std::string(schema_type(a.kind)) + (is_optional(a) ? "?" : ""); };
  std::string accepted, differentiable;
  for (int32_t j = 0; j < num_results; ++j) accepted += (j ? ", grad_" : "grad_") + std::string(out(j));
  for (int32_t i = 0; i < fwd.num_args; ++i)
    if (!is_mutated(fwd.args[i])) accepted += ", " + std::string(arg(i));
  for (int32_t j = 0; j < num_results; ++j) accepted += ", " + std::string(out(j));
  for (int32_t i = 0; i < fwd.num_args; ++i)
    if (fwd.args[i].kind == OPFORGE_ARG_TENSOR)
      differentiable += (differentiable.empty() ? "grad_" : ", grad_") + std::string(arg(i));
  const std::string site = declared_at(fwd), b = qualified_name(bwd);
  const size_t before = problems.size();
  auto problem = [&](const std::string& what) { problems.push_back(site + "backward op " + b + ": " + what); };
  BackwardPlan plan;
  for (int32_t k = 0; k < bwd.num_args; ++k)
    if (is_mutated(bwd.args[k]))
      problem("input '" + std::string(bwd.args[k].name) +
              "' is opforge::mutated, but a backward op may not write its inputs (the forward call's saved values "
              "and the caller's gradients)");
  for (int32_t i = 0; i < fwd.num_args + fwd.num_outputs; ++i) {
    const std::string_view name = i < fwd.num_args ? arg(i) : out(i - fwd.num_args);
    const auto of = grad_of(name);
    if (const int32_t j = of.empty() ? -1 : index_of(out, num_results, of); j >= 0)
      problems.push_back(site + (i < fwd.num_args ? "input '" : "output '") + std::string(name) +
                         "' is named like the gradient of its " +
                         (j < fwd.num_outputs ? "output '" : "mutated input's value after the op '") + std::string(of) +
                         "'; rename it (the backward op could not tell the two apart)");
  }
  for (int32_t j = fwd.num_outputs; j < num_results; ++j) {  // <input>_out of a mutated input
    const std::string_view name = out(j);
    if (index_of(arg, fwd.num_args, name) >= 0 || index_of(out, fwd.num_outputs, name) >= 0)
      problems.push_back(site + "'" + std::string(name) + "' names an argument or output and also mutated input '" +
                         std::string(name.substr(0, name.size() - 4)) +
                         "''s value after the op; rename it (the backward op could not tell the two apart)");
  }
  for (int32_t k = 0; k < bwd.num_args; ++k) {
    const OpforgeArgSpec& c = bwd.args[k];
    const std::string name = c.name;
    const bool tensor = c.kind == OPFORGE_ARG_TENSOR;
    int32_t i;
    if (const auto of = grad_of(name); !of.empty() && (i = index_of(out, num_results, of)) >= 0) {
      plan.sources.emplace_back(BackwardPlan::Source::kGrad, i);
      if (!tensor) problem("input '" + name + "' is " + type(c) + ", but a gradient is a Tensor");
    } else if ((i = index_of(arg, fwd.num_args, name)) >= 0) {
      plan.sources.emplace_back(BackwardPlan::Source::kArg, i);
      const OpforgeArgSpec& a = fwd.args[i];
      if (is_mutated(a))
        problem("input '" + name + "' names the forward op's mutated input " + name +
                ", whose value before the op is overwritten: call it " + name + "_out for its value after the op");
      else if (a.kind != c.kind || (is_optional(a) && !is_optional(c)))
        problem("input '" + name + "' is " + type(c) + ", but the forward op's " + name + " is " + type(a));
    } else if ((i = index_of(out, num_results, name)) >= 0) {
      plan.sources.emplace_back(BackwardPlan::Source::kOutput, i);
      if (!tensor)
        problem("input '" + name + "' is " + type(c) + ", but the forward op's " +
                (i < fwd.num_outputs ? "output " : "mutated input's value after the op ") + name + " is a Tensor");
    } else {
      problem("input '" + name + "' matches nothing of the forward op: expected one of " + accepted);
    }
  }
  plan.differentiable.assign(static_cast<size_t>(num_results), false);
  for (const auto& [source, i] : plan.sources)
    if (source == BackwardPlan::Source::kGrad) plan.differentiable[static_cast<size_t>(i)] = true;
  if (problems.size() == before &&  // its inputs all matched, none a gradient
      std::none_of(plan.differentiable.begin(), plan.differentiable.end(), [](bool d) { return d; }))
    problem("takes no gradient (no input grad_" + std::string(num_results ? out(0) : "<result>") +
            " or the like), so its results cannot depend on the loss; take the gradients it needs");
  std::vector<bool> given(static_cast<size_t>(fwd.num_args), false);
  for (int32_t k = 0; k < bwd.num_outputs; ++k) {
    const std::string name = bwd.outputs[k].name;
    const auto of = grad_of(name);
    auto tensor_arg = [&](std::string_view part) {
      const int32_t i = index_of(arg, fwd.num_args, part);
      return i >= 0 && fwd.args[i].kind == OPFORGE_ARG_TENSOR ? i : int32_t{-1};
    };
    // Every reading of <of> as tensor inputs joined by "_and_" (an input's own name may hold one).
    static constexpr std::string_view kAnd = "_and_";
    std::function<std::vector<std::vector<int32_t>>(std::string_view)> readings = [&](std::string_view rest) {
      std::vector<std::vector<int32_t>> found;
      if (const int32_t j = tensor_arg(rest); j >= 0) found.push_back({j});
      for (size_t cut = rest.find(kAnd); cut != std::string_view::npos; cut = rest.find(kAnd, cut + 1)) {
        const int32_t j = tensor_arg(rest.substr(0, cut));
        if (j < 0) continue;
        for (auto& tail : readings(rest.substr(cut + kAnd.size()))) {
          tail.insert(tail.begin(), j);
          found.push_back(std::move(tail));
        }
      }
      return found;
    };
    std::vector<std::vector<int32_t>> valid;
    bool repeats = false;
    for (auto& r : of.empty() ? std::vector<std::vector<int32_t>>{} : readings(of)) {
      std::vector<int32_t> sorted = r;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) repeats = true;
      else valid.push_back(std::move(r));
    }
    if (valid.size() > 1) {
      std::string options;
      for (const auto& r : valid) {
        std::string names;
        for (int32_t i : r) names += (names.empty() ? "" : " and ") + std::string(arg(i));
        options += (options.empty() ? "" : ", or ") + names;
      }
      problem("output '" + name + "' reads as the gradient of " + options +
              "; rename an input so that it reads one way");
      continue;
    }
    if (valid.empty()) {
      problem("output '" + name + "' is not the gradient of a tensor input: expected one of " + differentiable +
              ", or grad_<a>_and_<b> for one gradient of several" + (repeats ? " (each input named once)" : ""));
      continue;
    }
    std::vector<int32_t> targets = std::move(valid.front());
    for (int32_t i : targets) {
      if (given[static_cast<size_t>(i)])
        problem("output '" + name + "' gives a second gradient of " + std::string(arg(i)) + "; name each input once");
      given[static_cast<size_t>(i)] = true;
    }
    plan.targets.push_back(std::move(targets));
    plan.output_names.push_back(name);
  }
  return problems.size() == before ? plan : BackwardPlan{};
}

std::vector<std::string> check_backward_ops(const OpforgeLibrary& lib) {
  std::vector<std::string> problems;
  for (int32_t k = 0; k < lib.num_ops; ++k) {
    const OpforgeOpSpec& op = *lib.ops[k];
    const char* name = backward_name(op);
    if (name == nullptr) continue;
    if (const OpforgeOpSpec* bwd = find_op(lib, name)) {
      plan_backward(op, *bwd, problems);
    } else {
      problems.push_back(declared_at(op) + "backward op " + name +
                         ": not declared in this library (declare both ops in one library)");
    }
  }
  return problems;
}

}  // namespace opforge::core
