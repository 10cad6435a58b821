// rms_norm, compiled at run time: one block per row (opforge::rows("x")), float accumulation.
#include <opforge/kernel.cuh>

template <class T>
__global__ void rms_norm(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y, int64_t rows,
                         int64_t cols, double eps) {
  using opforge::kernel::to_acc;
  const T* in = x + static_cast<int64_t>(blockIdx.x) * cols;
  T* out = y + static_cast<int64_t>(blockIdx.x) * cols;
  float sumsq = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_acc(in[c]);
    sumsq += v * v;
  }
  const float scale = rsqrtf(opforge::kernel::block_sum(sumsq) / static_cast<float>(cols) + static_cast<float>(eps));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[c] = opforge::kernel::from_acc<T>(static_cast<opforge::kernel::acc_t<T>>(to_acc(in[c]) * scale * to_acc(weight[c])));
}
