// int8_linear CUDA kernels: the pack (quantise, one block per output channel) and the forward,
// which loads int8 weights in the packed layout of int8_linear.h, converts them to x's 16-bit type
// in registers (exact: |q| <= 127) and multiplies on tensor cores (mma.m16n8k16, float32
// accumulators; PTX ISA "Warp-level matrix multiply-accumulate instructions"); scales and bias are
// applied once per output. Two shapes of the work:
//   - M <= 64 rows (decode, small batches): memory-bound on the weights. A block of 8 warps owns
//     two strips (16 output channels) and 16 rows; its warps split K and sum their accumulators
//     through shared memory, so there are enough blocks (N / 16 per 16 rows) to keep every SM's
//     loads in flight. x (a few KiB) is read from L1/L2 straight into A fragments.
//   - larger M: a 128 x 128 tile per block (8 warps of 64 x 32), x staged through shared memory in
//     64-column steps and read with ldmatrix, weights loaded from L2 per warp.
// float32 x takes a plain CUDA-core loop (float32 accumulation, one output per thread): it has no
// 16-bit tensor-core path.
#include <opforge/cuda.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "int8_linear.h"

namespace {

constexpr int kThreads = 256;  // 8 warps

// ---- pack ------------------------------------------------------------------------------------

template <class T>
__global__ void pack_kernel(const T* __restrict__ w, int8_t* __restrict__ q, float* __restrict__ scales, int64_t K) {
  const int64_t n = blockIdx.x;
  const T* row = w + n * K;
  float amax = 0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(static_cast<float>(row[k])));
  __shared__ float warp_max[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0;
  for (int i = 0; i < kThreads / 32; ++i) amax = fmaxf(amax, warp_max[i]);
  const float scale = amax / 127.0f;
  if (threadIdx.x == 0) scales[n] = scale;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const float v = scale > 0 ? rintf(static_cast<float>(row[k]) / scale) : 0.0f;
    q[int8_linear::packed_offset(n, k, K)] = static_cast<int8_t>(fminf(fmaxf(v, -127.0f), 127.0f));
  }
}

template <class T>
__global__ void to_float_kernel(const T* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = opforge::kernel::global_index(); i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<float>(in[i]);
}

// ---- tensor-core helpers ---------------------------------------------------------------------

template <class T>
struct Mma;  // D += A * B for one m16n8k16 tile, A and B in T (two per 32-bit register)

template <>
struct Mma<__half> {
  static __device__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ uint32_t pair(int8_t lo, int8_t hi) {
    __half2 h = __halves2half2(__int2half_rn(lo), __int2half_rn(hi));
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct Mma<__nv_bfloat16> {
  static __device__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ uint32_t pair(int8_t lo, int8_t hi) {
    __nv_bfloat162 h = __halves2bfloat162(__int2bfloat16_rn(lo), __int2bfloat16_rn(hi));
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

/// The B fragments of k16 tile `tile` (0..3) in one lane's 16 packed bytes.
template <class T>
__device__ void b_fragments(const int4& packed, int tile, uint32_t& b0, uint32_t& b1) {
  const int word = tile == 0 ? packed.x : tile == 1 ? packed.y : tile == 2 ? packed.z : packed.w;
  const int8_t v0 = static_cast<int8_t>(word & 0xff), v1 = static_cast<int8_t>((word >> 8) & 0xff);
  const int8_t v2 = static_cast<int8_t>((word >> 16) & 0xff), v3 = static_cast<int8_t>((word >> 24) & 0xff);
  b0 = Mma<T>::pair(v0, v1);
  b1 = Mma<T>::pair(v2, v3);
}

/// y[m][n], y[m][n + 1] = acc * scale + bias (rows and columns checked by the caller).
template <class T>
__device__ void store_pair(T* y, int64_t N, int64_t m, int64_t n, float a0, float a1, const float* scales,
                           const float* bias) {
  float v0 = a0 * scales[n], v1 = a1 * scales[n + 1];
  if (bias != nullptr) v0 += bias[n], v1 += bias[n + 1];
  y[m * N + n] = static_cast<T>(v0);
  y[m * N + n + 1] = static_cast<T>(v1);
}

// ---- M <= 64: split K across the warps of a block ----------------------------------------------

constexpr int kSmallStrips = 2;  // strips of 8 output channels per block

template <class T>
__global__ void __launch_bounds__(kThreads)
    small_m_kernel(const T* __restrict__ x, const int4* __restrict__ qw, const float* __restrict__ scales,
                   const float* __restrict__ bias, T* __restrict__ y, int64_t M, int64_t N, int64_t K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t chunks = K / int8_linear::kChunk, strips = N / 8, strip0 = int64_t{blockIdx.x} * kSmallStrips;
  const int64_t m0 = int64_t{blockIdx.y} * 16;
  const bool row_lo = m0 + g < M, row_hi = m0 + g + 8 < M;
  const T* x_lo = x + (m0 + g) * K + 2 * t;
  const T* x_hi = x_lo + 8 * K;
  float acc[kSmallStrips][4] = {};
  for (int64_t c = warp; c < chunks; c += kThreads / 32) {
    int4 b[kSmallStrips];
#pragma unroll
    for (int s = 0; s < kSmallStrips; ++s)
      b[s] = strip0 + s < strips ? qw[((strip0 + s) * chunks + c) * 32 + lane] : int4{0, 0, 0, 0};
#pragma unroll
    for (int tile = 0; tile < 4; ++tile) {
      const int64_t k = c * int8_linear::kChunk + tile * 16;
      uint32_t a[4];
      a[0] = row_lo ? *reinterpret_cast<const uint32_t*>(x_lo + k) : 0u;
      a[1] = row_hi ? *reinterpret_cast<const uint32_t*>(x_hi + k) : 0u;
      a[2] = row_lo ? *reinterpret_cast<const uint32_t*>(x_lo + k + 8) : 0u;
      a[3] = row_hi ? *reinterpret_cast<const uint32_t*>(x_hi + k + 8) : 0u;
#pragma unroll
      for (int s = 0; s < kSmallStrips; ++s) {
        uint32_t b0, b1;
        b_fragments<T>(b[s], tile, b0, b1);
        Mma<T>::run(acc[s], a, b0, b1);
      }
    }
  }
  __shared__ float partial[kThreads / 32][kSmallStrips * 4][32];
#pragma unroll
  for (int s = 0; s < kSmallStrips; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[warp][s * 4 + r][lane] = acc[s][r];
  __syncthreads();
  // one (strip, register, lane) entry per thread: kSmallStrips * 4 * 32 == kThreads
  const int e = threadIdx.x, s = e / 128, r = (e / 32) % 4, l = e % 32;
  float sum = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) sum += partial[w][s * 4 + r][l];
  const int64_t m = m0 + l / 4 + (r >= 2 ? 8 : 0), n = (strip0 + s) * 8 + 2 * (l % 4) + (r & 1);
  if (m < M && strip0 + s < strips) {
    float v = sum * scales[n] + (bias != nullptr ? bias[n] : 0.0f);
    y[m * N + n] = static_cast<T>(v);
  }
}
static_assert(kSmallStrips * 4 * 32 == kThreads, "small_m_kernel's reduction gives each thread one entry");

// ---- larger M: 128 x 128 tiles ------------------------------------------------------------------

constexpr int kTileM = 128, kTileN = 128, kTileK = 64, kPitch = kTileK + 8;  // +8: ldmatrix without bank conflicts

template <class T>
__global__ void __launch_bounds__(kThreads)
    tiled_kernel(const T* __restrict__ x, const int4* __restrict__ qw, const float* __restrict__ scales,
                 const float* __restrict__ bias, T* __restrict__ y, int64_t M, int64_t N, int64_t K) {
  __shared__ __align__(16) T xs[2][kTileM][kPitch];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = warp / 4, wn = warp % 4;  // a warp's 64 x 32 part of the tile
  const int64_t m0 = int64_t{blockIdx.y} * kTileM, n0 = int64_t{blockIdx.x} * kTileN;
  const int64_t chunks = K / kTileK, strips = N / 8, strip0 = (n0 + wn * 32) / 8;
  float acc[4][4][4] = {};

  // x tile: 128 rows x 64 columns = 1024 16-byte vectors, 4 per thread
  auto load_x = [&](int64_t c, int4 (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = threadIdx.x + i * kThreads, row = idx / 8, col = (idx % 8) * 8;
      v[i] = m0 + row < M ? *reinterpret_cast<const int4*>(x + (m0 + row) * K + c * kTileK + col) : int4{0, 0, 0, 0};
    }
  };
  auto store_x = [&](int stage, const int4 (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = threadIdx.x + i * kThreads, row = idx / 8, col = (idx % 8) * 8;
      *reinterpret_cast<int4*>(&xs[stage][row][col]) = v[i];
    }
  };
  int4 next[4];
  load_x(0, next);
  store_x(0, next);
  __syncthreads();
  for (int64_t c = 0; c < chunks; ++c) {
    const int stage = c % 2;
    if (c + 1 < chunks) load_x(c + 1, next);
    int4 b[4];
#pragma unroll
    for (int s = 0; s < 4; ++s)
      b[s] = strip0 + s < strips ? qw[((strip0 + s) * chunks + c) * 32 + lane] : int4{0, 0, 0, 0};
#pragma unroll
    for (int tile = 0; tile < 4; ++tile) {
      uint32_t a[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const T* p = &xs[stage][wm * 64 + i * 16 + lane % 16][tile * 16 + (lane / 16) * 8];
        const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])
                     : "r"(addr));
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t b0, b1;
        b_fragments<T>(b[s], tile, b0, b1);
#pragma unroll
        for (int i = 0; i < 4; ++i) Mma<T>::run(acc[i][s], a[i], b0, b1);
      }
    }
    if (c + 1 < chunks) {
      store_x(1 - stage, next);  // the other stage: last read an iteration ago, before the barrier
      __syncthreads();
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + wm * 64 + i * 16 + g;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int64_t n = n0 + wn * 32 + s * 8 + 2 * t;
      if (n >= N) continue;
      if (m < M) store_pair(y, N, m, n, acc[i][s][0], acc[i][s][1], scales, bias);
      if (m + 8 < M) store_pair(y, N, m + 8, n, acc[i][s][2], acc[i][s][3], scales, bias);
    }
  }
}

// ---- float32 x -----------------------------------------------------------------------------------

__global__ void float_kernel(const float* __restrict__ x, const int8_t* __restrict__ q,
                             const float* __restrict__ scales, const float* __restrict__ bias, float* __restrict__ y,
                             int64_t M, int64_t N, int64_t K) {
  for (int64_t i = opforge::kernel::global_index(); i < M * N; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = i / N, n = i % N;
    float acc = 0;
    for (int64_t k = 0; k < K; ++k) acc = fmaf(x[m * K + k], static_cast<float>(q[int8_linear::packed_offset(n, k, K)]), acc);
    y[i] = acc * scales[n] + (bias != nullptr ? bias[n] : 0.0f);
  }
}

}  // namespace

void int8_linear_pack_cuda(const opforge::Context& ctx, opforge::Tensor weight, opforge::Tensor bias,
                           opforge::MutableTensor qweight, opforge::MutableTensor scales,
                           opforge::MutableTensor bias_fp32) {
  const int64_t N = weight.size(0), K = weight.size(1);
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  opforge::cuda::visit_dtype<opforge::floating>(weight.dtype(), [&]<class T>(opforge::type_tag<T>) {
    if (N > 0) pack_kernel<T><<<N, kThreads, 0, stream>>>(weight.data<T>(), qweight.data<int8_t>(), scales.data<float>(), K);
  });
  if (bias.defined() && N > 0) {
    opforge::cuda::visit_dtype<opforge::floating>(bias.dtype(), [&]<class B>(opforge::type_tag<B>) {
      to_float_kernel<B><<<opforge::cuda::grid_for(N, kThreads), kThreads, 0, stream>>>(bias.data<B>(),
                                                                                      bias_fp32.data<float>(), N);
    });
  }
  opforge::cuda::check_launch("int8_linear_pack");
}

void int8_linear_cuda(const opforge::Context& ctx, opforge::Tensor x, opforge::Tensor qweight, opforge::Tensor scales,
                      opforge::Tensor bias_fp32, opforge::MutableTensor y) {
  const int64_t N = qweight.size(0), K = qweight.size(1), M = K ? x.numel() / K : 0;
  const float* bias = bias_fp32.defined() ? bias_fp32.data<float>() : nullptr;
  const auto* qw = static_cast<const int4*>(qweight.raw_data());
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  if (M == 0 || N == 0) return;
  constexpr auto kActivations = opforge::kFloat16 | opforge::kBFloat16 | opforge::kFloat32;
  opforge::cuda::visit_dtype<kActivations>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    if constexpr (std::is_same_v<T, float>) {
      float_kernel<<<opforge::cuda::grid_for(M * N, kThreads), kThreads, 0, stream>>>(
          x.data<float>(), qweight.data<int8_t>(), scales.data<float>(), bias, y.data<float>(), M, N, K);
    } else if (M <= 64) {
      const dim3 grid(static_cast<unsigned>((N / 8 + kSmallStrips - 1) / kSmallStrips),
                      static_cast<unsigned>((M + 15) / 16));
      small_m_kernel<T><<<grid, kThreads, 0, stream>>>(x.data<T>(), qw, scales.data<float>(), bias, y.data<T>(), M, N, K);
    } else {
      const dim3 grid(static_cast<unsigned>((N + kTileN - 1) / kTileN), static_cast<unsigned>((M + kTileM - 1) / kTileM));
      tiled_kernel<T><<<grid, kThreads, 0, stream>>>(x.data<T>(), qw, scales.data<float>(), bias, y.data<T>(), M, N, K);
    }
  });
  opforge::cuda::check_launch("int8_linear");
}
