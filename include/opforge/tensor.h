// opforge/tensor.h -- the views a kernel receives: Tensor (an input), MutableTensor (an
// output) and Context (stream, device, scratch memory).
//
//   void softshrink_cpu(opforge::Tensor x, double lambd, opforge::MutableTensor y) {
//     for (int64_t i = 0; i < x.numel(); ++i) ...  // inputs are dense unless declared strided
//   }
#pragma once

#include <cstddef>
#include <cstdint>

#include "opforge/c_api.h"
#include "opforge/dtype.h"

namespace opforge {

/// Read-only view of an input tensor (shape, strides in elements, dtype, device).
/// Inputs are dense, row-major and 16-byte aligned unless the op declares them `opforge::strided`.
///
/// An `opforge::optional` input the caller left out (None) is undefined: defined() is false,
/// data<T>() and raw_data() are null, ndim() and numel() are 0, sizes() and strides() are null,
/// is_contiguous() is true, dtype() is not a valid Dtype (visit_dtype throws on it), is_cuda()
/// and device_index() are the call's device; size(d) and stride(d) must not be called (it has
/// no dims). Every other input is always defined.
class Tensor {
 public:
  explicit Tensor(const OpforgeTensor& t) : t_(t) {}

  /// False for an `opforge::optional` input the caller left out (None); see the class comment.
  bool defined() const { return t_.ndim >= 0; }
  int32_t ndim() const { return t_.ndim < 0 ? 0 : t_.ndim; }
  /// Size of dim `d`; negative `d` counts from the end.
  int64_t size(int32_t d) const { return t_.sizes[d < 0 ? d + t_.ndim : d]; }
  /// Stride of dim `d` in elements; negative `d` counts from the end.
  int64_t stride(int32_t d) const { return t_.strides[d < 0 ? d + t_.ndim : d]; }
  const int64_t* sizes() const { return t_.sizes; }
  const int64_t* strides() const { return t_.strides; }
  /// Element count; 0 for an undefined tensor.
  int64_t numel() const {
    if (t_.ndim < 0) return 0;
    int64_t n = 1;
    for (int32_t d = 0; d < t_.ndim; ++d) n *= t_.sizes[d];
    return n;
  }
  Dtype dtype() const { return static_cast<Dtype>(t_.dtype); }
  bool is_cuda() const { return t_.device_type == OPFORGE_DEVICE_CUDA; }
  int32_t device_index() const { return t_.device_index; }
  /// True if dense and row-major (size-1 dims may have any stride).
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int32_t d = t_.ndim - 1; d >= 0; --d) {
      if (t_.sizes[d] != 1 && t_.strides[d] != expected) return false;
      expected *= t_.sizes[d];
    }
    return true;
  }
  /// Typed pointer to element [0, ..., 0]. T must match dtype() (see visit_dtype).
  template <class T>
  const T* data() const {
    return static_cast<const T*>(t_.data);
  }
  const void* raw_data() const { return t_.data; }
  const OpforgeTensor& c_tensor() const { return t_; }

 protected:
  OpforgeTensor t_;
};

/// Writable view of an output tensor -- dense, row-major, allocated by the adapter with the
/// shape and dtype of the op's output rule; kernels write every element -- or of an input
/// declared opforge::mutated (the caller's tensor, laid out as its rule says; see Note
/// [Mutated inputs] in opforge/op_constraints.h).
class MutableTensor : public Tensor {
 public:
  using Tensor::Tensor;
  template <class T>
  T* data() const {
    return static_cast<T*>(t_.data);
  }
  void* raw_data() const { return t_.data; }
};

/// What a kernel is given besides its arguments: the device, the stream to launch on (the
/// framework's current stream, never the legacy default stream) and scratch memory from the
/// framework's allocator. Kernels never synchronise and never call cudaMalloc, so they stay
/// safe inside CUDA graphs.
class Context {
 public:
  explicit Context(const OpforgeContext& c) : c_(c) {}
  bool is_cuda() const { return c_.device_type == OPFORGE_DEVICE_CUDA; }
  int32_t device_index() const { return c_.device_index; }
  /// The stream as an opaque handle (a cudaStream_t on CUDA; see opforge/cuda.h).
  void* stream() const { return c_.stream; }
  /// `bytes` of scratch memory on the kernel's device, aligned to 256 bytes, valid until the
  /// kernel returns and ordered on stream(). Throws InternalError if the allocator fails.
  void* allocate(size_t bytes) const {
    void* p = c_.allocate ? c_.allocate(c_.allocator_state, bytes) : nullptr;
    if (p == nullptr && bytes > 0) throw InternalError("opforge: scratch allocation failed");
    return p;
  }
  /// True where the core launched the device value check of this call's inputs (Note [Device
  /// value checks] in src/core/device_checks.h) on stream() just before calling this kernel. A
  /// host function may then launch its first kernel, before any other work on stream(), as the
  /// check's programmatic dependent (opforge::cuda::launch_after): that kernel starts while the
  /// check runs and calls opforge::kernel::wait_for_value_checks() before it touches memory
  /// through a checked index (it may read the indices and any input before). False where checks
  /// are off, no input has a value domain, or the core predates ABI 10.
  bool after_value_check() const {
    return OPFORGE_HAS_FIELD(OpforgeContext, c_, after_value_check) && c_.after_value_check != 0;
  }

 private:
  OpforgeContext c_;
};

}  // namespace opforge
