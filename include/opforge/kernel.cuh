// opforge/kernel.cuh -- device-side helpers for kernels, compiled by nvcc ahead of time or by
// NVRTC at run time (where opforge provides this header itself, so `#include
// <opforge/kernel.cuh>` works in a shipped kernel file with no include path set).
//
//   #include <opforge/kernel.cuh>
//   template <class T>
//   __global__ void scale(const T* x, T* y, int64_t n, double alpha) {
//     const int64_t i = opforge::kernel::global_index();
//     if (i < n) y[i] = opforge::kernel::from_acc<T>(opforge::kernel::to_acc(x[i]) * alpha);
//   }
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC has no C library headers; the fixed-width integer types kernels use.
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#else
#include <cstdint>
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace opforge::kernel {

template <bool B, class T, class F>
struct conditional {
  using type = T;
};
template <class T, class F>
struct conditional<false, T, F> {
  using type = F;
};
template <class A, class B>
struct is_same {
  static constexpr bool value = false;
};
template <class A>
struct is_same<A, A> {
  static constexpr bool value = true;
};

/// The arithmetic type for an element type: double for double, float otherwise.
template <class T>
using acc_t = typename conditional<is_same<T, double>::value, double, float>::type;

__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }

/// Rounds an accumulator value to the element type (round to nearest even).
template <class T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  if constexpr (is_same<T, __half>::value) {
    return __float2half_rn(v);
  } else if constexpr (is_same<T, __nv_bfloat16>::value) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

/// N elements of T loaded or stored as one aligned access (16 bytes for N = 16 / sizeof(T)).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

/// True if `p` is aligned to `bytes`.
__host__ __device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

/// This thread's index in a 1-d grid, 64-bit (grids may hold more than 2^31 threads).
__device__ __forceinline__ int64_t global_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

/// Sum of `v` (float or double) over the thread block (blockDim.x a multiple of 32, at most
/// 1024); every thread gets the result. Uses 32 values of shared memory; contains
/// __syncthreads(), so every thread of the block must call it.
template <class A>
__device__ __forceinline__ A block_sum(A v) {
  __shared__ A partial[32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : A(0);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// A row of `cols` elements held in registers across a thread block, for row kernels that read
/// a row once and use it several times (norms): thread t holds the 16-byte vectors t,
/// t + blockDim.x, ... (at most kMaxVectors of them) converted to the accumulator type.
/// `fits(cols)` says whether a row qualifies (cols a multiple of the vector width, at most
/// kMaxVectors * blockDim.x vectors); the same answer holds for every row of a dense
/// [rows, cols] tensor, so the whole block takes the same path. The caller also checks that its
/// pointers are 16-byte aligned (opforge::kernel::aligned); dense inputs are, as opforge passes
/// them.
template <class T, int kMaxVectors = 4>
struct RowRegisters {
  using A = acc_t<T>;
  static constexpr int kWidth = 16 / sizeof(T);
  static constexpr int kVectors = kMaxVectors;
  A v[kMaxVectors][kWidth];

  __device__ static bool fits(int64_t cols) {
    return cols % kWidth == 0 && cols / kWidth <= int64_t{kMaxVectors} * blockDim.x;
  }
  /// Whether this thread's k-th vector exists in a row of `cols` elements.
  __device__ static bool has(int k, int64_t cols) {
    return threadIdx.x + int64_t{k} * blockDim.x < cols / kWidth;
  }
  /// Element offset (within the row) of this thread's k-th vector.
  __device__ static int64_t offset(int k) { return (threadIdx.x + int64_t{k} * blockDim.x) * kWidth; }
  /// Loads the 16 bytes at `p` (aligned) as kWidth accumulator values.
  __device__ static void load(const T* p, A (&out)[kWidth]) {
    const Vec<T, kWidth> in = *reinterpret_cast<const Vec<T, kWidth>*>(p);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) out[i] = to_acc(in.v[i]);
  }
  /// Rounds kWidth accumulator values to T and stores them as one 16-byte access at `p`.
  __device__ static void store(T* p, const A (&in)[kWidth]) {
    Vec<T, kWidth> out;
#pragma unroll
    for (int i = 0; i < kWidth; ++i) out.v[i] = from_acc<T>(in[i]);
    *reinterpret_cast<Vec<T, kWidth>*>(p) = out;
  }
};

}  // namespace opforge::kernel
