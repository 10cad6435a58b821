// opforge/cuda.h -- helpers for the .cu files of an op: the stream, dtype dispatch with CUDA's
// half types, launch checks and grid sizing. Included by .cu files only; op files stay free of
// CUDA headers.
//
//   void softshrink_cuda(const opforge::Context& ctx, opforge::Tensor x, double lambd,
//                        opforge::MutableTensor y) {
//     opforge::cuda::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
//       softshrink_kernel<T><<<grid, 256, 0, opforge::cuda::stream(ctx)>>>(x.data<T>(), ...);
//     });
//     opforge::cuda::check_launch("softshrink_kernel");
//   }
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "opforge/dtype.h"
#include "opforge/error.h"
#include "opforge/kernel.cuh"
#include "opforge/tensor.h"

/// Throws opforge::InternalError naming the failing call if a CUDA runtime call fails.
#define OPFORGE_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                   \
    cudaError_t opforge_err_ = (expr);                                                                   \
    if (opforge_err_ != cudaSuccess)                                                                     \
      throw ::opforge::InternalError(std::string(#expr " failed: ") + cudaGetErrorString(opforge_err_)); \
  } while (0)

namespace opforge::cuda {

/// The stream a kernel must launch on: the framework's current stream for the device.
inline cudaStream_t stream(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

/// Throws InternalError if the last launch failed (bad configuration, missing image for this
/// architecture). Call after each launch.
inline void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw InternalError(std::string("launching ") + kernel + " failed: " + cudaGetErrorString(e));
}

/// Number of streaming multiprocessors of the current device (cached per device).
inline int sm_count() {
  static int counts[64] = {0};
  int dev = 0;
  OPFORGE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && counts[dev] > 0) return counts[dev];
  int n = 0;
  OPFORGE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev < 64) counts[dev] = n;
  return n;
}

/// Blocks for a grid-stride loop over `items` work items with `threads` per block: enough to
/// cover the items, at most `blocks_per_sm` resident blocks per multiprocessor.
inline unsigned grid_for(int64_t items, int threads, int blocks_per_sm = 8) {
  const int64_t needed = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(needed, int64_t{sm_count()} * blocks_per_sm)));
}

/// Like opforge::visit_dtype, but hands out CUDA's device types: __half for float16 and
/// __nv_bfloat16 for bfloat16 (same storage as opforge::Half and opforge::BFloat16).
template <DtypeSet Allowed, class F>
decltype(auto) visit_dtype(Dtype d, F&& f) {
  return ::opforge::detail::visit_dtype_impl<Allowed, __half, __nv_bfloat16>(d, std::forward<F>(f));
}

// Device helpers shared with run-time kernels (opforge/kernel.cuh).
using kernel::acc_t;
using kernel::from_acc;
using kernel::to_acc;
using kernel::Vec;

/// True if every pointer is aligned to `bytes`.
template <class... P>
inline bool aligned(int bytes, const P*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % bytes == 0) && ...);
}

}  // namespace opforge::cuda
