// rms_norm, compiled at run time: one block per row (opforge::rows("x")), accumulation in
// float (double for double); the weight W is x's type T or float. Rows that fit are read once
// into registers with 16-byte loads, all issued before the first is used; others take a plain
// loop that reads the row twice.
#include <opforge/kernel.cuh>

template <class T, class W>
__global__ void __launch_bounds__(1024) rms_norm(const T* __restrict__ x, const W* __restrict__ weight,
                                                 T* __restrict__ y, int64_t rows, int64_t cols, double eps) {
  using opforge::kernel::to_acc;
  using A = opforge::kernel::acc_t<T>;
  using Row = opforge::kernel::RowRegisters<T>;
  const T* in = x + static_cast<int64_t>(blockIdx.x) * cols;
  T* out = y + static_cast<int64_t>(blockIdx.x) * cols;
  if (Row::fits(cols) && opforge::kernel::aligned(x, 16) && opforge::kernel::aligned(weight, 16) &&
      opforge::kernel::aligned(y, 16)) {
    uint4 row[Row::kVectors];  // the row as loaded: 16-bit elements two to a register
    Row::load_words(in, cols, row);
    // A weight wider than x (float beside 16-bit x) is loaded with the row, before the
    // reduction, so its loads overlap the row's instead of following the block's barrier.
    constexpr bool kEarly = !opforge::kernel::is_same<T, W>::value;
    A early[kEarly ? Row::kVectors : 1][Row::kWidth];
    if constexpr (kEarly) {
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k)
        if (Row::has(k, cols)) opforge::kernel::load_widened(weight + Row::offset(k), early[k]);
    }
    A sumsq = 0;
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      A v[Row::kWidth];
      opforge::kernel::unpack<T>(row[k], v);
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) sumsq += v[i] * v[i];
    }
    const A scale = A(1) / sqrt(opforge::kernel::block_sum(sumsq) / static_cast<A>(cols) + static_cast<A>(eps));
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      if (!Row::has(k, cols)) continue;
      A v[Row::kWidth], w[Row::kWidth];
      opforge::kernel::unpack<T>(row[k], v);
      if constexpr (kEarly) {
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) w[i] = early[k][i];
      } else {
        Row::load(weight + Row::offset(k), w);
      }
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) w[i] *= v[i] * scale;
      Row::store(out + Row::offset(k), w);
    }
    return;
  }
  A sumsq = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const A v = to_acc(in[c]);
    sumsq += v * v;
  }
  const A scale = A(1) / sqrt(opforge::kernel::block_sum(sumsq) / static_cast<A>(cols) + static_cast<A>(eps));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[c] = opforge::kernel::from_acc<T>(to_acc(in[c]) * scale * to_acc(weight[c]));
}
