// add_layer_norm, compiled at run time: one block per row (opforge::rows("x")), accumulation in
// float (double for double). h = x + residual; mean, then the variance around the mean (two
// passes over h, exact rather than E[h^2] - mean^2), then the normalised output. Rows that fit
// are held in registers (read once, 16-byte loads issued before any is used); others re-read the row.
#include <opforge/kernel.cuh>

template <class T>
__global__ void add_layer_norm(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ weight,
                               const T* __restrict__ bias, T* __restrict__ y, int64_t rows, int64_t cols, double eps) {
  using opforge::kernel::aligned;
  using opforge::kernel::block_sum;
  using opforge::kernel::to_acc;
  using A = opforge::kernel::acc_t<T>;
  using Row = opforge::kernel::RowRegisters<T>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * cols;
  const A n = static_cast<A>(cols);
  if (Row::fits(cols) && aligned(x, 16) && aligned(residual, 16) && aligned(weight, 16) && aligned(bias, 16) &&
      aligned(y, 16)) {
    Row h;
    {
      uint4 xw[Row::kVectors], rw[Row::kVectors];  // both rows' loads in flight before any arithmetic
      Row::load_words(x + base, cols, xw);
      Row::load_words(residual + base, cols, rw);
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k) {
        A r[Row::kWidth];
        opforge::kernel::unpack<T>(xw[k], h.v[k]);
        opforge::kernel::unpack<T>(rw[k], r);
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) h.v[k][i] += r[i];
      }
    }
    A sum = 0;
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) sum += h.v[k][i];  // zeros past the row's end
    }
    const A mean = block_sum(sum) / n;
    A sq = 0;
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      if (!Row::has(k, cols)) continue;
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) sq += (h.v[k][i] - mean) * (h.v[k][i] - mean);
    }
    const A inv = A(1) / sqrt(block_sum(sq) / n + static_cast<A>(eps));
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      if (!Row::has(k, cols)) continue;
      A w[Row::kWidth], b[Row::kWidth];
      Row::load(weight + Row::offset(k), w);
      Row::load(bias + Row::offset(k), b);
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) w[i] = (h.v[k][i] - mean) * inv * w[i] + b[i];
      Row::store(y + base + Row::offset(k), w);
    }
    return;
  }
  A sum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += to_acc(x[base + c]) + to_acc(residual[base + c]);
  const A mean = block_sum(sum) / n;
  A sq = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A d = to_acc(x[base + c]) + to_acc(residual[base + c]) - mean;
    sq += d * d;
  }
  const A inv = A(1) / sqrt(block_sum(sq) / n + static_cast<A>(eps));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A h = to_acc(x[base + c]) + to_acc(residual[base + c]);
    y[base + c] = opforge::kernel::from_acc<T>((h - mean) * inv * to_acc(weight[c]) + to_acc(bias[c]));
  }
}
