// The JAX adapter: the XLA FFI handlers through which `jax.ffi.ffi_call` runs every op of every
// loaded op library, one for the host and one for CUDA. python/opforge/jax registers them for
// each op as the target "<ns>.<op>". A handler translates XLA's call frame into the call
// protocol of src/core/call.h and evaluates no rule of the description itself (Note [One core
// for every adapter] in src/core/library.h).
//
// Note [The JAX call frame]
// -------------------------
// opforge.jax builds each call of `ns::op` as
//   operands:   the tensor inputs the call passes, in schema order (an optional input left out
//               is not passed);
//   results:    the outputs that exist (one tied to a left-out optional input does not), then
//               the value of each mutated input after the op, in argument order, each aliased
//               to its operand (input_output_aliases), so the kernel writes it in place;
//   attributes: "opforge_op" (the qualified name), "opforge_absent" (bit i set: tensor
//               argument i is left out) and each parameter by its name (int64, float64, bool,
//               string, or a dense array of int64 or float64; one left out takes its default).
// XLA's buffers are dense and row-major. The handler checks the call again (the checks Python
// ran at trace time, by the same core function), so a frame built by hand cannot reach a kernel
// with arguments it does not take.
#include <dlfcn.h>
#include <xla/ffi/api/ffi.h>

#include <algorithm>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/call.h"
#include "../core/check.h"
#include "../core/library.h"
#include "../core/schema.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"

namespace ffi = xla::ffi;

namespace opforge::jax {
namespace {

/// The OpforgeDtype of an XLA element type and the name messages give it (jax.numpy's).
struct DtypeOf {
  int32_t code;  // -1: a dtype opforge does not know
  const char* label;
};

DtypeOf dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32:
      return {OPFORGE_DTYPE_FLOAT32, "float32"};
    case ffi::DataType::F64:
      return {OPFORGE_DTYPE_FLOAT64, "float64"};
    case ffi::DataType::F16:
      return {OPFORGE_DTYPE_FLOAT16, "float16"};
    case ffi::DataType::BF16:
      return {OPFORGE_DTYPE_BFLOAT16, "bfloat16"};
    case ffi::DataType::S8:
      return {OPFORGE_DTYPE_INT8, "int8"};
    case ffi::DataType::S16:
      return {OPFORGE_DTYPE_INT16, "int16"};
    case ffi::DataType::S32:
      return {OPFORGE_DTYPE_INT32, "int32"};
    case ffi::DataType::S64:
      return {OPFORGE_DTYPE_INT64, "int64"};
    case ffi::DataType::U8:
      return {OPFORGE_DTYPE_UINT8, "uint8"};
    case ffi::DataType::PRED:
      return {OPFORGE_DTYPE_BOOL, "bool"};
    case ffi::DataType::F8E4M3FN:
      return {OPFORGE_DTYPE_FLOAT8_E4M3FN, "float8_e4m3fn"};
    case ffi::DataType::F8E5M2:
      return {OPFORGE_DTYPE_FLOAT8_E5M2, "float8_e5m2"};
    case ffi::DataType::F8E8M0FNU:
      return {OPFORGE_DTYPE_FLOAT8_E8M0FNU, "float8_e8m0fnu"};
    case ffi::DataType::U16:
      return {-1, "uint16"};
    case ffi::DataType::U32:
      return {-1, "uint32"};
    case ffi::DataType::U64:
      return {-1, "uint64"};
    case ffi::DataType::C64:
      return {-1, "complex64"};
    case ffi::DataType::C128:
      return {-1, "complex128"};
    default:
      return {-1, "unknown"};
  }
}

/// Scratch memory for a kernel (OpforgeContext::allocate), aligned to kScratchAlignment bytes: on
/// CUDA from XLA's allocator, ordered on the call's stream and freed when the handler returns; on
/// the host, heap memory freed likewise. XLA's FFI allocator takes alignments up to 16 bytes only
/// (XLA_FFI_DeviceMemory_Allocate), so a larger one is made by allocating more and rounding up.
struct Scratch {
  static constexpr size_t kScratchAlignment = 256;  // what cuBLAS asks of a workspace
  ffi::ScratchAllocator* device = nullptr;          // null on the host
  std::vector<std::unique_ptr<void, decltype(&std::free)>> host;

  static void* allocate(void* state, size_t bytes) {
    auto* s = static_cast<Scratch*>(state);
    constexpr size_t a = kScratchAlignment;
    if (s->device != nullptr) {
      const std::optional<void*> p = s->device->Allocate(bytes + a - 1, 16);
      if (!p.has_value() || *p == nullptr) return nullptr;
      return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(*p) + a - 1) / a * a);
    }
    void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
    if (p != nullptr) s->host.emplace_back(p, &std::free);
    return p;
  }
};

/// One buffer's view (dense, row-major), with storage for its sizes and strides.
struct Views {
  std::deque<std::vector<int64_t>> sizes, strides;

  OpforgeTensor of(const ffi::AnyBuffer& b, int32_t device_type, int32_t device_index) {
    const auto dims = b.dimensions();
    std::vector<int64_t>& s = sizes.emplace_back(dims.begin(), dims.end());
    std::vector<int64_t>& st = strides.emplace_back(s.size());
    int64_t step = 1;
    for (size_t d = s.size(); d-- > 0;) st[d] = step, step *= s[d];
    return {b.untyped_data(), dtype_of(b.element_type()).code, device_type,
            device_index,     static_cast<int32_t>(s.size()),  s.data(),
            st.data()};
  }
};

/// The value of parameter `i` from the attributes; throws InvalidArgument for an attribute of
/// another type (a frame built by hand), and takes the default for one left out.
OpforgeValue param_value(const OpforgeOpSpec& op, int32_t i, const ffi::Dictionary& attrs,
                         std::deque<std::string>& strings) {
  const OpforgeArgSpec& a = op.args[i];
  if (!attrs.contains(a.name)) return core::default_value(op, i);
  OpforgeValue v{};
  v.kind = a.kind;
  const auto get = [&](auto type) {  // the attribute as `type`'s type, or the call's error
    auto x = attrs.get<decltype(type)>(a.name);
    if (!x.has_value())
      throw InvalidArgument(
          core::invalid_arguments_message(op, {std::string(a.name) + ": expected a value of type " +
                                               core::schema_type(a.kind) + ", got an attribute of another type"}));
    return *x;
  };
  switch (a.kind) {
    case OPFORGE_ARG_INT:
      v.i = get(int64_t{});
      break;
    case OPFORGE_ARG_FLOAT:
      v.f = get(double{});
      break;
    case OPFORGE_ARG_BOOL:
      v.i = get(bool{});
      break;
    case OPFORGE_ARG_STRING: {
      const std::string& text = strings.emplace_back(get(std::string_view{}));
      v.s = text.c_str();
      v.len = text.size();
      break;
    }
    case OPFORGE_ARG_INT_LIST: {
      const auto list = get(ffi::Span<const int64_t>{nullptr, 0});
      v.ints = list.begin();
      v.len = list.size();
      break;
    }
    case OPFORGE_ARG_FLOAT_LIST: {
      const auto list = get(ffi::Span<const double>{nullptr, 0});
      v.floats = list.begin();
      v.len = list.size();
      break;
    }
    default:
      throw InternalError("opforge.jax: argument " + std::string(a.name) + " is not a parameter");
  }
  return v;
}

/// cuMemsetD8Async from the CUDA driver, looked up on first use (the adapter links no CUDA
/// library); null where the process has no driver.
using MemsetD8Async = int (*)(uintptr_t, unsigned char, size_t, void*);
MemsetD8Async memset_d8_async() {
  static const MemsetD8Async fn = [] {
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h == nullptr) h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return h != nullptr ? reinterpret_cast<MemsetD8Async>(::dlsym(h, "cuMemsetD8Async")) : nullptr;
  }();
  return fn;
}

/// The call protocol's hooks (core::CallHooks) for one call: XLA has allocated the results
/// already, so an output is the next result buffer, checked against the rule's dtype and shape.
class Hooks final : public core::CallHooks {
 public:
  Hooks(const OpforgeOpSpec& op, int32_t device_type, int32_t device_index, void* stream,
        ffi::ScratchAllocator* scratch, const ffi::RemainingRets& results, Views& views)
      : op_(op),
        device_type_(device_type),
        device_index_(device_index),
        stream_(stream),
        results_(results),
        views_(views),
        memory_{scratch, {}} {}

  OpforgeTensor output(int32_t k, int32_t dtype, core::Span<const int64_t> sizes) override {
    auto r = results_.get<ffi::AnyBuffer>(next_++);
    if (!r.has_value())
      throw InternalError("opforge.jax: " + core::qualified_name(op_) + ": no result buffer for " +
                          op_.outputs[k].name);
    const ffi::AnyBuffer b(**r);
    const auto dims = b.dimensions();
    if (dtype_of(b.element_type()).code != dtype || !std::equal(dims.begin(), dims.end(), sizes.begin(), sizes.end()))
      throw InternalError("opforge.jax: " + core::qualified_name(op_) + ": the result buffer of " +
                          op_.outputs[k].name + " is not the " + dtype_name(dtype) + " " +
                          core::sizes_string<int64_t>(sizes) + " its rule gives");
    return views_.of(b, device_type_, device_index_);
  }
  OpforgeTensor temporary(int32_t) override { throw InternalError("opforge.jax: an out= call reached JAX"); }
  void copy_back(int32_t) override { throw InternalError("opforge.jax: an out= call reached JAX"); }
  OpforgeTensor dense_copy(int32_t arg) override {
    // XLA's buffers are dense and at least 16-byte aligned, so every input reaches a kernel as it is.
    throw InternalError("opforge.jax: " + core::qualified_name(op_) + ": XLA passed " + op_.args[arg].name +
                        " at an address that is not 16-byte aligned");
  }
  void fill(const OpforgeTensor& t, uint8_t byte) override {
    size_t bytes = dtype_size(t.dtype);
    for (int32_t d = 0; d < t.ndim; ++d) bytes *= static_cast<size_t>(t.sizes[d]);
    if (device_type_ == OPFORGE_DEVICE_CPU) {
      std::memset(t.data, byte, bytes);
      return;
    }
    const MemsetD8Async memset = memset_d8_async();
    if (memset == nullptr || memset(reinterpret_cast<uintptr_t>(t.data), byte, bytes, stream_) != 0)
      throw InternalError("opforge.jax: " + core::qualified_name(op_) + ": cuMemsetD8Async failed poisoning an output");
  }
  OpforgeContext context() override {
    OpforgeContext ctx{};
    ctx.struct_size = sizeof(OpforgeContext);
    ctx.device_type = device_type_;
    ctx.device_index = device_index_;
    ctx.stream = stream_;
    ctx.allocate = &Scratch::allocate;
    ctx.allocator_state = &memory_;
    return ctx;
  }

 private:
  const OpforgeOpSpec& op_;
  int32_t device_type_, device_index_;
  void* stream_;
  const ffi::RemainingRets& results_;
  Views& views_;
  Scratch memory_;
  size_t next_ = 0;  // the next result buffer: outputs come first, in order
};

/// Runs one call (Note [The JAX call frame]) on the host (`stream` null) or on CUDA.
void run(int32_t device_type, int32_t device_index, void* stream, ffi::ScratchAllocator* scratch,
         const ffi::RemainingArgs& operands, const ffi::RemainingRets& results, const ffi::Dictionary& attrs) {
  const auto name = attrs.get<std::string_view>("opforge_op");
  if (!name.has_value()) throw InternalError("opforge.jax: the call has no opforge_op attribute");
  const OpforgeOpSpec* found = core::find_loaded_op(std::string(*name));
  if (found == nullptr)
    throw InternalError("opforge.jax: " + std::string(*name) +
                        " is not loaded in this process; load its op library first (opforge.jax.load_library)");
  const OpforgeOpSpec& op = *found;
  const auto absent_bits = attrs.get<int64_t>("opforge_absent");
  const int64_t absent = absent_bits.has_value() ? *absent_bits : 0;
  const char* device_name = core::device_type_name(device_type);

  const int32_t n = op.num_args;
  std::vector<core::ArgInfo<int64_t>> info(n);
  std::vector<OpforgeArg> args(n);
  std::vector<ffi::AnyBuffer> inputs;  // per tensor argument passed, in order
  std::deque<std::string> strings;
  Views views;
  size_t next = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR) {
      args[i].value = info[i].value = param_value(op, i, attrs, strings);
      continue;
    }
    args[i].value.kind = OPFORGE_ARG_TENSOR;
    info[i].value.kind = OPFORGE_ARG_TENSOR;
    if (i < 64 && (absent >> i & 1)) {
      info[i].defined = false;
      args[i].tensor = core::absent_tensor(device_type, device_index);
      continue;
    }
    const auto buffer = operands.get<ffi::AnyBuffer>(next++);
    if (!buffer.has_value())
      throw InternalError("opforge.jax: " + core::qualified_name(op) + ": no operand for " + op.args[i].name);
    args[i].tensor = views.of(*buffer, device_type, device_index);
    const DtypeOf dtype = dtype_of(buffer->element_type());
    info[i].dtype = dtype.code;
    info[i].dtype_label = dtype.label;
    info[i].device_type = device_name;
    info[i].device_index = device_type == OPFORGE_DEVICE_CUDA ? device_index : -1;
    info[i].sizes = core::Span<const int64_t>(args[i].tensor.sizes, static_cast<size_t>(args[i].tensor.ndim));
  }
  if (next != operands.size())
    throw InternalError("opforge.jax: " + core::qualified_name(op) + ": " + std::to_string(operands.size()) +
                        " operands for " + std::to_string(next) + " tensor arguments");

  // Results: the outputs that exist, then the mutated inputs, which must be their operands' memory.
  int32_t num_defined = 0;
  for (int32_t k = 0; k < op.num_outputs; ++k)
    num_defined += op.outputs[k].present_with < 0 || info[op.outputs[k].present_with].defined;
  size_t result = static_cast<size_t>(num_defined);
  for (int32_t i = 0; i < n; ++i) {
    if (!core::is_mutated(op.args[i]) || !info[i].defined) continue;
    auto r = results.get<ffi::AnyBuffer>(result++);
    if (!r.has_value() || ffi::AnyBuffer(**r).untyped_data() != args[i].tensor.data)
      throw InternalError("opforge.jax: " + core::qualified_name(op) + ": the result of " + op.args[i].name +
                          "_out is not aliased to its operand (input_output_aliases)");
  }
  if (result != results.size())
    throw InternalError("opforge.jax: " + core::qualified_name(op) + ": " + std::to_string(results.size()) +
                        " results for " + std::to_string(result) + " outputs and written inputs");

  Hooks hooks(op, device_type, device_index, stream, scratch, results, views);
  const core::Call call{op,          core::device_kernel(op, device_type),
                        info,        args,
                        {},          false,
                        device_type, device_type == OPFORGE_DEVICE_CUDA ? device_index : -1};
  std::vector<OpforgeTensor> out_views(static_cast<size_t>(op.num_outputs));
  core::run_call(call, hooks, out_views);
}

/// run(), with opforge's errors as XLA FFI errors: InvalidArgument for the caller's, Internal for any other.
template <class Body>
ffi::Error guarded(Body&& body) noexcept {
  try {
    body();
    return ffi::Error::Success();
  } catch (const InvalidArgument& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  } catch (...) {
    return ffi::Error::Internal("opforge.jax: unknown C++ exception");
  }
}

ffi::Error host_call(ffi::RemainingArgs operands, ffi::RemainingRets results, ffi::Dictionary attrs) {
  return guarded([&] { run(OPFORGE_DEVICE_CPU, -1, nullptr, nullptr, operands, results, attrs); });
}

ffi::Error cuda_call(void* stream, int32_t device, ffi::ScratchAllocator scratch, ffi::RemainingArgs operands,
                     ffi::RemainingRets results, ffi::Dictionary attrs) {
  return guarded([&] { run(OPFORGE_DEVICE_CUDA, device, stream, &scratch, operands, results, attrs); });
}

}  // namespace
}  // namespace opforge::jax

// The handlers, looked up by name (opforge/jax/_ffi.py) and registered with
// jax.ffi.register_ffi_target for the platforms "cpu" and "CUDA".
XLA_FFI_DEFINE_HANDLER_SYMBOL(opforge_jax_cpu, opforge::jax::host_call,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(opforge_jax_cuda, opforge::jax::cuda_call,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());
