// int8_linear CUDA kernels: the pack (quantise, one block per output channel) and the forward.
// Two shapes of the work:
//   - M <= 64 rows (decode, small batches): memory-bound on the weights. The kernel loads int8
//     weights in the packed layout of int8_linear.h, converts them to x's 16-bit type in
//     registers (exact: |q| <= 127) and multiplies on tensor cores (mma.m16n8k16, float32
//     accumulators; PTX ISA "Warp-level matrix multiply-accumulate instructions"); scales and bias
//     are applied once per output. A block of 8 warps owns two strips (16 output channels) and 16
//     rows; its warps split K, each with the weights of kUnroll chunks in flight, and sum their
//     accumulators through shared memory, so there are enough blocks (N / 16 per 16 rows) and
//     bytes in flight to keep HBM busy. x (a few KiB) is read from L1/L2 straight into A fragments.
//   - larger M: compute-bound. The weight is dequantised (q * scale, rounded once to x's type)
//     into scratch memory and multiplied by cuBLAS (cublasGemmEx, float32 accumulation), with y
//     pre-filled with the bias and beta = 1: the weight-only-quantisation scheme of serving stacks
//     at large batch (vLLM's AWQ path dequantises then calls the dense GEMM). The dequantisation
//     moves N * K * (1 + 2) bytes, a few percent of the GEMM's time at M >= 1024.
// float32 x takes a plain CUDA-core loop (float64 accumulation, one output per thread): it has no
// 16-bit tensor-core path.
#include <opforge/cuda.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

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
    q[int8_linear::packed_offset(n, k, K)] = int8_linear::quantise(static_cast<float>(row[k]), scale);
  }
}

template <class T>
__global__ void to_float_kernel(const T* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = opforge::kernel::global_index(); i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<float>(in[i]);
}

// ---- tensor-core helpers ---------------------------------------------------------------------

// D += A * B for one m16n8k16 tile, A and B of type `ab` ("f16" or "bf16", two per 32-bit register).
#define INT8_LINEAR_MMA(ab)                                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ab "." ab                                                 \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                     \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <class T>
__device__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>)
    INT8_LINEAR_MMA("f16");
  else
    INT8_LINEAR_MMA("bf16");
}
#undef INT8_LINEAR_MMA

/// Two int8 weights of one output channel dequantised to T (int8_linear::dequantise: q * scale
/// in float32, rounded to T once), in one register (lo in the low half).
template <class T>
__device__ uint32_t pair(int8_t lo, int8_t hi, float scale) {
  const T v[2] = {T(int8_linear::dequantise(lo, scale)), T(int8_linear::dequantise(hi, scale))};
  uint32_t r;
  memcpy(&r, v, sizeof r);
  return r;
}

/// The B fragments of k16 tile `tile` (0..3) in one lane's 16 packed bytes, all of one output
/// channel (whose scale is `scale`).
template <class T>
__device__ void b_fragments(const int4& packed, int tile, float scale, uint32_t& b0, uint32_t& b1) {
  const int word = tile == 0 ? packed.x : tile == 1 ? packed.y : tile == 2 ? packed.z : packed.w;
  const int8_t v0 = static_cast<int8_t>(word & 0xff), v1 = static_cast<int8_t>((word >> 8) & 0xff);
  const int8_t v2 = static_cast<int8_t>((word >> 16) & 0xff), v3 = static_cast<int8_t>((word >> 24) & 0xff);
  b0 = pair<T>(v0, v1, scale);
  b1 = pair<T>(v2, v3, scale);
}

// ---- M <= 64: split K across the warps of a block ----------------------------------------------

constexpr int kUnroll = 4;  // chunks whose weights a warp has in flight at once
constexpr int kWarps = kThreads / 32;

/// 16 bytes of weights, read once: through the non-coherent path, not kept in L1.
__device__ int4 load_streamed(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// y for 16 rows of x and kStrips strips of 8 output channels per block; the block's warps take
/// every kWarps-th chunk of K and sum their accumulators through shared memory. Each A fragment
/// of x (read from L1/L2) serves kStrips strips, so more strips read x less often per weight byte
/// (2 bytes of x per weight byte per 16 rows over kStrips), and fewer blocks share the GPU.
template <class T, int kStrips>
__global__ void __launch_bounds__(kThreads)
    small_m_kernel(const T* __restrict__ x, const int4* __restrict__ qw, const float* __restrict__ scales,
                   const float* __restrict__ bias, T* __restrict__ y, int64_t M, int64_t N, int64_t K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t chunks = K / int8_linear::kChunk, strips = N / 8, strip0 = int64_t{blockIdx.x} * kStrips;
  const int64_t m0 = int64_t{blockIdx.y} * 16;
  const bool row_lo = m0 + g < M, row_hi = m0 + g + 8 < M;
  const T* x_lo = x + (m0 + g) * K + 2 * t;
  const T* x_hi = x_lo + 8 * K;
  float scale[kStrips];  // a lane's weights all belong to output channel 8 * strip + g
#pragma unroll
  for (int s = 0; s < kStrips; ++s) scale[s] = strip0 + s < strips ? scales[(strip0 + s) * 8 + g] : 0.0f;
  float acc[kStrips][4] = {};
  for (int64_t c0 = warp; c0 < chunks; c0 += kWarps * kUnroll) {
    int4 b[kUnroll][kStrips];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * kWarps;
#pragma unroll
      for (int s = 0; s < kStrips; ++s)
        b[u][s] = c < chunks && strip0 + s < strips ? load_streamed(qw + ((strip0 + s) * chunks + c) * 32 + lane)
                                                    : int4{0, 0, 0, 0};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * kWarps;
      if (c >= chunks) break;
#pragma unroll
      for (int tile = 0; tile < 4; ++tile) {
        const int64_t k = c * int8_linear::kChunk + tile * 16;
        uint32_t a[4];
        a[0] = row_lo ? *reinterpret_cast<const uint32_t*>(x_lo + k) : 0u;
        a[1] = row_hi ? *reinterpret_cast<const uint32_t*>(x_hi + k) : 0u;
        a[2] = row_lo ? *reinterpret_cast<const uint32_t*>(x_lo + k + 8) : 0u;
        a[3] = row_hi ? *reinterpret_cast<const uint32_t*>(x_hi + k + 8) : 0u;
#pragma unroll
        for (int s = 0; s < kStrips; ++s) {
          uint32_t b0, b1;
          b_fragments<T>(b[u][s], tile, scale[s], b0, b1);
          mma<T>(acc[s], a, b0, b1);
        }
      }
    }
  }
  __shared__ float partial[kWarps][kStrips * 4][32];
#pragma unroll
  for (int s = 0; s < kStrips; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[warp][s * 4 + r][lane] = acc[s][r];
  __syncthreads();
  // The (strip, register, lane) entries, kStrips * 4 * 32 of them, spread over the threads.
  for (int e = threadIdx.x; e < kStrips * 4 * 32; e += kThreads) {
    const int s = e / 128, r = (e / 32) % 4, l = e % 32;
    float sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][s * 4 + r][l];
    const int64_t m = m0 + l / 4 + (r >= 2 ? 8 : 0), n = (strip0 + s) * 8 + 2 * (l % 4) + (r & 1);
    if (m < M && strip0 + s < strips) y[m * N + n] = static_cast<T>(sum + (bias != nullptr ? bias[n] : 0.0f));
  }
}

template <class T, int kStrips>
void small_m(const T* x, const int4* qw, const float* scales, const float* bias, T* y, int64_t M, int64_t N,
             int64_t K, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((N / 8 + kStrips - 1) / kStrips), static_cast<unsigned>((M + 15) / 16));
  small_m_kernel<T, kStrips><<<grid, kThreads, 0, stream>>>(x, qw, scales, bias, y, M, N, K);
}

// ---- larger M: dequantise, then cuBLAS -------------------------------------------------------

/// w [N, K] row-major in T, each weight dequantised as the small-M kernel does. One warp per
/// (strip, chunk) of the packed layout: its 32 lanes read 512 contiguous bytes (8 output channels
/// x 64 input channels), scatter them through shared memory, and write the 8 rows of 64 as 16-byte
/// vectors, 8 lanes a row, so reads and writes are both whole sectors.
template <class T>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const int4* __restrict__ qw, const float* __restrict__ scales, T* __restrict__ w, int64_t N,
                      int64_t K) {
  constexpr int kCols = int8_linear::kChunk;
  __shared__ __align__(16) T rows[kWarps][8][kCols];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunks = K / kCols, units = N / 8 * chunks;
  for (int64_t unit = int64_t{blockIdx.x} * kWarps + warp; unit < units; unit += int64_t{gridDim.x} * kWarps) {
    const int64_t strip = unit / chunks, chunk = unit % chunks;
    const int4 v = load_streamed(qw + unit * 32 + lane);
    const float scale = scales[strip * 8 + lane / 4];
    const int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int tile = 0; tile < 4; ++tile)
#pragma unroll
      for (int byte = 0; byte < 4; ++byte) {
        const int8_t q = static_cast<int8_t>((words[tile] >> (8 * byte)) & 0xff);
        rows[warp][lane / 4][tile * 16 + (byte / 2) * 8 + 2 * (lane % 4) + byte % 2] =
            static_cast<T>(int8_linear::dequantise(q, scale));
      }
    __syncwarp();
    constexpr int kVector = 16 / sizeof(T);  // elements per 16-byte store
#pragma unroll
    for (int j = 0; j < 8 * kCols / kVector / 32; ++j) {
      const int e = (lane + 32 * j) * kVector, row = e / kCols, col = e % kCols;
      *reinterpret_cast<int4*>(w + (strip * 8 + row) * K + chunk * kCols + col) =
          *reinterpret_cast<const int4*>(&rows[warp][row][col]);
    }
    __syncwarp();
  }
}

/// y[m][n] = bias[n], so that the GEMM adds onto it (beta = 1).
template <class T>
__global__ void fill_bias_kernel(const float* __restrict__ bias, T* __restrict__ y, int64_t M, int64_t N) {
  for (int64_t i = opforge::kernel::global_index(); i < M * N; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = static_cast<T>(bias[i % N]);
}

/// The calling thread's cuBLAS handle for the current device, created on first use (cuBLAS's
/// advice: one handle per thread and device, set to the stream of each call). Handles are never
/// destroyed: at exit the CUDA context may be gone before a thread_local destructor runs (ATen
/// leaks its cuDNN handles for the same reason, aten/src/ATen/cudnn/Handle.cpp).
cublasHandle_t cublas_handle() {
  constexpr int kMaxDevices = 64;
  thread_local cublasHandle_t per_device[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices)
    throw opforge::InternalError("int8_linear: no current CUDA device");
  cublasHandle_t& h = per_device[device];
  if (h == nullptr && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    h = nullptr;
    throw opforge::InternalError("int8_linear: cublasCreate failed");
  }
  return h;
}

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw opforge::InternalError(std::string("int8_linear: ") + call + " failed: " + cublasGetStatusString(status));
}

/// y [M, N] = x [M, K] (w [N, K] dequantised)^T + bias, for 16-bit T.
template <class T>
void dequantize_and_gemm(const opforge::Context& ctx, const T* x, const int4* qw, const float* scales,
                         const float* bias, T* y, int64_t M, int64_t N, int64_t K) {
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
    throw opforge::InvalidArgument("int8_linear: sizes beyond cuBLAS's 32-bit int (M, N and K must each be < 2^31)");
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  T* w = static_cast<T*>(ctx.allocate(static_cast<size_t>(N * K) * sizeof(T)));
  dequantize_kernel<T><<<opforge::cuda::grid_for(N * K / 16, kThreads), kThreads, 0, stream>>>(qw, scales, w, N, K);
  if (bias != nullptr)
    fill_bias_kernel<T><<<opforge::cuda::grid_for(M * N, kThreads), kThreads, 0, stream>>>(bias, y, M, N);
  opforge::cuda::check_launch("int8_linear");
  const int ld = static_cast<int>(std::max<int64_t>(K, 1));  // cuBLAS wants leading dims >= 1, also for K == 0
  constexpr cudaDataType_t type = std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
  const float alpha = 1.0f, beta = bias != nullptr ? 1.0f : 0.0f;
  cublasHandle_t handle = cublas_handle();
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  // cuBLAS's workspace from the framework's allocator, so that nothing is cudaMalloc'ed during a
  // call (CUDA-graph capture; torch does the same): 32 MiB, cuBLAS's default on Hopper.
  constexpr size_t kWorkspace = size_t{32} << 20;
  check_cublas(cublasSetWorkspace(handle, ctx.allocate(kWorkspace), kWorkspace), "cublasSetWorkspace");
  // Column-major, as cuBLAS sees row-major buffers: y^T [N, M] = w [N, K] (from w^T, ld K) * x^T [K, M].
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                            static_cast<int>(K), &alpha, w, type, ld, x, type, ld,
                            &beta, y, type, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

// ---- float32 x -----------------------------------------------------------------------------------

__global__ void float_kernel(const float* __restrict__ x, const int8_t* __restrict__ q,
                             const float* __restrict__ scales, const float* __restrict__ bias, float* __restrict__ y,
                             int64_t M, int64_t N, int64_t K) {
  for (int64_t i = opforge::kernel::global_index(); i < M * N; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = i / N, n = i % N;
    double acc = 0;  // as the reference: float32 sums of K products would miss its tolerance at large K
    for (int64_t k = 0; k < K; ++k)
      acc += double(x[m * K + k]) * int8_linear::dequantise(q[int8_linear::packed_offset(n, k, K)], scales[n]);
    y[i] = static_cast<float>(acc + (bias != nullptr ? bias[n] : 0.0));
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
  // Rows from y: with K == 0 (x [M, 0]) every output is its bias.
  const int64_t N = qweight.size(0), K = qweight.size(1), M = N ? y.numel() / N : 0;
  const float* bias = bias_fp32.defined() ? bias_fp32.data<float>() : nullptr;
  const auto* qw = static_cast<const int4*>(qweight.raw_data());
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  if (M == 0 || N == 0) return;
  constexpr auto kActivations = opforge::kFloat16 | opforge::kBFloat16 | opforge::kFloat32;
  opforge::cuda::visit_dtype<kActivations>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    if constexpr (std::is_same_v<T, float>) {
      float_kernel<<<opforge::cuda::grid_for(M * N, kThreads), kThreads, 0, stream>>>(
          x.data<float>(), qweight.data<int8_t>(), scales.data<float>(), bias, y.data<float>(), M, N, K);
    } else if (M <= 4) {  // x is read little: 2 strips a block, more blocks in flight
      small_m<T, 2>(x.data<T>(), qw, scales.data<float>(), bias, y.data<T>(), M, N, K, stream);
    } else if (M <= 64) {  // each read of x serves 4 strips
      small_m<T, 4>(x.data<T>(), qw, scales.data<float>(), bias, y.data<T>(), M, N, K, stream);
    } else {
      dequantize_and_gemm<T>(ctx, x.data<T>(), qw, scales.data<float>(), bias, y.data<T>(), M, N, K);
    }
  });
  opforge::cuda::check_launch("int8_linear");
}
