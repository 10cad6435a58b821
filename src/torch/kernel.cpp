// The boxed kernel (see kernel.h): converts the stack to the call protocol of src/core/call.h
// and back. No rule of the description is evaluated here.
#include "kernel.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/stack.h>
#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <dlfcn.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../core/call.h"
#include "../core/check.h"
#include "../core/schema.h"
#include "opforge/torch.h"
#include "types.h"

namespace opforge::torch {
namespace {

/// The current CUDA stream of device `index`, as a cudaStream_t, through AOTInductor's C shim
/// (`aoti_torch_get_current_cuda_stream` in libtorch_cuda, torch/csrc/inductor/aoti_torch/c/shim.h):
/// every torch the adapter supports exports it with this signature, while c10::Stream's
/// native_handle() exists only from torch 2.11, and c10::cuda would tie the adapter to CUDA headers.
/// Throws c10::Error if libtorch_cuda is not loaded or the shim fails.
void* current_cuda_stream(c10::DeviceIndex index) {
  using GetStream = int32_t (*)(int32_t, void**);
  static const GetStream get_stream = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    void* sym = lib != nullptr ? dlsym(lib, "aoti_torch_get_current_cuda_stream") : nullptr;
    TORCH_CHECK(sym != nullptr, "opforge: this torch has no aoti_torch_get_current_cuda_stream in libtorch_cuda.so");
    return reinterpret_cast<GetStream>(sym);
  }();
  void* stream = nullptr;
  TORCH_CHECK(get_stream(index, &stream) == 0, "opforge: aoti_torch_get_current_cuda_stream failed on cuda:", index);
  return stream;
}

/// The allocator torch registered for CUDA memory (its caching allocator, the one ATen's own
/// CUDA kernels allocate their outputs from, on the current device), or null where torch has no
/// CUDA. Asked once: torch registers it when libtorch_cuda loads, before any CUDA tensor exists.
c10::Allocator* cuda_allocator() {
  static c10::Allocator* const allocator = c10::GetAllocator(c10::DeviceType::CUDA);
  return allocator;
}

/// Containers built on every call: held inline up to kInline elements (no allocation for
/// the usual op), on the heap past that.
constexpr unsigned kInline = 8;
template <class T>
using PerCall = c10::SmallVector<T, kInline>;

/// Arguments of one call converted from the stack, with storage for strings and lists.
struct CallArgs {
  PerCall<at::Tensor> tensors;
  std::vector<std::string> strings;
  std::vector<std::vector<int64_t>> int_lists;
  std::vector<std::vector<double>> float_lists;
  PerCall<OpforgeValue> values;
  std::vector<std::optional<c10::SymInt>> symbolic;  // a size parameter's value while tracing
  std::vector<at::Tensor> outs;                      // an out= call's out tensors
  std::vector<c10::SymInt> data_dependent;           // Mode::kFake: one size per such output
};

/// Scratch memory for a kernel: tensors from torch's allocator on the kernel's device, kept
/// alive until the kernel call returns (stream-ordered reuse makes that safe on CUDA), aligned
/// to 256 bytes as opforge::Context::allocate promises (torch's CPU allocator gives 64).
struct Scratch {
  static constexpr int64_t kAlignment = 256;
  at::TensorOptions options;
  std::vector<at::Tensor> buffers;
  static void* allocate(void* state, size_t bytes) {
    auto* s = static_cast<Scratch*>(state);
    try {
      s->buffers.push_back(at::empty({static_cast<int64_t>(bytes) + kAlignment - 1}, s->options));
      const auto p = reinterpret_cast<uintptr_t>(s->buffers.back().data_ptr());
      return reinterpret_cast<void*>((p + kAlignment - 1) / kAlignment * kAlignment);
    } catch (...) {
      return nullptr;
    }
  }
};

/// The first error an op raised on this thread since take_call_error last asked.
thread_local std::string t_call_error;

void record_call_error(const char* message) {
  if (t_call_error.empty()) t_call_error = message;
}

class OpKernel final : public c10::OperatorKernel {
 public:
  OpKernel(const OpforgeOpSpec& op, Mode mode, const OpforgeKernel* kernel, bool out)
      : op_(op), mode_(mode), kernel_(kernel), out_(out) {
    for (int32_t i = 0; i < op.num_args; ++i) {
      has_strings_ |= op.args[i].kind == OPFORGE_ARG_STRING;
      has_lists_ |= op.args[i].kind == OPFORGE_ARG_INT_LIST || op.args[i].kind == OPFORGE_ARG_FLOAT_LIST;
    }
  }

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, ::torch::jit::Stack* stack) { run(stack); }

  /// The kernel on the arguments at the top of `stack`, replaced by the outputs.
  void run(::torch::jit::Stack* stack) {
    try {
      run_unguarded(stack);
    } catch (const c10::Error& e) {
      record_call_error(e.what_without_backtrace());
      throw;
    } catch (const std::exception& e) {
      record_call_error(e.what());
      throw;
    }
  }

 private:
  void run_unguarded(::torch::jit::Stack* stack) {
    const bool fake = mode_ == Mode::kFake;
    const int32_t n = op_.num_args + (out_ ? op_.num_outputs : 0) + (fake ? 1 : 0);
    const auto ivalues = ::torch::jit::last(*stack, n);
    CallArgs call = with_torch_errors([&] { return unpack(fake ? ivalues.slice(0, n - 1) : ivalues); });
    if (fake) call.data_dependent = ivalues.back().toSymIntVector();
    const bool symbolic = tracing();
    PerCall<at::Tensor> outputs = symbolic ? run<c10::SymInt>(call) : run<int64_t>(call);
    ::torch::jit::drop(*stack, n);
    for (auto& t : outputs) ::torch::jit::push(*stack, std::move(t));
  }

  CallArgs unpack(c10::ArrayRef<c10::IValue> ivalues) const {
    const int32_t n = op_.num_args;
    CallArgs c;  // storage only for the kinds the op has: these vectors are built on every call
    c.tensors.resize(n);
    c.values.resize(n);
    if (has_strings_) c.strings.resize(n);
    if (has_lists_) {
      c.int_lists.resize(n);
      c.float_lists.resize(n);
    }
    if (tracing()) c.symbolic.resize(n);
    for (size_t k = n; k < ivalues.size(); ++k)
      c.outs.push_back(ivalues[k].isNone() ? at::Tensor() : ivalues[k].toTensor());
    for (int32_t i = 0; i < n; ++i) {
      const c10::IValue& iv = ivalues[i];
      OpforgeValue& v = c.values[i];
      v.kind = op_.args[i].kind;
      if (iv.isNone() && v.kind != OPFORGE_ARG_TENSOR) {  // a default the framework left out
        v = core::default_value(op_, i);
        continue;
      }
      switch (op_.args[i].kind) {
        case OPFORGE_ARG_TENSOR:  // None (an optional input left out) stays an undefined tensor
          if (!iv.isNone()) c.tensors[i] = iv.toTensor();
          break;
        case OPFORGE_ARG_INT:
          if (!iv.isSymInt()) {
            v.i = iv.toInt();
          } else if (auto known = iv.toSymInt().maybe_as_int()) {
            v.i = *known;
          } else if (tracing()) {  // a size parameter while tracing: symbolic
            c.symbolic[i] = iv.toSymInt();
          } else {  // a kernel needs the value
            v.i = iv.toSymInt().guard_int(__FILE__, __LINE__);
          }
          break;
        case OPFORGE_ARG_FLOAT:
          v.f = iv.toDouble();
          break;
        case OPFORGE_ARG_BOOL:
          v.i = iv.toBool();
          break;
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

  /// The ArgInfo of a tensor (undefined: `defined` false) for the core's checks; its sizes view
  /// t's, so it must not outlive t.
  template <class Int>
  static core::ArgInfo<Int> info_of(const at::Tensor& t) {
    core::ArgInfo<Int> info;
    if (!t.defined()) {
      info.defined = false;
      return info;
    }
    info.dtype = to_opforge(t.scalar_type());
    info.dtype_label = torch_dtype_name(t.scalar_type());
    info.device_type = device_type_name(t.device().type());
    info.device_index = t.device().has_index() ? t.device().index() : -1;
    if constexpr (std::is_same_v<Int, c10::SymInt>) {  // views of the tensor's own sizes
      const c10::SymIntArrayRef s = t.sym_sizes();
      info.sizes = core::Span<const c10::SymInt>(s.data(), s.size());
    } else {
      const c10::IntArrayRef s = t.sizes();
      info.sizes = core::Span<const int64_t>(s.data(), s.size());
    }
    return info;
  }

  template <class Int>
  PerCall<at::Tensor> run(CallArgs& call) const {
    const int32_t n = op_.num_args;
    PerCall<core::ArgInfo<Int>> info(n);
    int32_t device_arg = -1;
    for (int32_t i = 0; i < n; ++i) {
      if (op_.args[i].kind == OPFORGE_ARG_TENSOR) {  // check_call accepts None for an optional input only
        info[i] = info_of<Int>(call.tensors[i]);
        if (device_arg < 0 && call.tensors[i].defined()) device_arg = i;
      }
      info[i].value = call.values[i];
      if constexpr (std::is_same_v<Int, c10::SymInt>) info[i].symbolic = call.symbolic[i];
    }
    const at::Device device = device_arg >= 0 ? call.tensors[device_arg].device() : at::Device(at::kCPU);
    if constexpr (std::is_same_v<Int, int64_t>) {
      return launch(call, info, device);
    } else {                                              // tracing: the checks, and the outputs' shapes and dtypes
      PerCall<core::OutputInfo<Int, PerCall<Int>>> outs;  // sizes inline too
      std::string problems;
      if (out_) {
        PerCall<core::ArgInfo<Int>> given;
        for (const at::Tensor& t : call.outs) given.push_back(info_of<Int>(t));
        problems = core::check_out_call<Int>(op_, info, given, outs);
      } else {
        problems = core::check_call<Int>(op_, info, outs);
      }
      TORCH_CHECK_VALUE(problems.empty(), problems);
      size_t j = 0;  // the fake companion: the unbacked sizes it is given
      for (int32_t k = 0; k < op_.num_outputs && mode_ == Mode::kFake; ++k)
        if (op_.outputs[k].size_from >= 0 && outs[k].defined && j < call.data_dependent.size())
          outs[k].sizes[0] = call.data_dependent[j++];
      PerCall<at::Tensor> outputs;
      outputs.reserve(outs.size());
      for (size_t k = 0; k < outs.size(); ++k) {
        if (out_) {  // not resized while tracing: a graph input that changes shape breaks the trace
          refuse_resize(call.outs[k], k, outs[k].sizes);
          outputs.push_back(call.outs[k]);
        } else if (!outs[k].defined) {  // exists only with an optional input the call left out: None
          outputs.emplace_back();
        } else {
          outputs.push_back(
              at::empty_symint(outs[k].sizes, at::TensorOptions().dtype(to_torch(outs[k].dtype)).device(device)));
        }
      }
      return outputs;
    }
  }

  /// While tracing (torch.compile, torch.export), an out= tensor must already have its output's
  /// shape: resizing a graph input under tracing breaks the trace (torch's own out= ops
  /// graph-break there, "out variants with resizing on graph inputs"), so a call that would
  /// resize is refused, naming the op and the tensor. Eager calls resize by torch's rules.
  void refuse_resize(const at::Tensor& out, size_t k, const PerCall<c10::SymInt>& want) const {
    const c10::SymIntArrayRef have = out.sym_sizes();
    bool same = have.size() == want.size();
    for (size_t d = 0; same && d < want.size(); ++d) same = have[d].sym_eq(want[d]).guard_bool(__FILE__, __LINE__);
    if (same) return;
    const std::string line =
        std::string(op_.outputs[k].name) + ": expected shape " +
        core::sizes_string<c10::SymInt>(core::Span<const c10::SymInt>(want.data(), want.size())) +
        " (an out= tensor is resized in eager calls only, not under torch.compile or torch.export), got " +
        core::sizes_string<c10::SymInt>(core::Span<const c10::SymInt>(have.data(), have.size()));
    TORCH_CHECK_VALUE(false, core::invalid_arguments_message(op_, {line}, /*out_overload=*/true));
  }

  /// The data-dependent first dim of output `k`: the value the kernel wrote into its size output
  /// (read from the device: a synchronisation, as torch.nonzero's). Throws c10::Error, naming the
  /// op and both outputs, for a value outside [0, bound].
  int64_t written_size(const PerCall<at::Tensor>& outputs, int32_t k, int64_t bound) const {
    const int32_t from = op_.outputs[k].size_from;
    const int64_t size = outputs[from].item<int64_t>();
    TORCH_CHECK(size >= 0 && size <= bound, core::qualified_name(op_), ": the kernel wrote ", size, " into '",
                op_.outputs[from].name, "', the size of '", op_.outputs[k].name, "', which must be in [0, ",
                core::expr_string(op_, op_.outputs[k].dims[0]), " = ", bound, "]");
    return size;
  }

  /// The hooks of the call protocol (core::CallHooks) for one call of a concrete kernel.
  class Hooks final : public core::CallHooks {
   public:
    Hooks(const OpKernel& k, CallArgs& call, const at::Device& device)
        : k_(k), call_(call), device_(device), scratch_{at::TensorOptions().dtype(at::kByte).device(device), {}} {
      outputs.resize(k.op_.num_outputs);
      temporaries.resize(k.op_.num_outputs);
      if (k.mode_ == Mode::kCuda) guard_.reset_device(device);  // outputs are allocated on the call's device
    }

    OpforgeTensor output(int32_t k, int32_t dtype, core::Span<const int64_t> sizes) override {
      const c10::IntArrayRef shape(sizes.data(), sizes.size());
      if (k_.out_) {  // torch's rules: a tensor without elements is resized silently, another with a warning
        at::native::resize_output(call_.outs[k], shape);
        outputs[k] = call_.outs[k];
      } else if (k_.mode_ == Mode::kCpu) {  // as ATen's own CPU kernels allocate: not through the dispatcher
        outputs[k] = at::detail::empty_cpu(shape, to_torch(dtype), /*pin_memory=*/false, std::nullopt);
      } else if (c10::Allocator* cuda = cuda_allocator(); cuda != nullptr) {  // as ATen's CUDA kernels: under the guard
        outputs[k] = at::detail::empty_generic(shape, cuda, c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                               to_torch(dtype), std::nullopt);
      } else {
        outputs[k] = at::empty(shape, at::TensorOptions().dtype(to_torch(dtype)).device(device_));
      }
      return view(outputs[k]);
    }
    OpforgeTensor temporary(int32_t k) override {
      temporaries[k] = at::empty(outputs[k].sizes(), outputs[k].options());
      return view(temporaries[k]);
    }
    void copy_back(int32_t k) override { outputs[k].copy_(temporaries[k]); }
    OpforgeTensor dense_copy(int32_t arg) override {
      at::Tensor& t = call_.tensors[arg];
      t = t.contiguous();  // a fresh allocation: 16-byte aligned, unless it is a misaligned view
      if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) t = t.clone(at::MemoryFormat::Contiguous);
      return view(t);
    }
    void fill(const OpforgeTensor& t, uint8_t byte) override {
      int64_t bytes = static_cast<int64_t>(dtype_size(t.dtype));
      for (int32_t d = 0; d < t.ndim; ++d) bytes *= t.sizes[d];
      at::from_blob(t.data, {bytes}, at::TensorOptions().dtype(at::kByte).device(device_)).fill_(byte);
    }
    OpforgeContext context() override {
      OpforgeContext ctx{};
      ctx.struct_size = sizeof(OpforgeContext);
      ctx.device_type = k_.mode_ == Mode::kCuda ? OPFORGE_DEVICE_CUDA : OPFORGE_DEVICE_CPU;
      ctx.device_index = device_.has_index() ? device_.index() : -1;
      if (k_.mode_ == Mode::kCuda) ctx.stream = current_cuda_stream(device_.index());  // the guard is set
      ctx.allocate = &Scratch::allocate;
      ctx.allocator_state = &scratch_;
      return ctx;
    }

    PerCall<at::Tensor> outputs;      // what the call returns
    PerCall<at::Tensor> temporaries;  // out= calls: what the kernel writes in place of an out tensor

   private:
    const OpKernel& k_;
    CallArgs& call_;
    const at::Device& device_;
    Scratch scratch_;
    c10::OptionalDeviceGuard guard_;
  };

  /// Runs the call through the call protocol (core::run_call) and returns its outputs, narrowed
  /// to their data-dependent sizes.
  PerCall<at::Tensor> launch(CallArgs& call, const PerCall<core::ArgInfo<int64_t>>& info,
                             const at::Device& device) const {
    const int32_t n = op_.num_args;
    const int32_t device_type = mode_ == Mode::kCuda ? OPFORGE_DEVICE_CUDA : OPFORGE_DEVICE_CPU;
    const int32_t device_index = device.has_index() ? device.index() : -1;
    PerCall<OpforgeArg> args(n);
    for (int32_t i = 0; i < n; ++i) {
      args[i].value = call.values[i];
      if (op_.args[i].kind != OPFORGE_ARG_TENSOR) continue;
      const at::Tensor& t = call.tensors[i];
      args[i].tensor = t.defined() ? view(t) : core::absent_tensor(device_type, device_index);
    }
    PerCall<core::ArgInfo<int64_t>> given;
    for (const at::Tensor& t : call.outs) given.push_back(info_of<int64_t>(t));
    const core::Call c{op_, kernel_, info, args, given, out_, device_type, device_index};
    Hooks hooks(*this, call, device);
    PerCall<OpforgeTensor> views(op_.num_outputs);
    const bool launched = with_torch_errors([&] { return core::run_call(c, hooks, views); });
    PerCall<at::Tensor>& outputs = hooks.outputs;
    for (int32_t k = 0; launched && k < op_.num_outputs; ++k)
      if (op_.outputs[k].size_from >= 0 && outputs[k].defined())
        outputs[k] = outputs[k].narrow(0, 0, written_size(outputs, k, outputs[k].size(0)));
    return std::move(outputs);
  }

  /// The Meta and Fake kernels: they run the rules over c10::SymInt and launch nothing.
  bool tracing() const { return mode_ == Mode::kMeta || mode_ == Mode::kFake; }

  const OpforgeOpSpec& op_;
  Mode mode_;
  const OpforgeKernel* kernel_;
  bool out_;  // the op's out= overload: the outputs are the caller's tensors, after the arguments
  bool has_strings_ = false, has_lists_ = false;  // argument kinds that need storage in CallArgs
};

}  // namespace

const OpforgeKernel* kernel_for(const OpforgeOpSpec& op, Mode mode) {
  if (mode != Mode::kCpu && mode != Mode::kCuda) return nullptr;
  return core::device_kernel(op, mode == Mode::kCpu ? OPFORGE_DEVICE_CPU : OPFORGE_DEVICE_CUDA);
}

::torch::CppFunction make_kernel(const OpforgeOpSpec& op, Mode mode, const OpforgeKernel* kernel, bool out) {
  return ::torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OpKernel>(op, mode, kernel, out));
}

std::string take_call_error() { return std::exchange(t_call_error, std::string()); }

std::function<void(::torch::jit::Stack*)> make_boxed_run(const OpforgeOpSpec& op, Mode mode,
                                                         const OpforgeKernel* kernel) {
  auto k = std::make_shared<OpKernel>(op, mode, kernel, /*out=*/false);
  return [k](::torch::jit::Stack* stack) { k->run(stack); };
}

}  // namespace opforge::torch
