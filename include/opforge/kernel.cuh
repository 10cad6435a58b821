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
#include <cstdio>  // printf
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>  // __nv_fp8_e4m3, __nv_fp8_e5m2, __nv_fp8_e8m0 (Note [Float8 dtypes] in opforge/dtype.h)

namespace opforge::kernel {

/// A tensor map a grid function passes (opforge::tensor_map, LaunchConfig::tensor_maps): CUDA's
/// CUtensorMap, 128 opaque bytes. Take it as `const __grid_constant__ opforge::kernel::TensorMap
/// map` and copy through it with opforge/tma.cuh (the copies read the parameter in place).
struct alignas(128) TensorMap {
  unsigned char bytes[128];
};

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
__device__ __forceinline__ float to_acc(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
__device__ __forceinline__ float to_acc(__nv_fp8_e5m2 v) { return static_cast<float>(v); }
__device__ __forceinline__ float to_acc(__nv_fp8_e8m0 v) { return static_cast<float>(v); }

/// Rounds an accumulator value to the element type (round to nearest even). A float8 type
/// saturates as CUDA's conversions do (__NV_SATFINITE: past the largest finite value, infinities
/// too, it gives that value; NaN stays NaN), which opforge::Float8_*::saturated matches on the host.
template <class T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  if constexpr (is_same<T, __half>::value) {
    return __float2half_rn(v);
  } else if constexpr (is_same<T, __nv_bfloat16>::value) {
    return __float2bfloat16_rn(v);
  } else if constexpr (is_same<T, __nv_fp8_e4m3>::value || is_same<T, __nv_fp8_e5m2>::value) {
    return T(v);
  } else {
    return v;
  }
}

/// The largest finite value of a float8 data type: 448 (e4m3) or 57344 (e5m2).
template <class T>
__host__ __device__ constexpr float float8_max() {
  static_assert(is_same<T, __nv_fp8_e4m3>::value || is_same<T, __nv_fp8_e5m2>::value,
                "opforge::kernel::float8_max: __nv_fp8_e4m3 or __nv_fp8_e5m2");
  return is_same<T, __nv_fp8_e4m3>::value ? 448.0f : 57344.0f;
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

/// Waits until the device value check of this call (Note [Device value checks] in
/// src/core/device_checks.h) has completed: a kernel declared `.waits_for_value_checks()` calls
/// it before its first load or store through a checked index (it may read the index itself and
/// any input before), as does a kernel a `.cuda()` host function launches by
/// opforge::cuda::launch_after where opforge::Context::after_value_check() is true. PTX
/// `griddepcontrol.wait`; returns at once where the kernel was not launched as the check's
/// dependent (checks off, nothing to check, a GPU before sm_90).
__device__ __forceinline__ void wait_for_value_checks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// One input's value domain for one call, as a kernel declared `.checks_values_in_kernel()`
/// (opforge/op_builder.h) takes it: by value, `const __grid_constant__ opforge::kernel::ValueDomain
/// slots`, one per input that declares opforge::values_in(...), in argument order, after the
/// op's parameters. Each element in [low, high), or equal to `sentinel` where has_sentinel; where
/// device value checks are off, or the input is absent, it admits every value. The layout of
/// OpforgeValueDomain (opforge/c_api.h).
struct ValueDomain {
  int64_t low, high, sentinel;
  int32_t has_sentinel, arg;
  char message[192];  ///< "ns::op: name: expected values in [rule) = [low, high)"

  __device__ __forceinline__ bool admits(int64_t v) const {
    return (v >= low && v < high) || (has_sentinel && v == sentinel);
  }
};
static_assert(sizeof(ValueDomain) == 224 && alignof(ValueDomain) == 8,
              "opforge::kernel::ValueDomain has the layout of OpforgeValueDomain (opforge/c_api.h)");

/// Checks `v`, element `flat` (row-major) of an input with domain `domain`, before the kernel
/// uses it: outside the domain, it prints the domain's message with the value and its index
/// ("ns::op: slot_mapping: expected values in [0, 65536) or -1, got 70000 at flat index 3"),
/// as the separate value check does, and fails a device-side assertion, as torch's index
/// kernels do (CUDA_KERNEL_ASSERT): the context is then in error, and the caller's next
/// synchronisation raises "device-side assert triggered". A kernel declared
/// `.checks_values_in_kernel()` calls it on every element of each such input, each before its
/// first use: the core then launches no separate check (Note [Device value checks]).
__device__ __forceinline__ void check_value(const ValueDomain& domain, int64_t v, int64_t flat) {
  if (!domain.admits(v)) {
    printf("%s, got %lld at flat index %lld\n", domain.message, static_cast<long long>(v),
           static_cast<long long>(flat));
    // The assertion's failure itself, as torch's CUDA_KERNEL_ASSERT calls it: assert() would be
    // compiled out under NDEBUG.
#if defined(__CUDACC_RTC__)
    __assertfail("opforge: an index outside its declared value domain", __FILE__, __LINE__, __func__, sizeof(char));
#elif defined(__CUDA_ARCH__)  // CUDA's device headers declare it in the device pass
    __assert_fail("opforge: an index outside its declared value domain", __FILE__, __LINE__, __func__);
#endif
  }
}

/// Sum of `v` (float or double) over the thread block (blockDim.x a multiple of 32, at most
/// 1024); every thread gets the result. Uses 32 values of shared memory; contains
/// __syncthreads() (unless the block is one warp), so every thread of the block must call it.
template <class A>
__device__ __forceinline__ A block_sum(A v) {
  __shared__ A partial[32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (blockDim.x == 32) return v;  // one warp (short rows): the shuffles summed the block
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : A(0);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// The largest `v` (float) over the thread block, NaN skipped as fmaxf skips it; every thread
/// gets the result. Conditions as block_sum's (blockDim.x a multiple of 32, at most 1024, called
/// by every thread of the block).
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (blockDim.x == 32) return v;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : -__int_as_float(0x7f800000);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// Sums of each of the N values of `v` (float or double) over the thread block, in place, with
/// one barrier, through `buffer` (shared memory): it is written before the barrier and read after,
/// so the caller makes sure a barrier separates the previous reads of `buffer` from this call,
/// e.g. by alternating two buffers between consecutive calls (each call's barrier then orders the
/// other buffer's reads before its next writes). Conditions otherwise as block_sum's.
template <class A, int N>
__device__ __forceinline__ void block_sum(A (&v)[N], A (&buffer)[N][32]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
  }
  if (blockDim.x == 32) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) buffer[i][warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = lane < static_cast<int>(blockDim.x / 32) ? buffer[i][lane] : A(0);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
  }
}

/// Sums of each of the N values of `v` (float or double) over the thread block, in place, with
/// one pair of barriers for all N (a norm's backward needs two or three sums of a row; block_sum
/// of each would pay a pair apiece). Same conditions as block_sum: blockDim.x a multiple of 32,
/// at most 1024, called by every thread of the block; uses N * 32 values of shared memory.
template <class A, int N>
__device__ __forceinline__ void block_sum(A (&v)[N]) {
  __shared__ A partial[N][32];
  if (blockDim.x != 32) __syncthreads();  // partial[] may still be read by a previous call
  block_sum(v, partial);
}

/// The 16 / sizeof(T) elements of a 16-byte vector of T, given as the four 32-bit words it was
/// loaded as (element 0 in the low bits of v.x), widened to the accumulator type. Working on
/// whole words keeps two 16-bit elements in one register and widens them with one shift or mask
/// each; a Vec<__nv_bfloat16, 8> converted element by element is split into eight registers
/// first, which costs a kernel registers (ptxas' counts for rms_norm: bench/RESULTS.md).
template <class T>
__device__ __forceinline__ void unpack(const uint4& v, acc_t<T> (&out)[16 / sizeof(T)]) {
  static_assert(is_same<T, __nv_bfloat16>::value || is_same<T, __half>::value || is_same<T, float>::value ||
                    is_same<T, double>::value,
                "opforge::kernel::unpack: float, double, __half or __nv_bfloat16");
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (is_same<T, __nv_bfloat16>::value) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else if constexpr (is_same<T, __half>::value) {
      __half2 h;
      *reinterpret_cast<uint32_t*>(&h) = w[i];
      const float2 f = __half22float2(h);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    } else if constexpr (is_same<T, float>::value) {
      out[i] = __uint_as_float(w[i]);
    } else if (i % 2 == 0) {
      out[i / 2] = __hiloint2double(static_cast<int>(w[i + 1]), static_cast<int>(w[i]));
    }
  }
}

/// The inverse of unpack: rounds 16 / sizeof(T) accumulator values to T (round to nearest
/// even) and returns them as the four 32-bit words of one 16-byte vector.
template <class T>
__device__ __forceinline__ uint4 pack(const acc_t<T> (&in)[16 / sizeof(T)]) {
  static_assert(is_same<T, __nv_bfloat16>::value || is_same<T, __half>::value || is_same<T, float>::value ||
                    is_same<T, double>::value,
                "opforge::kernel::pack: float, double, __half or __nv_bfloat16");
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (is_same<T, __nv_bfloat16>::value) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else if constexpr (is_same<T, __half>::value) {
      const __half2 h = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else if constexpr (is_same<T, float>::value) {
      w[i] = __float_as_uint(in[i]);
    } else {
      w[i] = static_cast<uint32_t>(i % 2 ? __double2hiint(in[i / 2]) : __double2loint(in[i / 2]));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// N float8 values (N = 2, 4, 8 or 16) as memory holds them, element i in byte i of the words:
/// what pack_float8 returns and store_float8 writes as one N-byte access.
template <int N>
struct Float8Pack {
  uint32_t w[N >= 4 ? N / 4 : 1];
};

/// Rounds N floats (N = 2, 4, 8 or 16) to the float8 type T (__nv_fp8_e4m3 or __nv_fp8_e5m2) as
/// CUDA's conversions do (from_acc: nearest even, saturating to the largest finite value, NaN
/// kept), two per instruction: a kernel that converts before it may store (e.g. before
/// wait_for_value_checks) holds the N bytes in N / 4 registers instead of N floats.
template <class T, int N>
__device__ __forceinline__ Float8Pack<N> pack_float8(const float (&v)[N]) {
  static_assert(is_same<T, __nv_fp8_e4m3>::value || is_same<T, __nv_fp8_e5m2>::value,
                "opforge::kernel::pack_float8: __nv_fp8_e4m3 or __nv_fp8_e5m2");
  static_assert(N == 2 || N == 4 || N == 8 || N == 16, "opforge::kernel::pack_float8: N = 2, 4, 8 or 16");
  constexpr __nv_fp8_interpretation_t kind = is_same<T, __nv_fp8_e4m3>::value ? __NV_E4M3 : __NV_E5M2;
  Float8Pack<N> packed = {};
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {  // element 2i in the low byte, as memory holds it
    const uint32_t pair = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * i], v[2 * i + 1]), __NV_SATFINITE, kind);
    packed.w[i / 2] |= pair << (16 * (i % 2));
  }
  return packed;
}

/// Stores N packed float8 values of type T at `p` as one N-byte access (`p` aligned to N bytes).
template <class T, int N>
__device__ __forceinline__ void store_float8(T* p, const Float8Pack<N>& packed) {
  if constexpr (N == 16) {
    *reinterpret_cast<uint4*>(p) = make_uint4(packed.w[0], packed.w[1], packed.w[2], packed.w[3]);
  } else if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(packed.w[0], packed.w[1]);
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint32_t*>(p) = packed.w[0];
  } else {
    *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(packed.w[0]);
  }
}

/// Rounds N floats (N = 2, 4, 8 or 16) to the float8 type T (pack_float8) and stores them at `p`
/// as one N-byte access (`p` aligned to N bytes): what a kernel writing float8 from 16-byte
/// vectors of its input needs.
template <class T, int N>
__device__ __forceinline__ void store_float8(T* p, const float (&v)[N]) {
  store_float8<T, N>(p, pack_float8<T, N>(v));
}

/// x / s rounded to the nearest float (IEEE division, bit for bit), for many x and one s, in
/// three instructions instead of a division's ten-odd: q = x * r with r = 1 / s rounded once,
/// then q + r * (x - q * s) in two fused multiply-adds. By Markstein's theorem (P. Markstein,
/// "Computation of elementary functions on the IBM RISC System/6000 processor", IBM J. Res.
/// Dev. 34(1), 1990; J.-M. Muller et al., Handbook of Floating-Point Arithmetic, on division
/// with an FMA) this is the correctly rounded quotient when r is 1 / s correctly rounded, q is
/// within an ulp, and nothing overflows or underflows; where that may not hold (s or r not a
/// normal float, |x| < 2^-100 or zero, x / s overflowing, x infinite or NaN) it divides.
/// tests/python/test_float8.py compares it bit for bit with division over every bfloat16 and
/// float16 x and random float32 x, each with 233 divisors (powers of two and their neighbours,
/// random, both signs, and those the fast form leaves to division). r is computed where the
/// Divider is constructed and never hoisted above it (asm volatile): a kernel that constructs
/// it after issuing its loads keeps those loads first.
struct Divider {
  float s, r;
  bool fast;
  __device__ __forceinline__ explicit Divider(float scale) : s(scale) {
    asm volatile("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(scale));
    fast = normal(s) & normal(r);
  }
  /// x / s.
  __device__ __forceinline__ float operator()(float x) const {
    const float q = __fmul_rn(x, r);
    if (!(fast && usable(x, q))) return __fdiv_rn(x, s);
    return __fmaf_rn(__fmaf_rn(-q, s, x), r, q);
  }
  /// Divides each of the N values by s in place: one test (and one branch) for all of them.
  template <int N>
  __device__ __forceinline__ void operator()(float (&v)[N]) const {
    float q[N];
    bool ok = fast;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      q[j] = __fmul_rn(v[j], r);
      ok = ok & usable(v[j], q[j]);
    }
    if (ok) {
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] = __fmaf_rn(__fmaf_rn(-q[j], s, v[j]), r, q[j]);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] = __fdiv_rn(v[j], s);
    }
  }

 private:
  static __device__ __forceinline__ bool normal(float x) {
    return (fabsf(x) >= 1.17549435e-38f) & (fabsf(x) <= 3.40282347e38f);  // FLT_MIN, FLT_MAX; NaN fails
  }
  static __device__ __forceinline__ bool usable(float x, float q) {  // no underflow in x - q s, q finite
    return (fabsf(x) >= 0x1p-100f) & (fabsf(q) <= 3.40282347e38f);
  }
};

/// Loads the N elements of W at `p` into accumulator values of type A (a wider or equal type,
/// e.g. float weights beside 16-bit activations): as 16-byte loads when they fill whole vectors
/// of W, for which `p` must be 16-byte aligned (no test in the loop, so a caller's unrolled
/// loop can issue every load at once), else one element at a time.
template <class W, class A, int N>
__device__ __forceinline__ void load_widened(const W* p, A (&out)[N]) {
  constexpr int kWidth = 16 / sizeof(W);
  if constexpr (N % kWidth == 0 && is_same<A, acc_t<W>>::value) {
#pragma unroll
    for (int k = 0; k < N / kWidth; ++k) {
      A part[kWidth];
      unpack<W>(reinterpret_cast<const uint4*>(p)[k], part);
#pragma unroll
      for (int i = 0; i < kWidth; ++i) out[k * kWidth + i] = part[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = static_cast<A>(to_acc(p[i]));
  }
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
  /// The fewest threads, a multiple of 32 and at most `max_threads`, for which a row of `cols`
  /// elements fits(), for a host choosing a block size; 0 if no such block size exists.
  __host__ __device__ static int threads_for(int64_t cols, int max_threads) {
    if (cols % kWidth != 0) return 0;
    const int64_t per_warp = int64_t{kMaxVectors} * 32;
    const int64_t threads = (cols / kWidth + per_warp - 1) / per_warp * 32;
    return threads <= max_threads ? static_cast<int>(threads < 32 ? 32 : threads) : 0;
  }
  /// Whether this thread's k-th vector exists in a row of `cols` elements.
  __device__ static bool has(int k, int64_t cols) { return threadIdx.x + int64_t{k} * blockDim.x < cols / kWidth; }
  /// Element offset (within the row) of this thread's k-th vector.
  __device__ static int64_t offset(int k) { return (threadIdx.x + int64_t{k} * blockDim.x) * kWidth; }
  /// Loads this thread's vectors of the row at `row` (`cols` elements, 16-byte aligned) as raw
  /// words for unpack, every load issued before any value is used (a load followed by its arithmetic
  /// before the next load keeps one load in flight per thread, well below copy bandwidth:
  /// bench/RESULTS.md). Vectors past the row's end read as zeros.
  __device__ static void load_words(const T* row, int64_t cols, uint4 (&out)[kMaxVectors]) {
#pragma unroll
    for (int k = 0; k < kMaxVectors; ++k)
      out[k] = has(k, cols) ? *reinterpret_cast<const uint4*>(row + offset(k)) : make_uint4(0, 0, 0, 0);
  }
  /// Loads the 16 bytes at `p` (aligned) as kWidth accumulator values.
  __device__ static void load(const T* p, A (&out)[kWidth]) { unpack<T>(*reinterpret_cast<const uint4*>(p), out); }
  /// Rounds kWidth accumulator values to T and stores them as one 16-byte access at `p`.
  __device__ static void store(T* p, const A (&in)[kWidth]) { *reinterpret_cast<uint4*>(p) = pack<T>(in); }
  /// 16-byte words of one vector of accumulator values.
  static constexpr int kSumWords = kWidth * sizeof(A) / 16;
  /// Bytes of shared memory that hold a `threads`-thread block's per-thread sums of kMaxVectors
  /// vectors (add_sums, read_sums): per-column sums over rows that would cost registers.
  __host__ __device__ static constexpr size_t sum_bytes(int threads) {
    return size_t{kMaxVectors} * kSumWords * 16 * static_cast<size_t>(threads);
  }
  /// Word j of this thread's vector k of sums at `sums`: word (k * kSumWords + j) * blockDim.x +
  /// threadIdx.x, so that a warp's 16-byte accesses cover 512 contiguous bytes (no bank
  /// conflicts; sums in column order put a lane's words 32 bytes apart for 16-bit T, two
  /// wavefronts for each quarter-warp).
  __device__ static uint4& sum_word(uint4* sums, int k, int j) {
    return sums[(k * kSumWords + j) * blockDim.x + threadIdx.x];
  }
  /// Sets this thread's sums to zero (only this thread reads or writes them: no barrier).
  __device__ static void zero_sums(uint4* sums) {
#pragma unroll
    for (int k = 0; k < kMaxVectors; ++k)
#pragma unroll
      for (int j = 0; j < kSumWords; ++j) sum_word(sums, k, j) = make_uint4(0, 0, 0, 0);
  }
  /// Adds kWidth accumulator values to this thread's vector k of sums.
  __device__ static void add_sums(uint4* sums, int k, const A (&in)[kWidth]) {
    constexpr int kPer = 16 / sizeof(A);
#pragma unroll
    for (int j = 0; j < kSumWords; ++j) {
      uint4 word = sum_word(sums, k, j);
      A* v = reinterpret_cast<A*>(&word);
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[i] += in[j * kPer + i];
      sum_word(sums, k, j) = word;
    }
  }
  /// This thread's vector k of sums.
  __device__ static void read_sums(uint4* sums, int k, A (&out)[kWidth]) {
    constexpr int kPer = 16 / sizeof(A);
#pragma unroll
    for (int j = 0; j < kSumWords; ++j) {
      const uint4 word = sum_word(sums, k, j);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[j * kPer + i] = reinterpret_cast<const A*>(&word)[i];
    }
  }
};

}  // namespace opforge::kernel
