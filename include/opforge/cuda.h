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

#include <cuda.h>  // CUtensorMap and its enums only: the driver is reached through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "opforge/detail/driver.h"
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

/// Attribute kAttribute of the current device (cudaDeviceGetAttribute), cached per device
/// (for attributes whose values are positive; one cache per attribute). Throws InternalError where
/// the CUDA runtime fails.
template <cudaDeviceAttr kAttribute>
inline int device_attribute() {
  static std::atomic<int> values[64] = {};
  int dev = 0;
  OPFORGE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64) {
    if (const int v = values[dev].load(std::memory_order_relaxed); v > 0) return v;
  }
  int n = 0;
  OPFORGE_CUDA_CHECK(cudaDeviceGetAttribute(&n, kAttribute, dev));
  if (dev < 64) values[dev].store(n, std::memory_order_relaxed);
  return n;
}

/// Number of streaming multiprocessors of the current device (cached per device).
inline int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }

/// Bytes of shared memory one block of the current device may take when its kernel opts in
/// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB on sm_90, 99 KiB on sm_86; cached per device).
inline int smem_per_block_optin() { return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(); }

/// Blocks for a grid-stride loop over `items` work items with `threads` per block: enough to
/// cover the items, at most `blocks_per_sm` resident blocks per multiprocessor.
inline unsigned grid_for(int64_t items, int threads, int blocks_per_sm = 8) {
  const int64_t needed = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(needed, int64_t{sm_count()} * blocks_per_sm)));
}

/// Blocks of `threads` threads of `kernel`, each with `dynamic_smem` bytes of dynamic shared
/// memory, that fit on the device at once: occupancy (by
/// cudaOccupancyMaxActiveBlocksPerMultiprocessor) times multiprocessors, at least 1.
template <class Kernel>
inline int64_t resident_blocks(Kernel kernel, int threads, size_t dynamic_smem = 0) {
  int per_sm = 0;
  OPFORGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, dynamic_smem));
  return int64_t{std::max(per_sm, 1)} * sm_count();
}

/// resident_blocks, at most `items` (0 if `items` is 0): the grid of a kernel whose blocks loop
/// over items (rows) and keep per-block partial sums, so that there are as few partials as keep
/// every multiprocessor busy.
template <class Kernel>
inline unsigned resident_grid(Kernel kernel, int threads, int64_t items, size_t dynamic_smem = 0) {
  if (items <= 0) return 0;
  return static_cast<unsigned>(std::min<int64_t>(items, resident_blocks(kernel, threads, dynamic_smem)));
}

/// Lets `kernel` launch with `bytes` of dynamic shared memory (cudaFuncSetAttribute's
/// cudaFuncAttributeMaxDynamicSharedMemorySize: without it, static and dynamic shared memory
/// together may not pass 48 KiB). Throws opforge::InternalError (CUDA's message) where the
/// device has less shared memory per block.
template <class Kernel>
inline void allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes > 0)
    OPFORGE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

namespace detail {
/// out[c] = sum over p of partial[p * cols + c], a 32-column tile per block: threadIdx.x picks
/// the column, the 8 rows of threads take every 8th part, shared memory adds the 8 sums.
template <class A, class W>
__global__ void __launch_bounds__(256)
    sum_partials_kernel(const A* __restrict__ partial, int64_t parts, int64_t cols, W* __restrict__ out) {
  __shared__ A sums[8][33];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  A s = 0;
  if (c < cols)
    for (int64_t p = threadIdx.y; p < parts; p += 8) s += partial[p * cols + c];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int k = 1; k < 8; ++k) s += sums[k][threadIdx.x];
    out[c] = static_cast<W>(s);
  }
}
}  // namespace detail

/// Second pass of a reduction over rows: out[c] = sum over p < parts of partial[p * cols + c]
/// (`partial` row-major [parts, cols] of float or double, one row of partial sums per block
/// of a first pass; `out` [cols] of W, a float type or CUDA's __half / __nv_bfloat16, written
/// once, rounded to nearest), launched on `stream`. parts == 0 writes zeros. The scheme of
/// the weight gradients of Apex's and PyTorch's LayerNorm backward (a per-block partial pass,
/// then a column sum), which needs no atomics and gives the same bits on every run.
template <class A, class W>
void sum_partials(const A* partial, int64_t parts, int64_t cols, W* out, cudaStream_t stream) {
  if (cols == 0) return;
  const int64_t blocks = (cols + 31) / 32;
  OPFORGE_CHECK(blocks <= 0x7fffffff, "sum_partials: ", cols, " columns, more than one launch covers");
  detail::sum_partials_kernel<A, W>
      <<<static_cast<unsigned>(blocks), dim3(32, 8), 0, stream>>>(partial, parts, cols, out);
  check_launch("opforge::cuda::sum_partials");
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

/// A tensor map (CUDA Driver API, "Tensor Map Object Management": cuTensorMapEncodeTiled) for the
/// bulk tensor copies of sm_90 (`cp.async.bulk.tensor`): the tensor at `base` of `dims` elements
/// of `type` per dimension, innermost first, dense in dimension 0, with the byte strides of
/// dimensions 1..kRank-1 in `strides` (multiples of 16 below 2^40; the driver's documentation shows
/// them increasing, and a map whose strides decrease encodes and copies correctly on driver 580:
/// int8_linear.cu's map of x), copied in boxes of `box`
/// elements (each <= 256; box[0] times the element size a multiple of 16, and at most the swizzle
/// span where there is one). Elements a box reads past `dims` arrive as zeros. The driver is
/// reached through the runtime (opforge/detail/driver.h). Throws opforge::InternalError with the
/// driver's description where the encoding fails (a misaligned base or stride, a box out of range).
template <int kRank>
inline CUtensorMap tiled_tensor_map(CUtensorMapDataType type, const void* base, const std::array<uint64_t, kRank>& dims,
                                    const std::array<uint64_t, kRank - 1>& strides,
                                    const std::array<uint32_t, kRank>& box,
                                    CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  static const auto encode =
      opforge::detail::driver_entry_point<decltype(&::cuTensorMapEncodeTiled)>("cuTensorMapEncodeTiled");
  if (encode == nullptr)
    throw InternalError("the CUDA driver has no cuTensorMapEncodeTiled (it needs a CUDA 12 driver)");
  CUtensorMap map{};
  std::array<uint32_t, kRank> element_strides;
  element_strides.fill(1);
  const CUresult result = encode(&map, type, kRank, const_cast<void*>(base), dims.data(), strides.data(), box.data(),
                                 element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) throw InternalError(opforge::detail::driver_error(result, "cuTensorMapEncodeTiled"));
  return map;
}

}  // namespace opforge::cuda
