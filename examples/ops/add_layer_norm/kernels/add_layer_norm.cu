// add_layer_norm, compiled at run time: one block per row (opforge::rows("x")); mean, then
// variance around the mean (two passes, float accumulation), then the normalised output.
#include <opforge/kernel.cuh>

template <class T>
__global__ void add_layer_norm(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ weight,
                               const T* __restrict__ bias, T* __restrict__ y, int64_t rows, int64_t cols, double eps) {
  using opforge::kernel::to_acc;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  const float n = static_cast<float>(cols);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += to_acc(x[base + c]) + to_acc(residual[base + c]);
  const float mean = opforge::kernel::block_sum(sum) / n;
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = to_acc(x[base + c]) + to_acc(residual[base + c]) - mean;
    sq += d * d;
  }
  const float inv = rsqrtf(opforge::kernel::block_sum(sq) / n + static_cast<float>(eps));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float h = to_acc(x[base + c]) + to_acc(residual[base + c]);
    y[base + c] = opforge::kernel::from_acc<T>(
        static_cast<opforge::kernel::acc_t<T>>((h - mean) * inv * to_acc(weight[c]) + to_acc(bias[c])));
  }
}
