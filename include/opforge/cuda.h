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
#include <cuda_fp8.h>
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

namespace detail {
/// query(device) for the current device, cached in `cache` (one slot per device, the first 64;
/// for values that are positive). Throws InternalError where the CUDA runtime fails.
template <class Query>
inline int per_device(std::atomic<int> (&cache)[64], Query query) {
  int dev = 0;
  OPFORGE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64) {
    if (const int v = cache[dev].load(std::memory_order_relaxed); v > 0) return v;
  }
  const int v = query(dev);
  if (dev < 64) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}
}  // namespace detail

/// Attribute kAttribute of the current device (cudaDeviceGetAttribute), cached per device
/// (for attributes whose values are positive; one cache per attribute). Throws InternalError where
/// the CUDA runtime fails.
template <cudaDeviceAttr kAttribute>
inline int device_attribute() {
  static std::atomic<int> values[64] = {};
  return detail::per_device(values, [](int dev) {
    int n = 0;
    OPFORGE_CUDA_CHECK(cudaDeviceGetAttribute(&n, kAttribute, dev));
    return n;
  });
}

/// The PTX version `kKernel`'s image for the current device was compiled from
/// (cudaFuncGetAttributes' ptxVersion, 10 * major + minor: 90 for compute_90), cached per device.
/// Code under `#if __CUDA_ARCH__ >= 900` runs exactly where this is at least 90: PTX for an older
/// target, JIT-compiled on a newer GPU, runs the other branch. Throws InternalError where the CUDA
/// runtime fails.
template <auto kKernel>
inline int ptx_version() {
  static std::atomic<int> versions[64] = {};
  return detail::per_device(versions, [](int) {
    cudaFuncAttributes attributes{};
    OPFORGE_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kKernel));
    return attributes.ptxVersion;
  });
}

/// Programmatic dependent launch (CUDA C++ Programming Guide, "Programmatic Dependent Launch and
/// Synchronization"; PTX `griddepcontrol`, sm_90): a kernel whose blocks call this lets the next
/// kernel on the stream, where that one was launched by launch_after, start its blocks once every
/// block of this grid has called it or exited. Call it after a block's main work, before its last
/// writes: the dependent kernel still waits for them in wait_for_prior_grid(). A no-op before sm_90.
__device__ inline void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Waits until the grids this kernel depends on have completed and their memory writes are
/// visible (PTX `griddepcontrol.wait`). A kernel launched by launch_after must call it before it
/// reads what those grids wrote. A no-op before sm_90 and for a kernel launched without the
/// dependency.
__device__ inline void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Launches kKernel<<<grid, block, dynamic_smem, stream>>>(args...) so that it may start before
/// the previous kernel on `stream` has finished (cudaLaunchKernelEx with
/// cudaLaunchAttributeProgrammaticStreamSerialization) where kKernel's image calls
/// wait_for_prior_grid() (built from PTX for sm_90 or newer: ptx_version), and as a plain launch
/// elsewhere: its launch latency hides behind the previous kernel's last blocks. kKernel must call
/// wait_for_prior_grid() before it reads what earlier kernels wrote. Throws InternalError (CUDA's
/// message, naming `name`) where the launch fails.
template <auto kKernel, class... Args>
void launch_after(dim3 grid, dim3 block, size_t dynamic_smem, cudaStream_t stream, const char* name, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = dynamic_smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (ptx_version<kKernel>() >= 90) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  cudaLaunchKernelEx(&config, kKernel, args...);
  check_launch(name);  // the launch's error, if any, is the runtime's last error
}

/// Number of streaming multiprocessors of the current device (cached per device).
inline int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }

/// Compute capability of the current device as 10 * major + minor (90 for sm_90), cached per
/// device. Throws InternalError where the CUDA runtime fails.
inline int compute_capability() {
  static std::atomic<int> values[64] = {};
  return detail::per_device(values, [](int dev) {
    int major = 0, minor = 0;
    OPFORGE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    OPFORGE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return 10 * major + minor;
  });
}

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

/// Blocks for a kernel whose blocks loop over `items` work items (rows) and keep per-block
/// partial sums: as few as keep every multiprocessor busy. That is resident_blocks' count of
/// rounds, ceil(items / resident), with the items spread evenly over the fewest blocks that take
/// no more rounds (ceil(items / rounds)), so that the last round runs on almost every block
/// instead of a few (with 32768 rows and 528 resident blocks: 521 blocks of 62 or 63 rows, where
/// 528 left 32 blocks a 63rd row alone). 0 if `items` is 0.
template <class Kernel>
inline unsigned resident_grid(Kernel kernel, int threads, int64_t items, size_t dynamic_smem = 0) {
  if (items <= 0) return 0;
  const int64_t resident = resident_blocks(kernel, threads, dynamic_smem);
  const int64_t rounds = (items + resident - 1) / resident;
  return static_cast<unsigned>((items + rounds - 1) / rounds);
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
/// Up to four outputs of one sum_partials launch, by value in the kernel's parameters.
template <class W>
struct PartialOutputs {
  W* out[4];
};

/// out[blockIdx.y][c] = sum over p of partial[(blockIdx.y * parts + p) * cols + c], a 32-column
/// tile per block: threadIdx.x picks the column, the 32 rows of threads take every 32nd part into
/// kSums independent sums (kSums loads in flight together), then warp threadIdx.y adds the 32 sums
/// of column threadIdx.y by shuffles. The order of the additions depends only on `parts`.
template <class A, class W>
__global__ void __launch_bounds__(1024)
    sum_partials_kernel(const A* __restrict__ partial, int64_t parts, int64_t cols, PartialOutputs<W> outs) {
  constexpr int kSums = 8;
  __shared__ A sums[32][33];
  const int64_t c = int64_t{blockIdx.x} * 32 + threadIdx.x;
  const A* const rows = partial + int64_t{blockIdx.y} * parts * cols;
  wait_for_prior_grid();  // launched by launch_after, behind the kernel that writes `partial`
  A s[kSums] = {};
  if (c < cols) {
    int64_t p = threadIdx.y;
    for (; p + 32 * (kSums - 1) < parts; p += 32 * kSums) {
#pragma unroll
      for (int j = 0; j < kSums; ++j) s[j] += rows[(p + 32 * j) * cols + c];
    }
#pragma unroll
    for (int j = 0; j < kSums - 1; ++j)
      if (p + 32 * j < parts) s[j] += rows[(p + 32 * j) * cols + c];
  }
#pragma unroll
  for (int width = kSums / 2; width > 0; width /= 2) {
#pragma unroll
    for (int j = 0; j < width; ++j) s[j] += s[j + width];
  }
  sums[threadIdx.y][threadIdx.x] = s[0];
  __syncthreads();
  A v = sums[threadIdx.x][threadIdx.y];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int64_t column = int64_t{blockIdx.x} * 32 + threadIdx.y;
  if (threadIdx.x == 0 && column < cols) outs.out[blockIdx.y][column] = static_cast<W>(v);
}
}  // namespace detail

/// Second pass of a reduction over rows, for N <= 4 reductions at once: outs[o][c] = sum over
/// p < parts of partial[(o * parts + p) * cols + c] (`partial` row-major [N, parts, cols] of float
/// or double, one row of partial sums per block of a first pass and reduction; each output [cols]
/// of W, a float type or CUDA's __half / __nv_bfloat16, written once, rounded to nearest), one
/// launch on `stream` by launch_after (the first pass may call allow_dependent_launch() once its
/// rows are done). parts == 0 writes zeros. The scheme of the weight gradients of Apex's and
/// PyTorch's LayerNorm backward (a per-block partial pass, then a column sum), which needs no
/// atomics and gives the same bits on every run. Throws opforge::InternalError for more columns
/// than one launch covers.
template <class A, class W, size_t N>
void sum_partials(const A* partial, int64_t parts, int64_t cols, W* const (&outs)[N], cudaStream_t stream) {
  static_assert(N >= 1 && N <= 4, "opforge::cuda::sum_partials: one to four outputs a launch");
  if (cols == 0) return;
  const int64_t blocks = (cols + 31) / 32;
  OPFORGE_CHECK(blocks <= 0x7fffffff, "sum_partials: ", cols, " columns, more than one launch covers");
  detail::PartialOutputs<W> out{};
  std::copy(outs, outs + N, out.out);
  launch_after<detail::sum_partials_kernel<A, W>>(dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(N)),
                                                  dim3(32, 32), 0, stream, "opforge::cuda::sum_partials", partial,
                                                  parts, cols, out);
}

/// sum_partials of one reduction: out[c] = sum over p < parts of partial[p * cols + c].
template <class A, class W>
void sum_partials(const A* partial, int64_t parts, int64_t cols, W* out, cudaStream_t stream) {
  sum_partials(partial, parts, cols, {out}, stream);
}

namespace detail {
/// CUDA's types for the dtypes without a builtin C++ type (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h).
struct DeviceTypes {
  using Half = __half;
  using BFloat16 = __nv_bfloat16;
  using Float8_e4m3fn = __nv_fp8_e4m3;
  using Float8_e5m2 = __nv_fp8_e5m2;
  using Float8_e8m0fnu = __nv_fp8_e8m0;
};
}  // namespace detail

/// Like opforge::visit_dtype, but hands out CUDA's device types: __half for float16,
/// __nv_bfloat16 for bfloat16, __nv_fp8_e4m3, __nv_fp8_e5m2 and __nv_fp8_e8m0 for the float8
/// dtypes (same storage as opforge::Half, opforge::BFloat16 and opforge::Float8_*).
template <DtypeSet Allowed, class F>
decltype(auto) visit_dtype(Dtype d, F&& f) {
  return ::opforge::detail::visit_dtype_impl<Allowed, detail::DeviceTypes>(d, std::forward<F>(f));
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
  static_assert(kRank >= 1 && kRank <= 5, "tensor maps have 1 to 5 dims");
  CUtensorMap map{};
  const CUresult result = opforge::detail::encode_tiled_tensor_map(map, type, kRank, base, dims.data(), strides.data(),
                                                                   box.data(), swizzle, promotion);
  if (result == CUDA_ERROR_NOT_SUPPORTED)
    throw InternalError("the CUDA driver has no cuTensorMapEncodeTiled (it needs a CUDA 12 driver)");
  if (result != CUDA_SUCCESS) throw InternalError(opforge::detail::driver_error(result, "cuTensorMapEncodeTiled"));
  return map;
}

}  // namespace opforge::cuda
