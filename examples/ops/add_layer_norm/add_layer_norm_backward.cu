// add_layer_norm's backward on CUDA. With h = x + residual, per row mean m, inv = 1 / sqrt(var +
// eps), xhat = (h - m) * inv, g = grad_y and dxhat = g * weight:
//   grad_h = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   (grad_x_and_residual)
//   grad_weight = sum over rows of g * xhat,  grad_bias = sum over rows of g
// (the LayerNorm derivative of Ba, Kiros & Hinton 2016, as torch's native_layer_norm_backward).
// One pass over the rows, as rms_norm_backward.cu: blocks loop over rows, each thread owns the
// same columns of every row and keeps its share of grad_weight and grad_bias in registers, one
// row of per-block partial sums each is written at the end and opforge::cuda::sum_partials adds
// them up. mean and inv are recomputed from x and residual as the forward computes them (the
// mean first, then the variance around it).
#include <opforge/cuda.h>

#include <algorithm>

namespace {

constexpr int kLoopThreads = 256;
/// 16-byte vectors of a row per thread (RowRegisters) and the largest block for them: 4 vectors
/// for 16-bit elements at up to 256 threads (h, grad_y and two partial sums in up to 255
/// registers), 2 for wider ones at up to 512 (128 registers), the faster choice for each at
/// [32768, 4096] on the H200 (bench/RESULTS.md).
template <class T>
constexpr int kRowVectors = sizeof(T) == 2 ? 4 : 2;
template <class T>
constexpr int kMaxRowThreads = sizeof(T) == 2 ? 256 : 512;

/// Where the rows-in-registers kernel keeps grad_weight's and grad_bias's per-column sums and the
/// weight: for 16-bit elements in shared memory (each thread its own columns, so no barrier;
/// sums in RowRegisters' conflict-free layout), which frees the registers of a fourth resident
/// block of 128 threads. The weight goes there too: the sums alone in shared memory, with the
/// weight re-read from L1, were slower, as the rows' loads in flight need the L1 that the
/// carve-out takes (bench/RESULTS.md, [32768, 4096] on the H200). Wider elements keep registers.
template <class T>
constexpr bool kSharedColumns = sizeof(T) == 2;

/// kRegisters: the row fits RowRegisters at this block size and every pointer is 16-byte aligned
/// (the host checks both); h is read once into registers and weight is re-read per row (from
/// shared memory for 16-bit elements, kSharedColumns; else from L1: kept in registers it cost the
/// 16-bit kernel a resident block and was slower, bench/RESULTS.md).
/// Else plain loops that read each row three times and keep the partial sums in `partial` itself
/// (each thread its own columns). partial: [2, gridDim.x, cols], grad_weight's then grad_bias's.
template <class T, bool kRegisters>
__global__ void __launch_bounds__(kMaxRowThreads<T>)
    add_layer_norm_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                                   const T* __restrict__ residual, const T* __restrict__ weight, T* __restrict__ grad_h,
                                   opforge::kernel::acc_t<T>* __restrict__ partial, int64_t rows, int64_t cols,
                                   double eps) {
  using A = opforge::kernel::acc_t<T>;
  using Row = opforge::kernel::RowRegisters<T, kRowVectors<T>>;
  using opforge::kernel::to_acc;
  const A n = static_cast<A>(cols);
  A* part_w = partial + int64_t{blockIdx.x} * cols;
  A* part_b = partial + (int64_t{gridDim.x} + blockIdx.x) * cols;
  if constexpr (kRegisters) {
    constexpr bool kShared = kSharedColumns<T>;
    constexpr int kSumVectors = kShared ? 1 : Row::kVectors;  // the register sums, when not shared
    A gw[kSumVectors][Row::kWidth], gb[kSumVectors][Row::kWidth];
    extern __shared__ uint4 shared[];  // kShared: grad_weight's sums, grad_bias's, then weight [cols]
    uint4* const sw = shared;
    uint4* const sb = shared + Row::sum_bytes(blockDim.x) / 16;
    T* const s_weight = reinterpret_cast<T*>(shared + 2 * Row::sum_bytes(blockDim.x) / 16);
    const T* const w_row = kShared ? s_weight : weight;
    if constexpr (kShared) {
      Row::zero_sums(sw);
      Row::zero_sums(sb);
    } else {
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k) {
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) gw[k][i] = gb[k][i] = 0;
      }
    }
    if constexpr (kShared) {  // each thread copies the columns it reads: no barrier
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k)
        if (Row::has(k, cols))
          *reinterpret_cast<uint4*>(s_weight + Row::offset(k)) =
              *reinterpret_cast<const uint4*>(weight + Row::offset(k));
    }
    // The row's two block sums take turns with these buffers: one barrier each (block_sum's).
    __shared__ A mean_buffer[1][32], sums_buffer[3][32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
      const int64_t base = r * cols;
      A h[Row::kVectors][Row::kWidth];
      uint4 gy[Row::kVectors];
      {
        uint4 xw[Row::kVectors], rw[Row::kVectors];  // the three rows' loads in flight before any arithmetic
        Row::load_words(x + base, cols, xw);
        Row::load_words(residual + base, cols, rw);
        Row::load_words(grad_y + base, cols, gy);
#pragma unroll
        for (int k = 0; k < Row::kVectors; ++k) {
          A rv[Row::kWidth];
          opforge::kernel::unpack<T>(xw[k], h[k]);
          opforge::kernel::unpack<T>(rw[k], rv);
#pragma unroll
          for (int i = 0; i < Row::kWidth; ++i) h[k][i] += rv[i];
        }
      }
      A mean = 0;
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k) {
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) mean += h[k][i];  // zeros past the row's end
      }
      A mean_sum[1] = {mean};
      opforge::kernel::block_sum(mean_sum, mean_buffer);
      mean = mean_sum[0] / n;
      A sums[3] = {0, 0, 0};  // sum of (h - m)^2, of dxhat, of dxhat * (h - m)
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k) {
        if (!Row::has(k, cols)) continue;
        A w[Row::kWidth], g[Row::kWidth];
        Row::load(w_row + Row::offset(k), w);
        opforge::kernel::unpack<T>(gy[k], g);
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) {
          const A d = h[k][i] - mean, dx = g[i] * w[i];
          sums[0] += d * d;
          sums[1] += dx;
          sums[2] += dx * d;
        }
      }
      opforge::kernel::block_sum(sums, sums_buffer);
      const A inv = A(1) / sqrt(sums[0] / n + static_cast<A>(eps));
      const A mean_dx = sums[1] / n, mean_dx_xhat = sums[2] * inv / n;
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k) {
        if (!Row::has(k, cols)) continue;
        A w[Row::kWidth], g[Row::kWidth];
        Row::load(w_row + Row::offset(k), w);
        opforge::kernel::unpack<T>(gy[k], g);
        A dw[Row::kWidth];
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) {
          const A xhat = (h[k][i] - mean) * inv;
          dw[i] = g[i] * xhat;
          w[i] = inv * (g[i] * w[i] - mean_dx - xhat * mean_dx_xhat);
        }
        if constexpr (kShared) {
          Row::add_sums(sw, k, dw);
          Row::add_sums(sb, k, g);
        } else {
#pragma unroll
          for (int i = 0; i < Row::kWidth; ++i) {
            gw[k][i] += dw[i];
            gb[k][i] += g[i];
          }
        }
        Row::store(grad_h + base + Row::offset(k), w);
      }
    }
    opforge::cuda::allow_dependent_launch();  // sum_partials' blocks may start; they wait for these writes
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      if (!Row::has(k, cols)) continue;
      if constexpr (kShared) {
        A v[Row::kWidth];
        Row::read_sums(sw, k, v);
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) part_w[Row::offset(k) + i] = v[i];
        Row::read_sums(sb, k, v);
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) part_b[Row::offset(k) + i] = v[i];
      } else {
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) {
          part_w[Row::offset(k) + i] = gw[k][i];
          part_b[Row::offset(k) + i] = gb[k][i];
        }
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) part_w[c] = part_b[c] = 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
      const int64_t base = r * cols;
      auto h = [&](int64_t c) { return to_acc(x[base + c]) + to_acc(residual[base + c]); };
      A mean = 0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mean += h(c);
      mean = opforge::kernel::block_sum(mean) / n;
      A sums[3] = {0, 0, 0};
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const A d = h(c) - mean, dx = to_acc(grad_y[base + c]) * to_acc(weight[c]);
        sums[0] += d * d;
        sums[1] += dx;
        sums[2] += dx * d;
      }
      opforge::kernel::block_sum(sums);
      const A inv = A(1) / sqrt(sums[0] / n + static_cast<A>(eps));
      const A mean_dx = sums[1] / n, mean_dx_xhat = sums[2] * inv / n;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const A xhat = (h(c) - mean) * inv, g = to_acc(grad_y[base + c]);
        part_w[c] += g * xhat;
        part_b[c] += g;
        grad_h[base + c] = opforge::kernel::from_acc<T>(inv * (g * to_acc(weight[c]) - mean_dx - xhat * mean_dx_xhat));
      }
    }
  }
}

}  // namespace

void add_layer_norm_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_y, opforge::Tensor x,
                                  opforge::Tensor residual, opforge::Tensor weight, double eps,
                                  opforge::MutableTensor grad_x_and_residual, opforge::MutableTensor grad_weight,
                                  opforge::MutableTensor grad_bias) {
  opforge::cuda::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    using A = opforge::cuda::acc_t<T>;
    using Row = opforge::kernel::RowRegisters<T, kRowVectors<T>>;
    const int64_t cols = weight.numel(), rows = cols ? x.numel() / cols : 0;
    const T *g = grad_y.data<T>(), *in = x.data<T>(), *res = residual.data<T>(), *w = weight.data<T>();
    T* gh = grad_x_and_residual.data<T>();
    const int row_threads = Row::threads_for(cols, kMaxRowThreads<T>);
    const bool registers = row_threads > 0 && opforge::cuda::aligned(16, g, in, res, w, gh);
    const int threads = registers ? row_threads : kLoopThreads;
    auto kernel = registers ? add_layer_norm_backward_kernel<T, true> : add_layer_norm_backward_kernel<T, false>;
    const size_t smem = registers && kSharedColumns<T> ? 2 * Row::sum_bytes(threads) + cols * sizeof(T) : 0;
    opforge::cuda::allow_dynamic_smem(kernel, smem);
    const unsigned grid = opforge::cuda::resident_grid(kernel, threads, rows, smem);
    auto* partial = static_cast<A*>(ctx.allocate(sizeof(A) * 2 * grid * cols));
    const cudaStream_t stream = opforge::cuda::stream(ctx);
    if (grid > 0) {
      kernel<<<grid, threads, smem, stream>>>(g, in, res, w, gh, partial, rows, cols, eps);
      opforge::cuda::check_launch("add_layer_norm_backward_kernel");
    }
    opforge::cuda::sum_partials(partial, int64_t{grid}, cols, {grad_weight.data<T>(), grad_bias.data<T>()}, stream);
  });
}
