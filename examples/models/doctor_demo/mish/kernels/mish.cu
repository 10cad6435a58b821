// demo::mish's CUDA kernels, forward and backward, compiled at run time by opforge (NVRTC) for the
// GPU in use; an edit is picked up on the next run (or opforge.reload()). Launched by
// opforge::elementwise with 16 bytes per thread: thread t handles elements [t * N, t * N + N),
// N = 16 / sizeof(T).
#include <opforge/kernel.cuh>

/// softplus(v) = log1p(exp(v)), taken as v above 20 where exp would overflow (as torch's).
__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

template <class T>
__global__ void mish(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  constexpr int N = 16 / sizeof(T);
  const int64_t first = opforge::kernel::global_index() * N;
  for (int64_t i = first; i < first + N && i < n; ++i) {
    const float v = opforge::kernel::to_acc(x[i]);
    y[i] = opforge::kernel::from_acc<T>(v * tanhf(softplus(v)));
  }
}

/// grad_x = grad_y * (tanh(sp) + x * sigmoid(x) * (1 - tanh(sp)^2)), sp = softplus(x).
template <class T>
__global__ void mish_backward(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x,
                              int64_t n) {
  constexpr int N = 16 / sizeof(T);
  const int64_t first = opforge::kernel::global_index() * N;
  for (int64_t i = first; i < first + N && i < n; ++i) {
    const float v = opforge::kernel::to_acc(x[i]);
    const float t = tanhf(softplus(v)), sigmoid = 1.0f / (1.0f + expf(-v));
    grad_x[i] = opforge::kernel::from_acc<T>(opforge::kernel::to_acc(grad_y[i]) * (t + v * sigmoid * (1.0f - t * t)));
  }
}
