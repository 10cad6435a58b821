// The kernel of one ONNX node of an opforge op (kernel.h): ONNX Runtime's kernel context
// translated into the core's call protocol.
#include "kernel.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "../core/call.h"
#include "../core/check.h"
#include "../core/records.h"
#include "../core/schema.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "types.h"

namespace opforge::ort {
namespace {

/// A node's attributes from ONNX Runtime's kernel info (each reader: false where the node has no
/// attribute of that name and type).
class KernelInfoSource final : public AttributeSource {
 public:
  KernelInfoSource(Api api, const KernelInfo* info) : api_(api), info_(info) {}

  bool int64(const char* name, int64_t& out) override {
    return ok(api_.call<Status*>(Slot::KernelInfoGetAttribute_int64, info_, name, &out));
  }
  bool float32(const char* name, float& out) override {
    return ok(api_.call<Status*>(Slot::KernelInfoGetAttribute_float, info_, name, &out));
  }
  bool string(const char* name, std::string& out) override {
    size_t size = 0;
    if (!ok(api_.call<Status*>(Slot::KernelInfoGetAttribute_string, info_, name, static_cast<char*>(nullptr), &size)))
      return false;
    std::vector<char> text(size + 1, '\0');
    if (!ok(api_.call<Status*>(Slot::KernelInfoGetAttribute_string, info_, name, text.data(), &size))) return false;
    out.assign(text.data());
    return true;
  }
  bool ints(const char* name, std::vector<int64_t>& out) override {
    return array(Slot::KernelInfoGetAttributeArray_int64, name, out);
  }
  bool floats(const char* name, std::vector<float>& out) override {
    return array(Slot::KernelInfoGetAttributeArray_float, name, out);
  }

 private:
  bool ok(Status* s) const {
    if (s == nullptr) return true;
    api_.call<void>(Slot::ReleaseStatus, s);
    return false;
  }
  template <class T>
  bool array(Slot slot, const char* name, std::vector<T>& out) {
    size_t size = 0;
    if (!ok(api_.call<Status*>(slot, info_, name, static_cast<T*>(nullptr), &size))) return false;
    out.resize(size);
    return size == 0 || ok(api_.call<Status*>(slot, info_, name, out.data(), &size));
  }

  Api api_;
  const KernelInfo* info_;
};

/// The CUDA driver's asynchronous fill and copy, looked up on first use (the adapter links no
/// CUDA library); null where the process has no driver.
struct Driver {
  int (*memset_d8_async)(uintptr_t, unsigned char, size_t, void*) = nullptr;
  int (*memcpy_async)(uintptr_t, uintptr_t, size_t, void*) = nullptr;

  static const Driver& get() {
    static const Driver d = [] {
      Driver r;
      void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      if (h == nullptr) h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) {
        r.memset_d8_async = reinterpret_cast<decltype(r.memset_d8_async)>(::dlsym(h, "cuMemsetD8Async"));
        r.memcpy_async = reinterpret_cast<decltype(r.memcpy_async)>(::dlsym(h, "cuMemcpyAsync"));
      }
      return r;
    }();
    return d;
  }
};

size_t byte_size(const OpforgeTensor& t) {
  size_t bytes = dtype_size(t.dtype);
  for (int32_t d = 0; d < t.ndim; ++d) bytes *= static_cast<size_t>(t.sizes[d]);
  return bytes;
}

/// Views of ONNX Runtime's tensors (dense, row-major), with storage for their sizes and strides.
struct Views {
  std::deque<std::vector<int64_t>> sizes, strides;

  OpforgeTensor of(void* data, int32_t dtype, std::vector<int64_t> dims, int32_t device_type, int32_t device_index) {
    std::vector<int64_t>& s = sizes.emplace_back(std::move(dims));
    std::vector<int64_t>& st = strides.emplace_back(s.size());
    int64_t step = 1;
    for (size_t d = s.size(); d-- > 0;) st[d] = step, step *= s[d];
    return {data, dtype, device_type, device_index, static_cast<int32_t>(s.size()), s.data(), st.data()};
  }
};

/// An OrtValue's element type and dims.
struct TypeAndShape {
  int32_t element_type = kUndefined;
  std::vector<int64_t> dims;
};

TypeAndShape type_and_shape(Api api, const Value* value) {
  TensorTypeAndShapeInfo* info = nullptr;
  check(api, api.call<Status*>(Slot::GetTensorTypeAndShape, value, &info), "GetTensorTypeAndShape");
  TypeAndShape r;
  ElementType t = kUndefined;
  size_t n = 0;
  Status* s = api.call<Status*>(Slot::GetTensorElementType, static_cast<const TensorTypeAndShapeInfo*>(info), &t);
  if (s == nullptr)
    s = api.call<Status*>(Slot::GetDimensionsCount, static_cast<const TensorTypeAndShapeInfo*>(info), &n);
  r.dims.resize(n);
  if (s == nullptr)
    s = api.call<Status*>(Slot::GetDimensions, static_cast<const TensorTypeAndShapeInfo*>(info), r.dims.data(), n);
  api.call<void>(Slot::ReleaseTensorTypeAndShapeInfo, info);
  check(api, s, "GetTensorTypeAndShape");
  r.element_type = t;
  return r;
}

void* data_of(Api api, const Value* value) {
  void* data = nullptr;
  check(api, api.call<Status*>(Slot::GetTensorMutableData, const_cast<Value*>(value), &data), "GetTensorMutableData");
  return data;
}

/// Scratch memory for a kernel (OpforgeContext::allocate), aligned to kScratchAlignment bytes: on
/// CUDA from ONNX Runtime's allocator for the kernel's device, on the host from the heap; freed
/// when the node's run returns (a later kernel on the same stream may then reuse it).
class Scratch {
 public:
  static constexpr size_t kScratchAlignment = 256;  // what cuBLAS asks of a workspace

  Scratch(Api api, Allocator* device) : api_(api), device_(device) {}
  ~Scratch() {
    for (void* p : device_blocks_) {
      Status* s = api_.call<Status*>(Slot::AllocatorFree, device_, p);
      if (s != nullptr) api_.call<void>(Slot::ReleaseStatus, s);
    }
    for (void* p : host_blocks_) std::free(p);
    if (device_ != nullptr) api_.call<void>(Slot::ReleaseAllocator, device_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  static void* allocate(void* state, size_t bytes) {
    auto* s = static_cast<Scratch*>(state);
    constexpr size_t a = kScratchAlignment;
    if (s->device_ == nullptr) {
      void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
      if (p != nullptr) s->host_blocks_.push_back(p);
      return p;
    }
    void* p = nullptr;
    Status* status = s->api_.call<Status*>(Slot::AllocatorAlloc, s->device_, bytes + a - 1, &p);
    if (status != nullptr) {
      s->api_.call<void>(Slot::ReleaseStatus, status);
      return nullptr;
    }
    s->device_blocks_.push_back(p);
    return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + a - 1) / a * a);
  }

 private:
  Api api_;
  Allocator* device_;  // null on the host
  std::vector<void*> device_blocks_, host_blocks_;
};

/// The call protocol's hooks (core::CallHooks) for one node run: outputs are ONNX Runtime's
/// outputs of the node, allocated by it at the shape the core's rule gives.
class Hooks final : public core::CallHooks {
 public:
  Hooks(const OpEntry& entry, Api api, KernelContext* context, int32_t device_index, void* stream, Allocator* device,
        Views& views)
      : entry_(entry),
        api_(api),
        context_(context),
        device_index_(device_index),
        stream_(stream),
        views_(views),
        scratch_(api, device) {}

  OpforgeTensor output(int32_t k, int32_t dtype, core::Span<const int64_t> sizes) override {
    return node_output(k, dtype, std::vector<int64_t>(sizes.begin(), sizes.end()));
  }
  /// Output slot `index` of the node at `dims`, checked to have the element type of `dtype`.
  OpforgeTensor node_output(int32_t index, int32_t dtype, std::vector<int64_t> dims) {
    Value* value = nullptr;
    check(api_,
          api_.call<Status*>(Slot::KernelContext_GetOutput, context_, static_cast<size_t>(index),
                             static_cast<const int64_t*>(dims.data()), dims.size(), &value),
          "KernelContext_GetOutput");
    if (value == nullptr)
      throw InternalError("opforge.ort: " + core::qualified_name(*entry_.op) + ": ONNX Runtime gave no output " +
                          std::to_string(index) + " (the node leaves it out, but the call writes it)");
    const int32_t t = type_and_shape(api_, value).element_type;
    if (type_of(t).opforge != dtype)
      throw InternalError("opforge.ort: " + core::qualified_name(*entry_.op) + ": ONNX Runtime allocated output " +
                          std::to_string(index) + " as " + type_of(t).label + ", the rule gives " + dtype_name(dtype));
    return views_.of(data_of(api_, value), dtype, std::move(dims), entry_.device_type, device_index_);
  }
  OpforgeTensor temporary(int32_t) override { throw InternalError("opforge.ort: an out= call reached ONNX Runtime"); }
  void copy_back(int32_t) override { throw InternalError("opforge.ort: an out= call reached ONNX Runtime"); }
  OpforgeTensor dense_copy(int32_t arg) override {
    // ONNX Runtime's tensors are dense; one whose data is not 16-byte aligned is copied.
    throw InternalError("opforge.ort: " + core::qualified_name(*entry_.op) + ": ONNX Runtime passed " +
                        entry_.op->args[arg].name + " at an address that is not 16-byte aligned");
  }
  void fill(const OpforgeTensor& t, uint8_t byte) override {
    const size_t bytes = byte_size(t);
    if (entry_.device_type == OPFORGE_DEVICE_CPU) {
      std::memset(t.data, byte, bytes);
      return;
    }
    const Driver& d = Driver::get();
    if (d.memset_d8_async == nullptr ||
        d.memset_d8_async(reinterpret_cast<uintptr_t>(t.data), byte, bytes, stream_) != 0)
      throw InternalError("opforge.ort: " + core::qualified_name(*entry_.op) +
                          ": cuMemsetD8Async failed poisoning an output");
  }
  /// Copies `bytes` from `from` to `to`, on the node's stream for CUDA.
  void copy(void* to, const void* from, size_t bytes) {
    if (to == from || bytes == 0) return;
    if (entry_.device_type == OPFORGE_DEVICE_CPU) {
      std::memcpy(to, from, bytes);
      return;
    }
    const Driver& d = Driver::get();
    if (d.memcpy_async == nullptr ||
        d.memcpy_async(reinterpret_cast<uintptr_t>(to), reinterpret_cast<uintptr_t>(from), bytes, stream_) != 0)
      throw InternalError("opforge.ort: " + core::qualified_name(*entry_.op) +
                          ": cuMemcpyAsync failed copying a written input");
  }
  OpforgeContext context() override {
    return {sizeof(OpforgeContext), entry_.device_type, device_index_, stream_, &Scratch::allocate, &scratch_, 0};
  }

 private:
  const OpEntry& entry_;
  Api api_;
  KernelContext* context_;
  int32_t device_index_;
  void* stream_;
  Views& views_;
  Scratch scratch_;
};

/// The CUDA device of `value` (its memory info's id).
int32_t device_of(Api api, const Value* value) {
  const MemoryInfo* info = nullptr;
  check(api, api.call<Status*>(Slot::GetTensorMemoryInfo, value, &info), "GetTensorMemoryInfo");
  int id = 0;
  check(api, api.call<Status*>(Slot::MemoryInfoGetId, info, &id), "MemoryInfoGetId");
  return id;
}

/// ONNX Runtime's allocator for CUDA device `device` in this run (released by Scratch).
Allocator* cuda_allocator(Api api, const KernelContext* context, int32_t device) {
  MemoryInfo* info = nullptr;
  check(
      api,
      api.call<Status*>(Slot::CreateMemoryInfo, "Cuda", kArenaAllocator, static_cast<int>(device), kMemDefault, &info),
      "CreateMemoryInfo");
  Allocator* allocator = nullptr;
  Status* s =
      api.call<Status*>(Slot::KernelContext_GetAllocator, context, static_cast<const MemoryInfo*>(info), &allocator);
  api.call<void>(Slot::ReleaseMemoryInfo, info);
  check(api, s, "KernelContext_GetAllocator");
  return allocator;
}

}  // namespace

Kernel::Kernel(const OpEntry& entry, Api api, const KernelInfo* info)
    : entry_(entry), api_(api), params_(*entry.op, *std::make_unique<KernelInfoSource>(api, info)) {
  // ONNX Runtime allocates an output once, at its final shape: a size the kernel writes is known too late.
  std::string dynamic;
  for (int32_t k = 0; k < entry.op->num_outputs; ++k)
    if (entry.op->outputs[k].size_from >= 0)
      dynamic += std::string(dynamic.empty() ? "" : ", ") + entry.op->outputs[k].name;
  if (!dynamic.empty())
    throw InvalidArgument("opforge.ort: " + core::qualified_name(*entry.op) + ": the sizes of its outputs " + dynamic +
                          " depend on the input values (opforge::size_of), and ONNX Runtime allocates outputs before "
                          "the kernel runs");
}

void Kernel::compute(KernelContext* context) {
  const OpforgeOpSpec& op = *entry_.op;
  const int32_t device_type = entry_.device_type;
  const char* device_name = core::device_type_name(device_type);
  const int32_t n = op.num_args;
  std::vector<core::ArgInfo<int64_t>> info(n);
  std::vector<OpforgeArg> args(n);
  std::vector<const Value*> values(n, nullptr);
  Views views;

  size_t input = 0;
  int32_t device_index = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR) {
      args[i].value = info[i].value = params_[i];
      continue;
    }
    args[i].value.kind = info[i].value.kind = OPFORGE_ARG_TENSOR;
    check(api_,
          api_.call<Status*>(Slot::KernelContext_GetInput, static_cast<const KernelContext*>(context), input++,
                             &values[i]),
          "KernelContext_GetInput");
    if (values[i] != nullptr && device_type == OPFORGE_DEVICE_CUDA && device_index < 0)
      device_index = device_of(api_, values[i]);
  }
  input = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR) continue;
    if (values[i] == nullptr) {
      info[i].defined = false;
      args[i].tensor = core::absent_tensor(device_type, device_index);
      continue;
    }
    TypeAndShape ts = type_and_shape(api_, values[i]);
    const TypeMap t = type_of(ts.element_type);
    args[i].tensor = views.of(data_of(api_, values[i]), t.opforge, std::move(ts.dims), device_type, device_index);
    info[i].dtype = t.opforge;
    info[i].dtype_label = t.label;
    info[i].device_type = device_name;
    info[i].device_index = device_index;
    info[i].sizes = core::Span<const int64_t>(args[i].tensor.sizes, static_cast<size_t>(args[i].tensor.ndim));
  }

  void* stream = nullptr;
  Allocator* device = nullptr;
  if (device_type == OPFORGE_DEVICE_CUDA) {
    check(api_,
          api_.call<Status*>(Slot::KernelContext_GetGPUComputeStream, static_cast<const KernelContext*>(context),
                             &stream),
          "KernelContext_GetGPUComputeStream");
    device = cuda_allocator(api_, context, device_index < 0 ? 0 : device_index);
  }
  Hooks hooks(entry_, api_, context, device_index, stream, device, views);

  // A written input is written in its output (Note [The ONNX node of an op]): the input's value
  // is copied there and the kernel writes the copy in place. A view the op could not take as it
  // is stays refused by the core (run_call step 3) after the copy: it has the input's layout.
  int32_t written = op.num_outputs;
  for (int32_t i = 0; i < n; ++i) {
    if (!core::is_mutated(op.args[i])) continue;
    const int32_t slot = written++;
    if (!info[i].defined || info[i].dtype < 0) continue;
    const OpforgeTensor in = args[i].tensor;
    const OpforgeTensor out = hooks.node_output(slot, in.dtype, std::vector<int64_t>(in.sizes, in.sizes + in.ndim));
    hooks.copy(out.data, in.data, byte_size(in));
    args[i].tensor.data = out.data;
  }

  const core::Call call{op, core::device_kernel(op, device_type), info, args, {}, false, device_type, device_index};
  std::vector<OpforgeTensor> out_views(static_cast<size_t>(op.num_outputs));
  core::run_call(call, hooks, out_views);
}

}  // namespace opforge::ort
