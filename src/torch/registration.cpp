// Registering a loaded op library's ops with the PyTorch dispatcher (opforge/torch.h).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "../core/backward.h"
#include "../core/classes.h"
#include "../core/library.h"
#include "../core/schema.h"
#include "../core/shared_object.h"
#include "autocast.h"
#include "autograd.h"
#include "classes.h"
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

/// The out= overload under functionalisation (torch.compile, torch.export): the functional op,
/// then copy_ into the out tensors (resized by torch's rules), which functionalisation records
/// as their new values. Eager calls never get here; they write into the out tensors directly.
class FunctionalizeOut final : public c10::OperatorKernel {
 public:
  explicit FunctionalizeOut(const OpforgeOpSpec& op) : op_(op) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, ::torch::jit::Stack* stack) {
    const int32_t n = op_.num_args, m = op_.num_outputs;
    std::vector<at::Tensor> outs;
    for (const auto& v : ::torch::jit::last(*stack, m)) outs.push_back(v.toTensor());
    ::torch::jit::Stack call(stack->end() - n - m, stack->end() - m);
    std::call_once(found_, [&] {
      functional_ = c10::Dispatcher::singleton().findSchemaOrThrow(core::qualified_name(op_).c_str(), "");
    });
    functional_->callBoxed(call);
    for (int32_t k = 0; k < m; ++k) {
      const at::Tensor result = call[k].toTensor();
      at::native::resize_output_symint(outs[k], result.sym_sizes());
      outs[k].copy_(result);
    }
    ::torch::jit::drop(*stack, n + m);
    for (auto& t : outs) ::torch::jit::push(*stack, std::move(t));
  }

 private:
  const OpforgeOpSpec& op_;
  std::once_flag found_;
  std::optional<c10::OperatorHandle> functional_;
};

/// Registers the kernels of one overload of `op`: CPU (the reference), Meta, and CUDA if declared.
/// An op with data-dependent sizes gets no Meta kernel: its fake kernel, registered from Python,
/// creates the unbacked sizes and calls the fake companion's (Note [Data-dependent sizes]).
void register_kernels(::torch::Library& reg, const char* name, const OpforgeOpSpec& op, bool out) {
  reg.impl(name,
           ::torch::dispatch(c10::DispatchKey::CPU, make_kernel(op, Mode::kCpu, kernel_for(op, Mode::kCpu), out)));
  if (!core::has_data_dependent_sizes(op))
    reg.impl(name, ::torch::dispatch(c10::DispatchKey::Meta, make_kernel(op, Mode::kMeta, nullptr, out)));
  if (const OpforgeKernel* cuda = kernel_for(op, Mode::kCuda))
    reg.impl(name, ::torch::dispatch(c10::DispatchKey::CUDA, make_kernel(op, Mode::kCuda, cuda, out)));
}

/// An overload that writes tensors it is given (mutated inputs, out= tensors) has no derivative
/// and bumps the version counters of what it writes (Note [Writers and autograd]).
void register_writer(::torch::Library& reg, const char* name) {
  reg.impl(name, ::torch::dispatch(c10::DispatchKey::ADInplaceOrView, make_writer_inplace_kernel()));
  reg.impl(name, ::torch::dispatch(c10::DispatchKey::Autograd, make_writer_autograd_kernel()));
}

std::unique_ptr<::torch::Library> register_op(const OpforgeLibrary& lib, const OpforgeOpSpec& op) {
  auto reg = std::make_unique<::torch::Library>(::torch::Library::FRAGMENT, op.ns, std::nullopt, op.file,
                                                static_cast<uint32_t>(op.line));
  reg->def(::torch::schema(core::schema(op).c_str(), c10::AliasAnalysisKind::FROM_SCHEMA));
  register_kernels(*reg, op.name, op, /*out=*/false);
  if (core::autocast_policy(op) != OPFORGE_AUTOCAST_NONE) {  // as torch.library.register_autocast
    reg->impl(op.name,
              ::torch::dispatch(c10::DispatchKey::AutocastCPU, make_autocast_kernel(op, c10::DeviceType::CPU)));
    reg->impl(op.name,
              ::torch::dispatch(c10::DispatchKey::AutocastCUDA, make_autocast_kernel(op, c10::DeviceType::CUDA)));
  }
  if (core::has_data_dependent_sizes(op)) {
    const std::string fake = core::fake_companion_name(op);
    reg->def(::torch::schema(core::fake_companion_schema(op).c_str(), c10::AliasAnalysisKind::FROM_SCHEMA));
    reg->impl(fake.c_str(), ::torch::dispatch(c10::DispatchKey::Meta, make_kernel(op, Mode::kFake, nullptr)));
  }
  if (const char* backward = core::backward_name(op)) {  // paired at load (core::check_backward_ops)
    std::vector<std::string> problems;
    core::BackwardPlan plan = core::plan_backward(op, *core::find_op(lib, backward), problems);
    if (core::mutates_inputs(op))  // the version bump of Note [Writers and autograd]
      reg->impl(op.name, ::torch::dispatch(c10::DispatchKey::ADInplaceOrView, make_writer_inplace_kernel()));
    reg->impl(op.name, ::torch::dispatch(c10::DispatchKey::Autograd, make_autograd_kernel(op, std::move(plan))));
  } else if (core::mutates_inputs(op)) {
    register_writer(*reg, op.name);
  } else {
    // An op without a backward op (a backward op without one of its own included): torch's
    // NotImplemented node, as for torch's own ops without a derivative formula. A backward that
    // must pass a gradient through it into an input that requires grad raises "derivative for
    // ns::op is not implemented" (a Linear before it would otherwise silently never train; for
    // a backward op, a second derivative: create_graph, torch.func at any level), and so does
    // torch.compile of a call that needs that gradient; calls under no_grad or inference_mode,
    // or whose inputs do not require grad, are free.
    reg->impl(op.name,
              ::torch::dispatch(c10::DispatchKey::Autograd, ::torch::autograd::autogradNotImplementedFallback()));
  }
  if (core::has_out_overload(op)) {  // "ns::op.out"
    const std::string out = std::string(op.name) + ".out";
    reg->def(::torch::schema(core::out_schema(op).c_str(), c10::AliasAnalysisKind::FROM_SCHEMA));
    register_kernels(*reg, out.c_str(), op, /*out=*/true);
    register_writer(*reg, out.c_str());
    reg->impl(out.c_str(),
              ::torch::dispatch(c10::DispatchKey::Functionalize,
                                ::torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FunctionalizeOut>(op))));
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
    for (const OpforgeClassSpec* c : core::library_classes(*l.lib))
      if (::torch::getCustomClass(std::string("__torch__.torch.classes.") + c->ns + "." + c->name))
        conflicts += "\n" + opforge::detail::declared_at(c->file, c->line, core::qualified_name(*c)) +
                     "already registered with torch by other code";
    if (!conflicts.empty()) throw InvalidArgument("opforge: " + path + " cannot be registered with torch:" + conflicts);
    auto& regs = registered()[l.path];
    for (int32_t i = 0; i < l.lib->num_ops; ++i) regs.push_back(register_op(*l.lib, *l.lib->ops[i]));
    register_classes(*l.lib);  // after the ops: methods call them through the dispatcher
    return l.json;
  });
}

void* open_shared_object(const std::string& path, const std::string& what, int flags) {
  return with_torch_errors([&] { return core::open_shared_object(path, what, flags); });
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
