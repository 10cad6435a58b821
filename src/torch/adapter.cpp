// The PyTorch adapter: registers every op of a loaded op library with the dispatcher.
//
// Mechanical by design (STYLE 12): schemas, checks, messages and shape rules come from
// src/core; this file translates between IValues/at::Tensor and the C ABI, and picks the
// device, stream and allocator. One boxed kernel class serves every op and dispatch key, since
// calls from Python and from AOTInductor's proxy executor arrive boxed anyway.
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/SymInt.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>

#include "../core/check.h"
#include "../core/schema.h"
#include "opforge/torch.h"

namespace opforge::core {
/// Symbolic sizes: c10::SymInt arithmetic builds sympy expressions under torch.compile and
/// torch.export; comparisons add guards rather than specialising on a value.
template <>
struct IntOps<c10::SymInt> {
  static c10::SymInt floordiv(const c10::SymInt& a, const c10::SymInt& b) { return a / b; }
  static c10::SymInt min(const c10::SymInt& a, const c10::SymInt& b) { return a.min(b); }
  static c10::SymInt max(const c10::SymInt& a, const c10::SymInt& b) { return a.max(b); }
  // expect_true: a backed size is guarded on as usual; an unbacked (data-dependent) one is
  // assumed to pass and checked when the graph runs (as TORCH_SYM_CHECK does).
  static bool eq(const c10::SymInt& a, const c10::SymInt& b) { return a.sym_eq(b).expect_true(__FILE__, __LINE__); }
  static bool divisible(const c10::SymInt& a, int64_t k) {
    return (a % c10::SymInt(k)).sym_eq(c10::SymInt(0)).expect_true(__FILE__, __LINE__);
  }
  // Printed through the symbolic node, not iostreams (Note [No iostreams across the torch boundary]).
  static std::string str(const c10::SymInt& a) {
    if (auto v = a.maybe_as_int()) return std::to_string(*v);
    return a.toSymNodeImplUnowned()->str();
  }
};
}  // namespace opforge::core

namespace opforge::torch {
namespace {

int32_t to_opforge(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return OPFORGE_DTYPE_FLOAT32;
    case at::kDouble: return OPFORGE_DTYPE_FLOAT64;
    case at::kHalf: return OPFORGE_DTYPE_FLOAT16;
    case at::kBFloat16: return OPFORGE_DTYPE_BFLOAT16;
    case at::kChar: return OPFORGE_DTYPE_INT8;
    case at::kShort: return OPFORGE_DTYPE_INT16;
    case at::kInt: return OPFORGE_DTYPE_INT32;
    case at::kLong: return OPFORGE_DTYPE_INT64;
    case at::kByte: return OPFORGE_DTYPE_UINT8;
    case at::kBool: return OPFORGE_DTYPE_BOOL;
    default: return -1;
  }
}

at::ScalarType to_torch(int32_t d) {
  static const at::ScalarType kTypes[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar,
                                          at::kShort, at::kInt,    at::kLong, at::kByte,     at::kBool};
  TORCH_INTERNAL_ASSERT(d >= 0 && d < OPFORGE_NUM_DTYPES, "opforge: bad dtype code ", d);
  return kTypes[d];
}

/// torch's Python name of a dtype ("bfloat16", "complex64"); c10's for the rare ones this
/// does not list.
const char* torch_dtype_name(at::ScalarType t) {
  const int32_t d = to_opforge(t);
  if (d >= 0) return dtype_name(d);
  switch (t) {
    case at::kComplexHalf: return "complex32";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    case at::kFloat8_e4m3fn: return "float8_e4m3fn";
    case at::kFloat8_e5m2: return "float8_e5m2";
    case at::kFloat8_e4m3fnuz: return "float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz: return "float8_e5m2fnuz";
    case at::kUInt16: return "uint16";
    case at::kUInt32: return "uint32";
    case at::kUInt64: return "uint64";
    case at::kQInt8: return "qint8";
    case at::kQUInt8: return "quint8";
    case at::kQInt32: return "qint32";
    default: return c10::toString(t);
  }
}

/// Lower-case device type name ("cuda"), computed once per type.
const char* device_type_name(c10::DeviceType type) {
  static const auto names = [] {
    std::array<std::string, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)> n;
    for (size_t i = 0; i < n.size(); ++i) {
      try {
        n[i] = c10::DeviceTypeName(static_cast<c10::DeviceType>(i), /*lower_case=*/true);
      } catch (...) {
        n[i] = "device" + std::to_string(i);
      }
    }
    return n;
  }();
  return names[static_cast<size_t>(type)].c_str();
}

enum class Mode { kCpu, kCuda, kMeta };

/// When set (by opforge verify), outputs are filled with NaN (integers: a sentinel) before the
/// kernel runs, so an element the kernel never writes shows up as a mismatch.
std::atomic<bool> g_poison_outputs{false};

/// Arguments of one call converted from the stack, with storage for strings and lists.
struct CallArgs {
  std::vector<at::Tensor> tensors;
  std::vector<std::string> strings;
  std::vector<std::vector<int64_t>> int_lists;
  std::vector<std::vector<double>> float_lists;
  std::vector<OpforgeValue> values;
};

/// Scratch memory for a kernel: tensors from torch's allocator on the kernel's device, kept
/// alive until the kernel call returns (stream-ordered reuse makes that safe on CUDA).
struct Scratch {
  at::TensorOptions options;
  std::vector<at::Tensor> buffers;
  static void* allocate(void* state, size_t bytes) {
    auto* s = static_cast<Scratch*>(state);
    try {
      s->buffers.push_back(at::empty({static_cast<int64_t>(bytes)}, s->options));
      return s->buffers.back().data_ptr();
    } catch (...) {
      return nullptr;
    }
  }
};

class OpKernel final : public c10::OperatorKernel {
 public:
  OpKernel(const OpforgeOpSpec* op, Mode mode, const OpforgeKernel* kernel) : op_(op), mode_(mode), kernel_(kernel) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, ::torch::jit::Stack* stack) {
    const int32_t n = op_->num_args;
    CallArgs call = unpack(::torch::jit::last(*stack, n));
    std::vector<at::Tensor> outputs = mode_ == Mode::kMeta ? run<c10::SymInt>(call) : run<int64_t>(call);
    ::torch::jit::drop(*stack, n);
    for (auto& t : outputs) ::torch::jit::push(*stack, std::move(t));
  }

 private:
  CallArgs unpack(c10::ArrayRef<c10::IValue> ivalues) const {
    const int32_t n = op_->num_args;
    CallArgs c;
    c.tensors.resize(n);
    c.strings.resize(n);
    c.int_lists.resize(n);
    c.float_lists.resize(n);
    c.values.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      const c10::IValue& iv = ivalues[i];
      OpforgeValue& v = c.values[i];
      v.kind = op_->args[i].kind;
      switch (op_->args[i].kind) {
        case OPFORGE_ARG_TENSOR:  // None (an optional input left out) stays an undefined tensor
          if (!iv.isNone()) c.tensors[i] = iv.toTensor();
          break;
        case OPFORGE_ARG_INT: v.i = iv.toInt(); break;
        case OPFORGE_ARG_FLOAT: v.f = iv.toDouble(); break;
        case OPFORGE_ARG_BOOL: v.i = iv.toBool(); break;
        case OPFORGE_ARG_STRING:
          c.strings[i] = iv.toStringRef();
          v.s = c.strings[i].c_str();
          v.len = c.strings[i].size();
          break;
        case OPFORGE_ARG_INT_LIST:
          c.int_lists[i] = iv.toIntVector();
          v.ints = c.int_lists[i].data();
          v.len = c.int_lists[i].size();
          break;
        case OPFORGE_ARG_FLOAT_LIST:
          c.float_lists[i] = iv.toDoubleVector();
          v.floats = c.float_lists[i].data();
          v.len = c.float_lists[i].size();
          break;
      }
    }
    return c;
  }

  template <class Int>
  std::vector<at::Tensor> run(CallArgs& call) const {
    const int32_t n = op_->num_args;
    std::vector<core::ArgInfo<Int>> info(n);
    std::vector<std::string> errors;
    int32_t device_arg = -1;
    for (int32_t i = 0; i < n; ++i) {
      info[i].value = call.values[i];
      if (op_->args[i].kind != OPFORGE_ARG_TENSOR) continue;
      const at::Tensor& t = call.tensors[i];
      if (!t.defined()) {  // check_args accepts it for an optional input only
        info[i].defined = false;
        continue;
      }
      if (device_arg < 0) device_arg = i;
      info[i].dtype = to_opforge(t.scalar_type());
      info[i].dtype_label = torch_dtype_name(t.scalar_type());
      info[i].device_type = device_type_name(t.device().type());
      info[i].device_index = t.device().has_index() ? t.device().index() : -1;
      if constexpr (std::is_same_v<Int, c10::SymInt>) {
        auto s = t.sym_sizes();
        info[i].sizes.assign(s.begin(), s.end());
      } else {
        auto s = t.sizes();
        info[i].sizes.assign(s.begin(), s.end());
      }
    }
    core::check_args<Int>(*op_, info, errors);
    std::vector<core::OutputInfo<Int>> outs;
    if (errors.empty()) core::output_shapes<Int>(*op_, info, outs, errors);
    TORCH_CHECK_VALUE(errors.empty(), core::invalid_arguments_message(*op_, errors));

    const at::Device device = call.tensors[device_arg].device();
    std::vector<at::Tensor> outputs;
    outputs.reserve(outs.size());
    for (const auto& o : outs) {
      auto options = at::TensorOptions().dtype(to_torch(o.dtype)).device(device);
      if constexpr (std::is_same_v<Int, c10::SymInt>) {
        outputs.push_back(at::empty_symint(o.sizes, options));
      } else {
        outputs.push_back(at::empty(o.sizes, options));
      }
    }
    if constexpr (std::is_same_v<Int, int64_t>) launch(call, outputs, device);
    return outputs;
  }

  void launch(CallArgs& call, const std::vector<at::Tensor>& outputs, const at::Device& device) const {
    // Empty outputs: nothing to compute, no launch (the correctness contract).
    bool all_empty = !outputs.empty();
    for (const auto& o : outputs) all_empty = all_empty && o.numel() == 0;
    if (all_empty) return;

    if (g_poison_outputs.load(std::memory_order_relaxed)) {
      for (const auto& o : outputs) {
        if (at::isFloatingType(o.scalar_type())) o.fill_(NAN);
        else o.fill_(o.scalar_type() == at::kBool ? 1 : 123);
      }
    }
    const int32_t n = op_->num_args;
    std::vector<OpforgeArg> args(n);
    for (int32_t i = 0; i < n; ++i) {
      args[i].value = call.values[i];
      if (op_->args[i].kind != OPFORGE_ARG_TENSOR) continue;
      at::Tensor& t = call.tensors[i];
      if (!t.defined()) {  // an optional input left out: absent (see OpforgeTensor)
        const int32_t index = device.has_index() ? device.index() : -1;
        args[i].tensor = {nullptr, -1, kernel_device_type(), index, /*ndim=*/-1, nullptr, nullptr};
        continue;
      }
      const int32_t layout = op_->args[i].tensor.layout;
      if (layout == OPFORGE_LAYOUT_CONTIGUOUS ||
          (layout == OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM && !rows_aligned(t))) {
        // Dense, row-major and 16-byte aligned, so kernels may use vector loads unconditionally:
        // a misaligned view (a storage offset) is copied into a fresh, aligned allocation.
        t = t.contiguous();
        if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) t = t.clone(at::MemoryFormat::Contiguous);
      }
      args[i].tensor = view(t);
    }
    std::vector<OpforgeTensor> out_views;
    out_views.reserve(outputs.size());
    for (const auto& o : outputs) out_views.push_back(view(o));

    c10::OptionalDeviceGuard guard;
    OpforgeContext ctx{};
    ctx.struct_size = sizeof(OpforgeContext);
    ctx.device_type = kernel_device_type();
    ctx.device_index = device.has_index() ? device.index() : -1;
    if (mode_ == Mode::kCuda) {
      guard.reset_device(device);
      c10::impl::VirtualGuardImpl impl(device.type());
      ctx.stream = impl.getStream(device).native_handle();
    }
    Scratch scratch{at::TensorOptions().dtype(at::kByte).device(device), {}};
    ctx.allocate = &Scratch::allocate;
    ctx.allocator_state = &scratch;

    char error[4096] = {0};
    OpforgeCallFrame frame{};
    frame.struct_size = sizeof(OpforgeCallFrame);
    frame.ctx = &ctx;
    frame.num_args = n;
    frame.args = args.data();
    frame.num_outputs = static_cast<int32_t>(out_views.size());
    frame.outputs = out_views.data();
    frame.error = error;
    frame.error_capacity = sizeof(error);
    const int32_t status = kernel_->fn(&frame, kernel_->user);
    TORCH_CHECK_VALUE(status != OPFORGE_STATUS_INVALID_ARGUMENT, core::qualified_name(*op_), ": ", error);
    TORCH_CHECK(status == OPFORGE_STATUS_OK, core::qualified_name(*op_), " (", device.str(), " kernel): ", error);
  }

  int32_t kernel_device_type() const { return mode_ == Mode::kCuda ? OPFORGE_DEVICE_CUDA : OPFORGE_DEVICE_CPU; }

  /// Whether `t` may reach an input declared opforge::contiguous_last_dim as it is: a last dim
  /// of adjacent elements, and a data pointer and other strides that are multiples of 16 bytes
  /// (strides of size-1 dims never move a pointer and are not looked at).
  static bool rows_aligned(const at::Tensor& t) {
    const int64_t rank = t.dim();
    if (rank == 0) return false;
    if (t.size(rank - 1) > 1 && t.stride(rank - 1) != 1) return false;
    const int64_t item = static_cast<int64_t>(t.element_size());
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
    for (int64_t d = 0; d + 1 < rank; ++d)
      if (t.size(d) > 1 && (t.stride(d) * item) % 16 != 0) return false;
    return true;
  }

  static OpforgeTensor view(const at::Tensor& t) {
    OpforgeTensor v{};
    v.data = t.data_ptr();
    v.dtype = to_opforge(t.scalar_type());
    v.device_type = t.is_cuda() ? OPFORGE_DEVICE_CUDA : OPFORGE_DEVICE_CPU;
    v.device_index = t.device().has_index() ? t.device().index() : -1;
    v.ndim = static_cast<int32_t>(t.dim());
    v.sizes = t.sizes().data();
    v.strides = t.strides().data();
    return v;
  }

  const OpforgeOpSpec* op_;
  Mode mode_;
  const OpforgeKernel* kernel_;
};

// Note [Autograd kernel]
// An op that names a backward op (Note [Backward ops] in opforge/op.h) gets one boxed kernel at
// the Autograd key. When grad mode is on and a tensor input requires grad, it saves what the
// backward op asks for (core::BackwardPlan), runs the op below autograd and attaches a
// BackwardNode to the differentiable outputs; otherwise it only redispatches (no Python on the
// call path, unlike torch.library.register_autograd: 2.4 against 8 us a call, measured on the
// CPU). The node calls the backward op through the dispatcher, so its kernels, torch.compile's
// tracing of the backward graph and a backward op's own backward (double backward) work as for
// any op. The same shape as the kernels torch generates for its own ops (VariableType). A
// backward op without a backward of its own gets torch's autogradNotImplementedFallback, so a
// second derivative raises when it is taken, at any torch.func level. Any other op without a
// backward op gets no Autograd kernel: torch's fallback warns if a gradient reaches it, and
// models that use it still compile with parameters that require grad. Not supported: compiled
// autograd (the node has no compiled_args/apply_with_saved).
class BackwardNode final : public ::torch::autograd::Node {
 public:
  BackwardNode(const OpforgeOpSpec* op, const core::BackwardPlan* plan, const std::vector<int32_t>* tensor_slot)
      : op_(op), plan_(plan), tensor_slot_(*tensor_slot) {}

  std::string name() const override { return core::qualified_name(*op_) + "Backward"; }

  ::torch::autograd::variable_list apply(::torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);  // against release_variables from another thread
    TORCH_CHECK(!released_ || !saves_anything(), ::torch::autograd::ERR_BACKWARD_TWICE);
    const char* backward_name = core::backward_name(*op_);
    ::torch::jit::Stack stack;
    size_t saved_output = 0;  // saved_outputs_ follows the plan's kOutput sources in order
    for (const auto& [source, i] : plan_->sources) {
      switch (source) {
        case core::BackwardPlan::Source::kGrad:  // zeros for an output that did not reach the loss
          stack.emplace_back(grads[i].defined() ? grads[i]
                                                : at::zeros_symint(outputs_[i].first, outputs_[i].second));
          break;
        case core::BackwardPlan::Source::kArg:
          if (op_->args[i].kind != OPFORGE_ARG_TENSOR) stack.push_back(params_[i]);
          else if (saved_args_[i].has_value()) stack.emplace_back(saved_args_[i]->unpack());
          else stack.emplace_back();  // an optional input that was left out
          break;
        case core::BackwardPlan::Source::kOutput: stack.emplace_back(saved_outputs_[saved_output++].unpack(getptr())); break;
      }
    }
    backward_->callBoxed(stack);  // under create_graph, its own Autograd kernel records its history
    ::torch::autograd::variable_list input_grads(shapes_.size());
    std::vector<bool> given(shapes_.size(), false);
    for (size_t k = 0; k < plan_->targets.size(); ++k) {
      const int32_t i = plan_->targets[k], slot = tensor_slot_[i];
      given[slot] = true;
      if (!given_input(slot) || stack[k].isNone()) continue;  // an optional input that was left out gets none
      at::Tensor grad = stack[k].toTensor();
      TORCH_CHECK(grad.sym_sizes() == shapes_[slot].first && grad.scalar_type() == shapes_[slot].second,
                  backward_name, " returned grad_", op_->args[i].name, " of shape ", grad.sym_sizes(), " and dtype ",
                  grad.scalar_type(), " for ", core::qualified_name(*op_), "'s input ", op_->args[i].name, " of shape ",
                  c10::SymIntArrayRef(shapes_[slot].first), " and dtype ", shapes_[slot].second,
                  "; a gradient has its input's shape and dtype");
      input_grads[slot] = std::move(grad);
    }
    for (int32_t i = 0; i < op_->num_args; ++i) {  // as torch's own ops: a needed gradient nobody computes
      const int32_t slot = tensor_slot_[i];
      TORCH_CHECK_NOT_IMPLEMENTED(slot < 0 || given[slot] || !given_input(slot) || !task_should_compute_output(slot),
                                  "the derivative of ", core::qualified_name(*op_), " for its input '", op_->args[i].name,
                                  "' is not implemented: its backward op ", backward_name, " has no grad_",
                                  op_->args[i].name, " output");
    }
    return input_grads;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    for (auto& v : saved_args_)
      if (v) v->reset_data();
    for (auto& v : saved_outputs_) v.reset_data();
  }

  /// Whether tensor argument `slot` was given (not an optional input left out).
  bool given_input(int32_t slot) const { return shapes_[slot].second != at::ScalarType::Undefined; }
  /// Whether the node holds saved tensors, which a second backward would need.
  bool saves_anything() const {
    return !saved_outputs_.empty() ||
           std::any_of(saved_args_.begin(), saved_args_.end(), [](const auto& v) { return v.has_value(); });
  }

  const OpforgeOpSpec* op_;
  const core::BackwardPlan* plan_;
  const std::vector<int32_t>& tensor_slot_;  // per argument: its index among the tensor arguments (the kernel's)
  std::optional<c10::OperatorHandle> backward_;
  bool released_ = false;
  std::vector<std::pair<std::vector<c10::SymInt>, at::ScalarType>> shapes_;  // per tensor argument; Undefined: left out
  std::vector<std::optional<::torch::autograd::SavedVariable>> saved_args_;  // per argument, if saved
  std::vector<c10::IValue> params_;                                          // per argument, if a parameter
  std::vector<::torch::autograd::SavedVariable> saved_outputs_;              // the plan's kOutput sources, in order
  std::vector<std::pair<std::vector<c10::SymInt>, at::TensorOptions>> outputs_;  // per output: zeros for it
};

class AutogradKernel final : public c10::OperatorKernel {
 public:
  AutogradKernel(const OpforgeOpSpec* op, core::BackwardPlan plan) : op_(op), plan_(std::move(plan)) {
    tensor_slot_.assign(op_->num_args, -1);
    for (int32_t i = 0, t = 0; i < op_->num_args; ++i)
      if (op_->args[i].kind == OPFORGE_ARG_TENSOR) tensor_slot_[i] = t++;
    for (const auto& [source, i] : plan_.sources) {
      if (source == core::BackwardPlan::Source::kArg) save_arg_.push_back(i);
      if (source == core::BackwardPlan::Source::kOutput) save_output_.push_back(i);
    }
  }

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, ::torch::jit::Stack* stack) {
    const int32_t n = op_->num_args;
    auto arg = [&](int32_t i) -> const c10::IValue& { return (*stack)[stack->size() - n + i]; };
    bool requires_grad = false;
    for (int32_t i = 0; i < n; ++i) {
      if (op_->args[i].kind != OPFORGE_ARG_TENSOR || arg(i).isNone()) continue;
      const at::Tensor& t = arg(i).toTensor();
      requires_grad |= t.requires_grad();
      TORCH_CHECK_NOT_IMPLEMENTED(!t._fw_grad(/*level=*/0).defined(), "Trying to use forward AD with ",
                                  core::qualified_name(*op_),
                                  ", which does not support it: its backward op gives reverse-mode gradients only");
    }
    std::shared_ptr<BackwardNode> node;
    if (requires_grad && at::GradMode::is_enabled()) {
      node = std::shared_ptr<BackwardNode>(new BackwardNode(op_, &plan_, &tensor_slot_), ::torch::autograd::deleteNode);
      save_inputs(*node, arg);
    }
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      handle.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    }
    if (!node) return;
    const int32_t m = op_->num_outputs;
    std::vector<at::Tensor> outputs;
    for (int32_t j = 0; j < m; ++j) outputs.push_back((*stack)[stack->size() - m + j].toTensor());
    for (const at::Tensor& out : outputs) {
      node->outputs_.emplace_back(out.sym_sizes().vec(), out.options());
      if (::torch::autograd::isDifferentiableType(out.scalar_type())) ::torch::autograd::set_history(out, node);
      else node->add_input_metadata(::torch::autograd::Node::undefined_input());
    }
    for (int32_t j : save_output_) node->saved_outputs_.emplace_back(outputs[j], /*is_output=*/true);
  }

 private:
  /// The node's next edges (one per tensor argument, in order), the tensor arguments' shapes
  /// and dtypes, and the arguments the plan saves.
  template <class Arg>
  void save_inputs(BackwardNode& node, const Arg& arg) {
    const int32_t n = op_->num_args;
    std::call_once(found_, [&] { backward_ = c10::Dispatcher::singleton().findSchemaOrThrow(core::backward_name(*op_), ""); });
    node.backward_ = *backward_;
    node.saved_args_.resize(n);
    node.params_.resize(n);
    std::vector<at::Tensor> tensors;  // undefined where an optional one is None
    for (int32_t i = 0; i < n; ++i)
      if (op_->args[i].kind == OPFORGE_ARG_TENSOR) tensors.push_back(arg(i).isNone() ? at::Tensor() : arg(i).toTensor());
    node.set_next_edges(::torch::autograd::collect_next_edges(tensors));
    for (const at::Tensor& t : tensors)
      node.shapes_.emplace_back(t.defined() ? t.sym_sizes().vec() : std::vector<c10::SymInt>{},
                                t.defined() ? t.scalar_type() : at::ScalarType::Undefined);
    for (int32_t i : save_arg_) {
      if (op_->args[i].kind != OPFORGE_ARG_TENSOR) node.params_[i] = arg(i);
      else if (!arg(i).isNone()) node.saved_args_[i].emplace(arg(i).toTensor(), /*is_output=*/false);
    }
  }

  const OpforgeOpSpec* op_;
  core::BackwardPlan plan_;
  std::vector<int32_t> tensor_slot_;  // per argument: its index among the tensor arguments, or -1
  std::vector<int32_t> save_arg_, save_output_;
  std::once_flag found_;
  std::optional<c10::OperatorHandle> backward_;
};

struct LoadedLibrary {
  std::string path;
  const OpforgeLibrary* lib = nullptr;
  std::string json;
  std::vector<std::unique_ptr<::torch::Library>> registrations;
};

std::mutex g_mutex;
std::vector<std::unique_ptr<LoadedLibrary>>& loaded() {
  static std::vector<std::unique_ptr<LoadedLibrary>> libs;
  return libs;
}

::torch::CppFunction kernel_for(const OpforgeOpSpec* op, Mode mode, const OpforgeKernel* k) {
  return ::torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpKernel>(op, mode, k));
}

void register_op(LoadedLibrary& l, const OpforgeOpSpec* op) {
  auto lib = std::make_unique<::torch::Library>(::torch::Library::FRAGMENT, op->ns, std::nullopt, op->file,
                                                static_cast<uint32_t>(op->line));
  lib->def(::torch::schema(core::schema(*op).c_str(), c10::AliasAnalysisKind::FROM_SCHEMA));
  lib->impl(op->name, ::torch::dispatch(c10::DispatchKey::CPU, kernel_for(op, Mode::kCpu, &op->kernels[0])));
  lib->impl(op->name, ::torch::dispatch(c10::DispatchKey::Meta, kernel_for(op, Mode::kMeta, nullptr)));
  for (int32_t k = 1; k < op->num_kernels; ++k) {
    if (op->kernels[k].device_type == OPFORGE_DEVICE_CUDA)
      lib->impl(op->name, ::torch::dispatch(c10::DispatchKey::CUDA, kernel_for(op, Mode::kCuda, &op->kernels[k])));
  }
  if (const char* backward = core::backward_name(*op)) {  // checked at load (core::check_backward_ops)
    std::string problems;
    core::BackwardPlan plan = core::plan_backward(*op, *core::find_op(*l.lib, backward), problems);
    lib->impl(op->name, ::torch::dispatch(c10::DispatchKey::Autograd,
                                          ::torch::CppFunction::makeFromBoxedFunctor(
                                              std::make_unique<AutogradKernel>(op, std::move(plan)))));
  } else if (core::is_backward_op(*l.lib, *op)) {
    // A backward op without a backward of its own: torch's NotImplemented node, so a second
    // derivative raises when it is taken (create_graph, torch.func at any level), first
    // derivatives work, and a dual cotangent (forward over reverse) is refused.
    lib->impl(op->name, ::torch::dispatch(c10::DispatchKey::Autograd, ::torch::autograd::autogradNotImplementedFallback()));
  }
  l.registrations.push_back(std::move(lib));
}

}  // namespace

std::string load_library(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  char resolved[PATH_MAX];
  TORCH_CHECK(realpath(path.c_str(), resolved) != nullptr, "opforge.load_library: cannot open ", path, ": ",
              std::strerror(errno));
  const std::string real(resolved);
  for (const auto& l : loaded())
    if (l->path == real) return l->json;

  void* handle = dlopen(real.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle != nullptr, "opforge.load_library: cannot load ", path, ": ", dlerror());
  auto entry = reinterpret_cast<OpforgeLibraryFn>(dlsym(handle, OPFORGE_LIBRARY_SYMBOL));
  TORCH_CHECK_VALUE(entry != nullptr, "opforge.load_library: ", path, " is not an opforge op library (no ",
                    OPFORGE_LIBRARY_SYMBOL, " symbol; build it with opforge_add_library or opforge.build_library)");
  const OpforgeLibrary* lib = entry();
  TORCH_CHECK_VALUE(lib != nullptr && lib->abi_version == OPFORGE_ABI_VERSION, "opforge.load_library: ", path,
                    " was built for opforge ABI version ", lib ? lib->abi_version : -1, ", this adapter reads version ",
                    OPFORGE_ABI_VERSION, "; rebuild the op library");
  TORCH_CHECK_VALUE(lib->error == nullptr, "opforge.load_library: ", path, " has invalid op declarations:\n",
                    lib->error);
  const std::string backward_problems = core::check_backward_ops(*lib);
  TORCH_CHECK_VALUE(backward_problems.empty(), "opforge.load_library: ", path, " has invalid backward ops:\n",
                    backward_problems);
  for (int32_t i = 0; i < lib->num_ops; ++i) {
    const OpforgeOpSpec* op = lib->ops[i];
    const std::string name = core::qualified_name(*op);
    for (const auto& l : loaded())
      for (int32_t j = 0; j < l->lib->num_ops; ++j)
        TORCH_CHECK_VALUE(core::qualified_name(*l->lib->ops[j]) != name, "opforge.load_library: ", path,
                          " declares ", name, " (", op->file, ":", op->line, "), which ", l->path,
                          " already registered (", l->lib->ops[j]->file, ":", l->lib->ops[j]->line, ")");
    TORCH_CHECK_VALUE(!c10::Dispatcher::singleton().findSchema({name, ""}).has_value(), "opforge.load_library: ",
                      path, " declares ", name, " (", op->file, ":", op->line,
                      "), which is already registered with torch by other code");
  }
  auto l = std::make_unique<LoadedLibrary>();
  l->path = real;
  l->lib = lib;
  l->json = core::library_json(*lib);
  for (int32_t i = 0; i < lib->num_ops; ++i) register_op(*l, lib->ops[i]);
  loaded().push_back(std::move(l));
  return loaded().back()->json;
}

std::vector<std::string> registered_ops() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::string> names;
  for (const auto& l : loaded())
    for (int32_t j = 0; j < l->lib->num_ops; ++j) names.push_back(core::qualified_name(*l->lib->ops[j]));
  return names;
}

}  // namespace opforge::torch

namespace {
char* copy_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}
}  // namespace

extern "C" int opforge_torch_load_library(const char* path, char** json, char** error) {
  *json = nullptr;
  *error = nullptr;
  try {
    *json = copy_string(opforge::torch::load_library(path));
    return 0;
  } catch (const c10::ValueError& e) {
    *error = copy_string(e.what_without_backtrace());
    return 1;
  } catch (const c10::Error& e) {
    *error = copy_string(e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    *error = copy_string(e.what());
    return 2;
  }
}

extern "C" void opforge_torch_free(char* p) { std::free(p); }

extern "C" void opforge_torch_set_poison_outputs(int enabled) {
  opforge::torch::g_poison_outputs.store(enabled != 0);
}

extern "C" void opforge_torch_reload(void) {
  std::lock_guard<std::mutex> lock(opforge::torch::g_mutex);
  for (const auto& l : opforge::torch::loaded())
    if (l->lib->struct_size >= offsetof(OpforgeLibrary, reload) + sizeof(l->lib->reload) && l->lib->reload)
      l->lib->reload();
}

extern "C" int opforge_torch_precompile(const char* name, int32_t num_args, const int32_t* dtypes,
                                        const int64_t* ints, const double* floats, const char* const* strings,
                                        const char* arch, const char* cache_dir, int32_t* cache_hit,
                                        char** error) {
  *error = nullptr;
  std::lock_guard<std::mutex> lock(opforge::torch::g_mutex);
  const OpforgeOpSpec* op = nullptr;
  for (const auto& l : opforge::torch::loaded())
    for (int32_t j = 0; j < l->lib->num_ops; ++j)
      if (opforge::core::qualified_name(*l->lib->ops[j]) == name) op = l->lib->ops[j];
  if (op == nullptr || op->num_args != num_args) {
    *error = copy_string(std::string("opforge.precompile: no loaded op ") + name + " with " + std::to_string(num_args) +
                         " arguments");
    return 1;
  }
  std::vector<OpforgeValue> values(num_args);
  for (int32_t i = 0; i < num_args; ++i) {
    OpforgeValue& v = values[i];
    v.kind = op->args[i].kind;
    v.i = ints[i];
    v.f = floats[i];
    v.s = strings[i];
    v.len = strings[i] ? std::strlen(strings[i]) : 0;
  }
  // The description's rules first (what a call would check), so that no instantiation a call
  // would refuse gets compiled: tensor dtypes given, and the compile-time parameters.
  std::vector<std::string> why;
  for (int32_t i = 0; i < num_args; ++i) {
    const OpforgeArgSpec& a = op->args[i];
    if (a.kind == OPFORGE_ARG_TENSOR && dtypes[i] >= 0 && !opforge::core::dtype_allowed(a.tensor, dtypes[i]))
      why.push_back(std::string(a.name) + ": " + opforge::core::expected_dtype(a.tensor, opforge::dtype_name(dtypes[i])));
    if (a.kind != OPFORGE_ARG_TENSOR && a.param.compile_time) opforge::core::check_param(a, values[i], why);
  }
  if (!why.empty()) {
    std::string text = std::string("opforge.precompile(") + name + "): ";
    for (size_t k = 0; k < why.size(); ++k) text += (k ? "; " : "") + why[k];
    *error = copy_string(text);
    return 1;
  }
  char message[8192] = {0};
  *cache_hit = 1;
  for (int32_t k = 0; k < op->num_kernels; ++k) {
    if (!opforge::core::has_runtime_source(op->kernels[k])) continue;
    OpforgePrecompileRequest r{};
    r.struct_size = sizeof(r);
    r.dtypes = dtypes;
    r.values = values.data();
    r.arch = arch;
    r.cache_dir = cache_dir;
    r.error = message;
    r.error_capacity = sizeof(message);
    const int32_t status = op->kernels[k].precompile(&r, op->kernels[k].user);
    if (status != OPFORGE_STATUS_OK) {
      *error = copy_string(opforge::core::qualified_name(*op) + ": " + message);
      return status == OPFORGE_STATUS_INVALID_ARGUMENT ? 1 : 2;
    }
    *cache_hit = *cache_hit && r.cache_hit;
  }
  return 0;
}
