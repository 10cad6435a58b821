// Registering a loaded op library's ops with the PyTorch dispatcher (opforge/torch.h).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>

#include "../core/backward.h"
#include "../core/library.h"
#include "../core/schema.h"
#include "autograd.h"
#include "kernel.h"
#include "opforge/torch.h"
#include "types.h"

namespace opforge::torch {
namespace {

std::mutex g_mutex;
/// Per library registered with torch (by its resolved path), the dispatcher registrations.
std::map<std::string, std::vector<std::unique_ptr<::torch::Library>>>& registered() {
  static std::map<std::string, std::vector<std::unique_ptr<::torch::Library>>> libs;
  return libs;
}

std::unique_ptr<::torch::Library> register_op(const OpforgeLibrary& lib, const OpforgeOpSpec& op) {
  auto reg = std::make_unique<::torch::Library>(::torch::Library::FRAGMENT, op.ns, std::nullopt, op.file,
                                                static_cast<uint32_t>(op.line));
  reg->def(::torch::schema(core::schema(op).c_str(), c10::AliasAnalysisKind::FROM_SCHEMA));
  reg->impl(op.name, ::torch::dispatch(c10::DispatchKey::CPU, make_kernel(op, Mode::kCpu, &op.kernels[0])));
  reg->impl(op.name, ::torch::dispatch(c10::DispatchKey::Meta, make_kernel(op, Mode::kMeta, nullptr)));
  for (int32_t k = 1; k < op.num_kernels; ++k) {
    if (op.kernels[k].device_type == OPFORGE_DEVICE_CUDA)
      reg->impl(op.name, ::torch::dispatch(c10::DispatchKey::CUDA, make_kernel(op, Mode::kCuda, &op.kernels[k])));
  }
  if (const char* backward = core::backward_name(op)) {  // paired at load (core::check_backward_ops)
    std::vector<std::string> problems;
    core::BackwardPlan plan = core::plan_backward(op, *core::find_op(lib, backward), problems);
    reg->impl(op.name, ::torch::dispatch(c10::DispatchKey::Autograd, make_autograd_kernel(op, std::move(plan))));
  } else if (core::is_backward_op(lib, op)) {
    // A backward op without a backward of its own: torch's NotImplemented node, so a second
    // derivative raises when it is taken (create_graph, torch.func at any level), first
    // derivatives work, and a dual cotangent (forward over reverse) is refused.
    reg->impl(op.name,
              ::torch::dispatch(c10::DispatchKey::Autograd, ::torch::autograd::autogradNotImplementedFallback()));
  }
  return reg;
}

}  // namespace

std::string load_library(const std::string& path) {
  return with_torch_errors([&]() -> std::string {
    const core::Library& l = core::load_library(path);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (registered().count(l.path)) return l.json;
    std::string conflicts;  // checked for every op before any is registered
    for (int32_t i = 0; i < l.lib->num_ops; ++i) {
      const OpforgeOpSpec& op = *l.lib->ops[i];
      if (c10::Dispatcher::singleton().findSchema({core::qualified_name(op), ""}).has_value())
        conflicts += "\n" + core::declared_at(op) + "already registered with torch by other code";
    }
    if (!conflicts.empty()) throw InvalidArgument("opforge: " + path + " cannot be registered with torch:" + conflicts);
    auto& regs = registered()[l.path];
    for (int32_t i = 0; i < l.lib->num_ops; ++i) regs.push_back(register_op(*l.lib, *l.lib->ops[i]));
    return l.json;
  });
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> names;
  for (const core::Library* l : core::loaded_libraries()) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (!registered().count(l->path)) continue;
    }
    for (int32_t j = 0; j < l->lib->num_ops; ++j) names.push_back(core::qualified_name(*l->lib->ops[j]));
  }
  return names;
}

}  // namespace opforge::torch
