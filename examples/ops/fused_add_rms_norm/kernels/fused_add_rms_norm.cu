// fused_add_rms_norm, compiled at run time: one block per row (opforge::rows("x")), accumulation
// in float (double for double). A row that fits is read once (x and residual, every 16-byte load
// issued before the first is used), the rounded sum written to residual and kept in registers
// for the norm, then x written: each element is read twice and written twice, the fewest bytes
// the op can move. Other rows take a plain loop that reads the residual back.
#include <opforge/kernel.cuh>

template <class T>
__global__ void fused_add_rms_norm(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                                   int64_t rows, int64_t cols, double eps) {
  using opforge::kernel::from_acc;
  using opforge::kernel::to_acc;
  using A = opforge::kernel::acc_t<T>;
  using Row = opforge::kernel::RowRegisters<T>;
  T* in = x + static_cast<int64_t>(blockIdx.x) * cols;
  T* res = residual + static_cast<int64_t>(blockIdx.x) * cols;
  if (Row::fits(cols) && opforge::kernel::aligned(x, 16) && opforge::kernel::aligned(residual, 16) &&
      opforge::kernel::aligned(weight, 16)) {
    uint4 a[Row::kVectors], b[Row::kVectors];
    Row::load_words(in, cols, a);
    Row::load_words(res, cols, b);
    A sumsq = 0;
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      A u[Row::kWidth], v[Row::kWidth];
      opforge::kernel::unpack<T>(a[k], u);
      opforge::kernel::unpack<T>(b[k], v);
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) u[i] += v[i];
      b[k] = opforge::kernel::pack<T>(u);  // the residual as stored, rounded to T
      opforge::kernel::unpack<T>(b[k], u);
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) sumsq += u[i] * u[i];
      if (Row::has(k, cols)) *reinterpret_cast<uint4*>(res + Row::offset(k)) = b[k];
    }
    const A scale = A(1) / sqrt(opforge::kernel::block_sum(sumsq) / static_cast<A>(cols) + static_cast<A>(eps));
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      if (!Row::has(k, cols)) continue;
      A v[Row::kWidth], w[Row::kWidth];
      opforge::kernel::unpack<T>(b[k], v);
      Row::load(weight + Row::offset(k), w);
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) w[i] *= v[i] * scale;
      Row::store(in + Row::offset(k), w);
    }
    return;
  }
  A sumsq = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T sum = from_acc<T>(to_acc(in[c]) + to_acc(res[c]));
    res[c] = sum;
    sumsq += to_acc(sum) * to_acc(sum);
  }
  const A scale = A(1) / sqrt(opforge::kernel::block_sum(sumsq) / static_cast<A>(cols) + static_cast<A>(eps));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)  // each thread reads back what it wrote
    in[c] = from_acc<T>(to_acc(res[c]) * scale * to_acc(weight[c]));
}
