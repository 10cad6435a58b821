// rms_norm's backward on CUDA, for rms_norm_backward.cu and fused_add_rms_norm's backward.
// With r = 1 / sqrt(mean(x^2) + eps) per row and g = grad_y:
//   grad_x = r * (g * w - x * r^2 * mean(g * w * x))     (per row)
//   grad_w = sum over rows of g * x * r                   (a reduction over rows)
// (the derivative of y = x * r * w; as torch's rms_norm backward and Apex's FusedRMSNorm).
// One pass over the rows: blocks loop over rows, each thread owns the same columns of every row,
// adds its share of grad_w into registers or shared memory (kSharedSums) and writes one row of
// per-block partial sums at the end; opforge::cuda::sum_partials adds those up. r is recomputed
// from x (the forward saves nothing but its inputs), so the pass reads grad_y and x once and
// writes grad_x once.
#pragma once

#include <opforge/cuda.h>

namespace rms_norm_backward {

constexpr int kLoopThreads = 256;
constexpr int kMaxRowThreads = 512;  // with __launch_bounds__, at most 128 registers a thread
/// 16-byte vectors of a row per thread (RowRegisters): 4 for 16-bit elements, 2 for wider ones,
/// the faster of the two at [32768, 4096] on the H200 (bench/RESULTS.md).
template <class T>
constexpr int kRowVectors = sizeof(T) == 2 ? 4 : 2;
/// Where the rows-in-registers kernel keeps its grad_w sums: for 16-bit elements in shared memory
/// (each thread its own columns, so no barrier; RowRegisters' conflict-free layout), which takes
/// 32 registers a thread off the 128 that weight and the rows already hold, faster for 16-bit
/// elements at [32768, 4096] on the H200 (bench/RESULTS.md); for wider ones in registers.
template <class T>
constexpr bool kSharedSums = sizeof(T) == 2;

/// kRegisters: the row fits RowRegisters at this block size and every pointer is 16-byte
/// aligned (the host checks both); rows are read once into registers. Else plain loops that
/// read each row twice and keep the partial sums in `partial` itself (each thread its own
/// columns, so no two threads touch one element). kAdd: grad_add (same shape as grad_y) is added
/// to grad_x (the gradient that reached a residual sum beside the norm's).
template <class T, class W, bool kRegisters, bool kAdd>
__global__ void __launch_bounds__(kMaxRowThreads)
    kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const W* __restrict__ weight,
           const T* __restrict__ grad_add, T* __restrict__ grad_x, opforge::kernel::acc_t<T>* __restrict__ partial,
           int64_t rows, int64_t cols, double eps) {
  using A = opforge::kernel::acc_t<T>;
  using Row = opforge::kernel::RowRegisters<T, kRowVectors<T>>;
  using opforge::kernel::to_acc;
  const A n = static_cast<A>(cols);
  A* part = partial + int64_t{blockIdx.x} * cols;
  if constexpr (kRegisters) {
    constexpr bool kShared = kSharedSums<T>;
    A w[Row::kVectors][Row::kWidth], gw[kShared ? 1 : Row::kVectors][Row::kWidth] = {};
    extern __shared__ uint4 shared_sums[];  // kShared: grad_w's sums (RowRegisters::add_sums)
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) w[k][i] = 0;
      if (!Row::has(k, cols)) continue;
      opforge::kernel::load_widened(weight + Row::offset(k), w[k]);
    }
    if constexpr (kShared) Row::zero_sums(shared_sums);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
      uint4 xw[Row::kVectors], gy[Row::kVectors], ga[kAdd ? Row::kVectors : 1];  // all loads in flight first
      Row::load_words(x + r * cols, cols, xw);
      Row::load_words(grad_y + r * cols, cols, gy);
      if constexpr (kAdd) Row::load_words(grad_add + r * cols, cols, ga);
      A sums[2] = {0, 0};  // sum of x^2, sum of g * w * x
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k) {
        A xv[Row::kWidth], gv[Row::kWidth];
        opforge::kernel::unpack<T>(xw[k], xv);
        opforge::kernel::unpack<T>(gy[k], gv);
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) {
          sums[0] += xv[i] * xv[i];
          sums[1] += gv[i] * w[k][i] * xv[i];  // zeros past the row's end
        }
      }
      opforge::kernel::block_sum(sums);
      const A scale = A(1) / sqrt(sums[0] / n + static_cast<A>(eps));
      const A c = sums[1] / n * scale * scale;
#pragma unroll
      for (int k = 0; k < Row::kVectors; ++k) {
        if (!Row::has(k, cols)) continue;
        A xv[Row::kWidth], gv[Row::kWidth];
        opforge::kernel::unpack<T>(xw[k], xv);
        opforge::kernel::unpack<T>(gy[k], gv);
        A dw[Row::kWidth];
#pragma unroll
        for (int i = 0; i < Row::kWidth; ++i) {
          dw[i] = gv[i] * xv[i] * scale;
          gv[i] = scale * (gv[i] * w[k][i] - xv[i] * c);
        }
        if constexpr (kShared) {
          Row::add_sums(shared_sums, k, dw);
        } else {
#pragma unroll
          for (int i = 0; i < Row::kWidth; ++i) gw[k][i] += dw[i];
        }
        if constexpr (kAdd) {
          A av[Row::kWidth];
          opforge::kernel::unpack<T>(ga[k], av);
#pragma unroll
          for (int i = 0; i < Row::kWidth; ++i) gv[i] += av[i];
        }
        Row::store(grad_x + r * cols + Row::offset(k), gv);
      }
    }
    opforge::cuda::allow_dependent_launch();  // sum_partials' blocks may start; they wait for these writes
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      if (!Row::has(k, cols)) continue;
      if constexpr (kShared) Row::read_sums(shared_sums, k, w[k]);  // w[k] is free by now
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) {
        if constexpr (kShared) part[Row::offset(k) + i] = w[k][i];
        else part[Row::offset(k) + i] = gw[k][i];
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) part[c] = 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
      const T* xr = x + r * cols;
      const T* gr = grad_y + r * cols;
      A sums[2] = {0, 0};
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const A xv = to_acc(xr[c]);
        sums[0] += xv * xv;
        sums[1] += to_acc(gr[c]) * static_cast<A>(to_acc(weight[c])) * xv;
      }
      opforge::kernel::block_sum(sums);
      const A scale = A(1) / sqrt(sums[0] / n + static_cast<A>(eps));
      const A k = sums[1] / n * scale * scale;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const A xv = to_acc(xr[c]), gv = to_acc(gr[c]);
        part[c] += gv * xv * scale;
        A g = scale * (gv * static_cast<A>(to_acc(weight[c])) - xv * k);
        if constexpr (kAdd) g += to_acc(grad_add[r * cols + c]);
        grad_x[r * cols + c] = opforge::kernel::from_acc<T>(g);
      }
    }
  }
}

/// Launches the backward on ctx's stream: grad_y, x [rows, cols] in T, weight [cols] in W;
/// writes grad_x and grad_weight (in W, summed over rows in acc_t<T>); with grad_add (same
/// shape as x), grad_x = rms_norm's gradient + grad_add.
template <class T, class W>
void launch(const opforge::Context& ctx, opforge::Tensor grad_y, opforge::Tensor x, opforge::Tensor weight, double eps,
            opforge::MutableTensor grad_x, opforge::MutableTensor grad_weight, const T* grad_add = nullptr) {
  using A = opforge::cuda::acc_t<T>;
  using Row = opforge::kernel::RowRegisters<T, kRowVectors<T>>;
  const int64_t cols = weight.numel(), rows = cols ? x.numel() / cols : 0;
  const T *g = grad_y.data<T>(), *in = x.data<T>();
  const W* w = weight.data<W>();
  T* out = grad_x.data<T>();
  const int row_threads = Row::threads_for(cols, kMaxRowThreads);
  const bool add = grad_add != nullptr;
  const bool registers =
      row_threads > 0 && opforge::cuda::aligned(16, g, in, w, out) && (!add || opforge::cuda::aligned(16, grad_add));
  const int threads = registers ? row_threads : kLoopThreads;
  auto k = registers ? (add ? kernel<T, W, true, true> : kernel<T, W, true, false>)
                     : (add ? kernel<T, W, false, true> : kernel<T, W, false, false>);
  const size_t smem = registers && kSharedSums<T> ? Row::sum_bytes(threads) : 0;
  opforge::cuda::allow_dynamic_smem(k, smem);
  const unsigned grid = opforge::cuda::resident_grid(k, threads, rows, smem);
  auto* partial = static_cast<A*>(ctx.allocate(sizeof(A) * grid * cols));
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  if (grid > 0) {
    k<<<grid, threads, smem, stream>>>(g, in, w, grad_add, out, partial, rows, cols, eps);
    opforge::cuda::check_launch("rms_norm_backward kernel");
  }
  opforge::cuda::sum_partials(partial, int64_t{grid}, cols, grad_weight.data<W>(), stream);
}

}  // namespace rms_norm_backward
