// demo::mish's CUDA kernel, compiled at run time by opforge (NVRTC) for the GPU in use; an edit
// is picked up on the next run (or opforge.reload()). Launched by opforge::elementwise("y") with
// 16 bytes per thread: thread t handles elements [t * N, t * N + N), N = 16 / sizeof(T).
#include <opforge/kernel.cuh>

template <class T>
__global__ void mish(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  constexpr int N = 16 / sizeof(T);
  const int64_t first = opforge::kernel::global_index() * N;
  for (int64_t i = first; i < first + N && i < n; ++i) {
    const float v = opforge::kernel::to_acc(x[i]);
    // softplus(v) = log1p(exp(v)), taken as v above 20 where exp would overflow (as torch's)
    const float softplus = v > 20.0f ? v : log1pf(expf(v));
    y[i] = opforge::kernel::from_acc<T>(v * tanhf(softplus));
  }
}
