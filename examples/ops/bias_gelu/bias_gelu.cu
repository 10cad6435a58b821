// bias_gelu CUDA kernel: y = gelu(x + bias[col]), one pass, two 16-byte vectors per thread when
// rows allow.
#include <opforge/cuda.h>

#include <climits>
#include <cstdint>

#include "gelu.cuh"

namespace {

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
/// elements each), or 8 single elements on the scalar path (N = 1), in blocks of 128 threads: the
/// fastest of the vector counts and block sizes bench/bench_elementwise.py and
/// bench/sweep_bias_gelu.py compared on the H200 (bench/RESULTS.md).
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
      y[i] = opforge::cuda::from_acc<T>(bias_gelu::gelu<T>(opforge::cuda::to_acc(v[k]) + opforge::cuda::to_acc(b[k])));
    } else {
      float xs[N], bs[N];
      opforge::kernel::unpack<T>(v[k], xs);
      opforge::kernel::unpack<T>(b[k], bs);
#pragma unroll
      for (int e = 0; e < N; ++e) xs[e] = bias_gelu::gelu<T>(xs[e] + bs[e]);
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
