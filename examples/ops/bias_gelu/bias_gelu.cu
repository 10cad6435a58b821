// bias_gelu CUDA kernel: y = gelu(x + bias[col]), one pass, 16-byte vectors when rows allow.
#include <opforge/cuda.h>

namespace {

template <class T>
__device__ __forceinline__ T bias_gelu(T x, T b) {
  const float v = opforge::cuda::to_acc(x) + opforge::cuda::to_acc(b);
  return opforge::cuda::from_acc<T>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
}

// Vectors of N elements never straddle a row (cols % N == 0 on the vector path; N = 1 else).
template <class T, int N>
__global__ void bias_gelu_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                 int64_t vec_items, int64_t vec_cols) {
  using V = opforge::cuda::Vec<T, N>;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < vec_items; i += stride) {
    V v = reinterpret_cast<const V*>(x)[i];
    const V b = reinterpret_cast<const V*>(bias)[i % vec_cols];
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = bias_gelu(v.v[k], b.v[k]);
    reinterpret_cast<V*>(y)[i] = v;
  }
}

}  // namespace

void bias_gelu_cuda(const opforge::Context& ctx, opforge::Tensor x, opforge::Tensor bias, opforge::MutableTensor y) {
  constexpr opforge::DtypeSet kTypes = opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16;
  opforge::cuda::visit_dtype<kTypes>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    constexpr int N = 16 / sizeof(T);
    constexpr int kThreads = 256;
    const int64_t n = x.numel(), cols = bias.numel();
    const T* in = x.data<T>();
    const T* b = bias.data<T>();
    T* out = y.data<T>();
    if (cols % N == 0 && opforge::cuda::aligned(16, in, b, out)) {
      bias_gelu_kernel<T, N><<<opforge::cuda::grid_for(n / N, kThreads), kThreads, 0, opforge::cuda::stream(ctx)>>>(
          in, b, out, n / N, cols / N);
    } else {
      bias_gelu_kernel<T, 1><<<opforge::cuda::grid_for(n, kThreads), kThreads, 0, opforge::cuda::stream(ctx)>>>(
          in, b, out, n, cols);
    }
  });
  opforge::cuda::check_launch("bias_gelu_kernel");
}
