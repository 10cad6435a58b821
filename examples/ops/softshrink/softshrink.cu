// softshrink CUDA kernel: one pass, 16-byte vector loads and stores, 64-bit indexing.
#include <opforge/cuda.h>

namespace {

template <class T>
__device__ __forceinline__ T shrink(T x, opforge::cuda::acc_t<T> lambd) {
  const auto v = opforge::cuda::to_acc(x);
  const auto r = v != v ? v : v > lambd ? v - lambd : v < -lambd ? v + lambd : decltype(v)(0);
  return opforge::cuda::from_acc<T>(r);
}

// Elements [0, vec_items * N) as vectors of N, then the tail one by one.
template <class T, int N>
__global__ void softshrink_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t vec_items,
                                  opforge::cuda::acc_t<T> lambd) {
  using V = opforge::cuda::Vec<T, N>;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t start = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (int64_t i = start; i < vec_items; i += stride) {
    V v = reinterpret_cast<const V*>(x)[i];
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = shrink(v.v[k], lambd);
    reinterpret_cast<V*>(y)[i] = v;
  }
  for (int64_t i = vec_items * N + start; i < n; i += stride) y[i] = shrink(x[i], lambd);
}

}  // namespace

void softshrink_cuda(const opforge::Context& ctx, opforge::Tensor x, double lambd, opforge::MutableTensor y) {
  opforge::cuda::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    constexpr int N = 16 / sizeof(T);
    const int64_t n = x.numel();
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const int64_t vec_items = opforge::cuda::aligned(16, in, out) ? n / N : 0;
    constexpr int kThreads = 256;
    const unsigned grid = opforge::cuda::grid_for(std::max<int64_t>(vec_items, n - vec_items * N), kThreads);
    softshrink_kernel<T, N><<<grid, kThreads, 0, opforge::cuda::stream(ctx)>>>(
        in, out, n, vec_items, static_cast<opforge::cuda::acc_t<T>>(lambd));
  });
  opforge::cuda::check_launch("softshrink_kernel");
}
