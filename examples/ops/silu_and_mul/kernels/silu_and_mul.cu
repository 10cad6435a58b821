// silu_and_mul, compiled at run time: thread i computes the 16 / sizeof(T) outputs from element
// i * width of y on, reading the gate and up halves of their row of x with 16-byte loads when d
// is a whole number of vectors (every row then starts aligned), element by element otherwise.
// silu(g) = g / (1 + e^-g) in float.
#include <opforge/kernel.cuh>

template <class T>
__device__ __forceinline__ float silu_mul(float g, float u) {
  return g / (1.0f + __expf(-g)) * u;
}

template <class T>
__device__ __forceinline__ void silu_and_mul_at(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t d) {
  constexpr int kWidth = 16 / sizeof(T);
  using A = opforge::kernel::acc_t<T>;
  const int64_t first = opforge::kernel::global_index() * kWidth;
  if (first >= n) return;
  const int64_t row = first / d, col = first % d;
  const T* gate = x + row * 2 * d + col;
  if (d % kWidth == 0) {
    A g[kWidth], u[kWidth];
    opforge::kernel::unpack<T>(*reinterpret_cast<const uint4*>(gate), g);
    opforge::kernel::unpack<T>(*reinterpret_cast<const uint4*>(gate + d), u);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) g[k] = silu_mul<T>(g[k], u[k]);
    *reinterpret_cast<uint4*>(y + first) = opforge::kernel::pack<T>(g);
    return;
  }
  for (int64_t i = first; i < first + kWidth && i < n; ++i) {
    const int64_t r = i / d, c = i % d;
    const float g = opforge::kernel::to_acc(x[r * 2 * d + c]), u = opforge::kernel::to_acc(x[r * 2 * d + d + c]);
    y[i] = opforge::kernel::from_acc<T>(silu_mul<T>(g, u));
  }
}

template <class T>
__global__ void silu_and_mul(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t d) {
  silu_and_mul_at(x, y, n, d);
}

// vLLM's out-first form (examples::silu_and_mul_out): the written buffer comes first.
template <class T>
__global__ void silu_and_mul_out(T* __restrict__ out, const T* __restrict__ input, int64_t n, int64_t d) {
  silu_and_mul_at(input, out, n, d);
}
