// bias_gelu's backward on CUDA: grad_x = grad_y * gelu'(x + bias) elementwise, and grad_bias =
// the sum of grad_x over rows. Thread blocks tile the columns (blockIdx.x) and split the rows
// (blockIdx.y); each thread keeps its columns' share of grad_bias in registers over its rows and
// writes one row of per-block partial sums, which opforge::cuda::sum_partials adds up.
#include <opforge/cuda.h>

#include <algorithm>
#include <cstdint>

#include "gelu.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kRowsInFlight = 4;  // rows whose loads a thread issues before computing any

/// Columns are handled N at a time (N = 16 / sizeof(T) as one 16-byte vector, or N = 1):
/// thread j of the grid's x dimension owns columns [j N, j N + N) of every row it visits, rows
/// blockIdx.y, blockIdx.y + gridDim.y, ...
template <class T, int N>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ bias,
                              T* __restrict__ grad_x, float* __restrict__ partial, int64_t rows, int64_t cols) {
  using V = opforge::kernel::Vec<T, N>;
  const int64_t vec_cols = cols / N;
  const int64_t j = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (j >= vec_cols) return;
  float b[N], acc[N];
  const V bv = reinterpret_cast<const V*>(bias)[j];
#pragma unroll
  for (int e = 0; e < N; ++e) {
    b[e] = opforge::kernel::to_acc(bv.v[e]);
    acc[e] = 0.0f;
  }
  for (int64_t r0 = blockIdx.y; r0 < rows; r0 += int64_t{gridDim.y} * kRowsInFlight) {
    V xv[kRowsInFlight], gv[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      const int64_t r = r0 + int64_t{k} * gridDim.y;
      if (r < rows) {
        xv[k] = reinterpret_cast<const V*>(x)[r * vec_cols + j];
        gv[k] = reinterpret_cast<const V*>(grad_y)[r * vec_cols + j];
      }
    }
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      const int64_t r = r0 + int64_t{k} * gridDim.y;
      if (r >= rows) break;
      V out;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float d =
            opforge::kernel::to_acc(gv[k].v[e]) * bias_gelu::gelu_grad<T>(opforge::kernel::to_acc(xv[k].v[e]) + b[e]);
        acc[e] += d;
        out.v[e] = opforge::kernel::from_acc<T>(d);
      }
      reinterpret_cast<V*>(grad_x)[r * vec_cols + j] = out;
    }
  }
  opforge::cuda::allow_dependent_launch();  // sum_partials' blocks may start; they wait for these writes
  float* part = partial + int64_t{blockIdx.y} * cols + j * N;
#pragma unroll
  for (int e = 0; e < N; ++e) part[e] = acc[e];
}

template <class T, int N>
void launch(const opforge::Context& ctx, const T* g, const T* in, const T* b, T* gx, T* gb, int64_t rows,
            int64_t cols) {
  const int64_t col_blocks = (cols / N + kThreads - 1) / kThreads;
  OPFORGE_CHECK(col_blocks <= 0x7fffffff, "bias has ", cols, " elements, more than one launch covers");
  auto kernel = bias_gelu_backward_kernel<T, N>;
  // As many row slices as fill the device once the column tiles are counted (grid.y <= 65535).
  const int64_t resident = opforge::cuda::resident_blocks(kernel, kThreads);
  const int64_t row_blocks = std::clamp<int64_t>(resident / std::max<int64_t>(col_blocks, 1), 1, 65535);
  const unsigned gy = static_cast<unsigned>(std::min(row_blocks, std::max<int64_t>(rows, 1)));
  auto* partial = static_cast<float*>(ctx.allocate(sizeof(float) * gy * cols));
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  if (rows > 0 && cols > 0) {
    kernel<<<dim3(static_cast<unsigned>(col_blocks), gy), kThreads, 0, stream>>>(g, in, b, gx, partial, rows, cols);
    opforge::cuda::check_launch("bias_gelu_backward_kernel");
    opforge::cuda::sum_partials(partial, int64_t{gy}, cols, gb, stream);
  } else {
    opforge::cuda::sum_partials(partial, int64_t{0}, cols, gb, stream);  // no rows: grad_bias is zeros
  }
}

}  // namespace

void bias_gelu_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_y, opforge::Tensor x,
                             opforge::Tensor bias, opforge::MutableTensor grad_x, opforge::MutableTensor grad_bias) {
  constexpr opforge::DtypeSet kTypes = opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16;
  opforge::cuda::visit_dtype<kTypes>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    constexpr int N = 16 / sizeof(T);
    const int64_t cols = bias.numel(), rows = cols ? x.numel() / cols : 0;
    const T *g = grad_y.data<T>(), *in = x.data<T>(), *b = bias.data<T>();
    T *gx = grad_x.data<T>(), *gb = grad_bias.data<T>();
    if (cols % N == 0 && opforge::cuda::aligned(16, g, in, b, gx)) {
      launch<T, N>(ctx, g, in, b, gx, gb, rows, cols);
    } else {
      launch<T, 1>(ctx, g, in, b, gx, gb, rows, cols);
    }
  });
}
