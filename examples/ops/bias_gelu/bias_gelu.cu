// bias_gelu CUDA kernel: y = gelu(x + bias[col]), one pass, one 16-byte vector per thread when
// rows allow.
#include <opforge/cuda.h>

#include <algorithm>
#include <climits>
#include <cstdint>

namespace {

/// erf(x) to |error| <= 1.5e-7 with one reciprocal and one exponential (Abramowitz & Stegun,
/// Handbook of Mathematical Functions, 1964, formula 7.1.26). Used for 16-bit outputs, whose
/// rounding (2^-11 relative or coarser) dwarfs that error; erff costs about twice the
/// instructions, which made the 16-bit kernel compute-bound (bench/RESULTS.md).
__device__ __forceinline__ float erf_as(float x) {
  const float t = __fdividef(1.0f, fmaf(0.3275911f, fabsf(x), 1.0f));
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f),
                              0.254829592f);
  return copysignf(1.0f - poly * __expf(-x * x), x);
}

template <class T>
__device__ __forceinline__ T bias_gelu(T x, T b) {
  const float v = opforge::cuda::to_acc(x) + opforge::cuda::to_acc(b);
  const float u = v * 0.70710678118654752f;
  const float erf_u = sizeof(T) == 2 ? erf_as(u) : erff(u);
  return opforge::cuda::from_acc<T>(0.5f * v * (1.0f + erf_u));
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

// Vectors of N elements never straddle a row (cols % N == 0 on the vector path; N = 1 else).
// kFast: vec_items < 2^31, the column comes from FastDivisor; else from a 64-bit remainder.
template <class T, int N, bool kFast>
__global__ void bias_gelu_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                 int64_t vec_items, int64_t vec_cols, FastDivisor cols_divisor) {
  using V = opforge::cuda::Vec<T, N>;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < vec_items; i += stride) {
    const int64_t col = kFast ? i - int64_t{cols_divisor.quotient(static_cast<uint32_t>(i))} * vec_cols : i % vec_cols;
    const V b = reinterpret_cast<const V*>(bias)[col];
    V v = reinterpret_cast<const V*>(x)[i];
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = bias_gelu(v.v[k], b.v[k]);
    reinterpret_cast<V*>(y)[i] = v;
  }
}

template <class T, int N>
void launch(const T* in, const T* b, T* out, int64_t items, int64_t cols, cudaStream_t stream) {
  // One vector per thread: a grid-stride loop over a grid capped at the resident blocks keeps
  // too few loads in flight (0.92 x copy against 1.0 for one vector per thread, bench/RESULTS.md).
  constexpr int kThreads = 256;
  if (items == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, INT_MAX));
  if (items < (int64_t{1} << 31)) {
    bias_gelu_kernel<T, N, true><<<blocks, kThreads, 0, stream>>>(in, b, out, items, cols,
                                                                   FastDivisor(static_cast<uint32_t>(cols)));
  } else {
    bias_gelu_kernel<T, N, false><<<blocks, kThreads, 0, stream>>>(in, b, out, items, cols, FastDivisor(1));
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
