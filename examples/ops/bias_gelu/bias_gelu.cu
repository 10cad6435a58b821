// bias_gelu CUDA kernel: y = gelu(x + bias[col]), one pass, two 16-byte vectors per thread when
// rows allow.
#include <opforge/cuda.h>

#include <climits>
#include <cstdint>

namespace {

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// gelu(v) = v * Phi(v) for 16-bit outputs, with the normal tail
/// 1 - Phi(|v|) = erfc(|v| / sqrt 2) / 2 = t * poly(t) * exp(-v^2 / 2), t = 1 / (1 + p |v| / sqrt 2)
/// (Abramowitz & Stegun, Handbook of Mathematical Functions, 1964, formula 7.1.26:
/// |error of erfc| <= 1.5e-7; the factor 1/2 is folded into the coefficients). About 17
/// instructions an element against about 26 with erff, which made the 16-bit kernel bound by
/// instruction issue (bench/RESULTS.md). Error against the exact GELU, computed in double:
/// at most 2.2e-7 absolute (|v| * 7.5e-8); relative, below 0.01% for v > -3 but growing in the
/// far negative tail, where the outputs are tiny: 0.05% at v = -4 (|y| = 1.3e-4), 0.16% at -5
/// (1.4e-6), 1% at -8 (5e-15). The approximate exp2 flushes results below 2^-126 to zero.
__device__ __forceinline__ float gelu_16bit(float v) {
  constexpr float kP = 0.3275911f * 0.70710678118654752f;  // p / sqrt 2
  constexpr float kExp2 = -0.72134752044448170f;           // -log2(e) / 2: exp(-v^2 / 2) = 2^(kExp2 v^2)
  const float t = rcp_approx(fmaf(kP, fabsf(v), 1.0f));
  const float poly =
      t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 0.5307027145f, -0.7265760135f), 0.7107068705f), -0.142248368f), 0.127414796f);
  const float tail = poly * exp2_approx(v * v * kExp2);  // 1 - Phi(|v|)
  return v * (v < 0.0f ? tail : 1.0f - tail);
}

/// gelu(v) = v * Phi(v) in float: erff for float32 outputs, gelu_16bit for 16-bit ones.
template <class T>
__device__ __forceinline__ float gelu(float v) {
  if constexpr (sizeof(T) == 2) return gelu_16bit(v);
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

/// Quotients by a divisor fixed for the launch with a multiply-high and a shift instead of a
/// division (Granlund & Montgomery, "Division by Invariant Integers using Multiplication",
/// PLDI 1994; the form of CUTLASS's FastDivmod). Exact for dividends below 2^31.
struct FastDivisor {
  uint32_t divisor = 1, multiplier = 0, shift = 0;
  explicit FastDivisor(uint32_t d) : divisor(d) {
    if (d == 1) return;
    const uint32_t ceil_log2 = 32 - __builtin_clz(d - 1);
    const uint32_t p = 31 + ceil_log2;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << p) + d - 1) / d);
    shift = p - 32;
  }
  __device__ __forceinline__ uint32_t quotient(uint32_t n) const {
    return divisor == 1 ? n : __umulhi(n, multiplier) >> shift;
  }
};

/// Elements each thread loads before computing any: two 16-byte vectors (N = 16 / sizeof(T)
/// elements each), or 8 single elements on the scalar path (N = 1), in blocks of 128 threads.
/// Measured at 4 GiB on the H200 (bench/RESULTS.md): bfloat16 with 1 and 2 vectors per thread,
/// 0.91 and 0.98 x copy; bench_elementwise.py with 256 and 128 threads a block, float32 0.976
/// and 0.995 x copy, bfloat16 0.986 and 1.007 (bench/sweep_bias_gelu.py: bfloat16 0.955 and
/// 1.000 in one process; its float32 figures were skewed by the order of timing, see RESULTS).
template <int N>
constexpr int kPerThread = N > 1 ? 2 : 8;
constexpr int kThreads = 128;

// Vectors of N elements never straddle a row (cols % N == 0 on the vector path; N = 1 else).
// Block b handles vectors [b * kThreads * kPerThread<N>, ...), thread t the vectors
// t, t + kThreads, ... of them (coalesced). Vectors are held as the four 32-bit words they are
// loaded as (opforge::kernel::unpack/pack), which keeps 16-bit elements two to a register.
// kFast: vec_items < 2^31, the column comes from FastDivisor; else from a 64-bit remainder.
template <class T, int N, bool kFast>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int64_t vec_items,
                     int64_t vec_cols, FastDivisor cols_divisor) {
  using V = typename opforge::kernel::conditional<N == 1, T, uint4>::type;
  const int64_t first = int64_t{blockIdx.x} * kThreads * kPerThread<N> + threadIdx.x;
  V v[kPerThread<N>], b[kPerThread<N>];
#pragma unroll
  for (int k = 0; k < kPerThread<N>; ++k) {
    const int64_t i = first + int64_t{k} * kThreads;
    if (i >= vec_items) break;
    const int64_t col = kFast ? i - int64_t{cols_divisor.quotient(static_cast<uint32_t>(i))} * vec_cols : i % vec_cols;
    v[k] = reinterpret_cast<const V*>(x)[i];
    b[k] = reinterpret_cast<const V*>(bias)[col];
  }
#pragma unroll
  for (int k = 0; k < kPerThread<N>; ++k) {
    const int64_t i = first + int64_t{k} * kThreads;
    if (i >= vec_items) break;
    if constexpr (N == 1) {
      y[i] = opforge::cuda::from_acc<T>(gelu<T>(opforge::cuda::to_acc(v[k]) + opforge::cuda::to_acc(b[k])));
    } else {
      float xs[N], bs[N];
      opforge::kernel::unpack<T>(v[k], xs);
      opforge::kernel::unpack<T>(b[k], bs);
#pragma unroll
      for (int e = 0; e < N; ++e) xs[e] = gelu<T>(xs[e] + bs[e]);
      reinterpret_cast<uint4*>(y)[i] = opforge::kernel::pack<T>(xs);
    }
  }
}

template <class T, int N>
void launch(const T* in, const T* b, T* out, int64_t items, int64_t cols, cudaStream_t stream) {
  if (items == 0) return;
  constexpr int64_t kPerBlock = int64_t{kThreads} * kPerThread<N>;
  const int64_t blocks = (items + kPerBlock - 1) / kPerBlock;
  OPFORGE_CHECK(blocks <= INT_MAX, "x has ", items * N, " elements, more than one launch covers");
  if (items < (int64_t{1} << 31)) {
    bias_gelu_kernel<T, N, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        in, b, out, items, cols, FastDivisor(static_cast<uint32_t>(cols)));
  } else {
    bias_gelu_kernel<T, N, false>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(in, b, out, items, cols, FastDivisor(1));
  }
}

}  // namespace

void bias_gelu_cuda(const opforge::Context& ctx, opforge::Tensor x, opforge::Tensor bias, opforge::MutableTensor y) {
  constexpr opforge::DtypeSet kTypes = opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16;
  opforge::cuda::visit_dtype<kTypes>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    constexpr int N = 16 / sizeof(T);
    const int64_t n = x.numel(), cols = bias.numel();
    const T* in = x.data<T>();
    const T* b = bias.data<T>();
    T* out = y.data<T>();
    if (cols % N == 0 && opforge::cuda::aligned(16, in, b, out)) {
      launch<T, N>(in, b, out, n / N, cols / N, opforge::cuda::stream(ctx));
    } else {
      launch<T, 1>(in, b, out, n, cols, opforge::cuda::stream(ctx));
    }
  });
  opforge::cuda::check_launch("bias_gelu_kernel");
}
