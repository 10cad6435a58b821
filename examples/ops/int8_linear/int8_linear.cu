// int8_linear CUDA kernels: the pack (quantise, one block per output channel) and the forward.
// Three shapes of the work:
//   - M <= 16 rows (decode) on sm_90 and newer: memory-bound on the weights. A persistent grid
//     (one block per multiprocessor, the strips of 8 output channels split evenly over the
//     blocks) streams the int8 weights (packed layout of int8_linear.h) with the same columns of
//     x through a ring of shared-memory stages filled by bulk tensor copies (cp.async.bulk.tensor
//     completing on mbarriers; a producer thread, 8 consumer warps), converts the weights to x's
//     16-bit type as exact integers (|q| <= 127) and multiplies on tensor cores (mma.m16n8k16,
//     float32 accumulators; PTX ISA "Warp-level matrix multiply-accumulate instructions"); each
//     output's sum is multiplied by its channel's scale once and the bias added.
//   - M <= 64 rows (and M <= 16 where the image predates sm_90): the same arithmetic, each warp
//     streaming its own chunks through a ring with cp.async. A block of 8 warps owns 4 strips
//     and 16 rows; its warps split K and sum through shared memory.
//   - larger M: compute-bound. The weight is dequantised (q * scale, rounded once to x's type)
//     into scratch memory and multiplied by cuBLAS (cublasGemmEx, float32 accumulation), with y
//     pre-filled with the bias and beta = 1: the weight-only-quantisation scheme of serving stacks
//     at large batch (vLLM's AWQ path dequantises then calls the dense GEMM). The dequantisation
//     moves N * K * (1 + 2) bytes, a few percent of the GEMM's time at M >= 1024.
// float32 x takes a plain CUDA-core loop (float64 accumulation, one output per thread): it has no
// 16-bit tensor-core path.
// Any N and K (the layout of int8_linear.h): the tensor-core kernels multiply the whole strips of 8
// output channels and chunks of 64 input channels, one of their warps the K tail (K % 64 columns)
// as one more chunk read with guards, and tail_rows_kernel the tail rows (N % 8); where K % 8 != 0
// x's rows are first copied 16-byte aligned for their copies. Their instances for K % 64 == 0
// (kEvenK) carry no tail code. The large-M path dequantises the tails too and hands cuBLAS w with
// rows padded to a multiple of 8.
#include <opforge/cuda.h>
#include <opforge/tma.cuh>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "int8_linear.h"

namespace {

namespace tma = opforge::tma;

constexpr int kThreads = 256;  // 8 warps

// ---- pack ------------------------------------------------------------------------------------

template <class T>
__global__ void pack_kernel(const T* __restrict__ w, int8_t* __restrict__ q, float* __restrict__ scales, int64_t N,
                            int64_t K) {
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
    q[int8_linear::packed_offset(n, k, N, K)] = int8_linear::quantise(static_cast<float>(row[k]), scale);
  }
}

template <class T>
__global__ void to_float_kernel(const T* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = opforge::kernel::global_index(); i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<float>(in[i]);
}

// ---- tensor-core helpers ---------------------------------------------------------------------

// D += A * B for one m16n8k16 tile, A and B of type `ab` ("f16" or "bf16", two per 32-bit register).
#define INT8_LINEAR_MMA(ab)                                                   \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ab "." ab             \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <class T>
__device__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) INT8_LINEAR_MMA("f16");
  else INT8_LINEAR_MMA("bf16");
}
#undef INT8_LINEAR_MMA

/// The four int8 weights of `word` (bytes v0..v3, v0 lowest) as exact values of T, two per
/// register: b0 = (v0, v1), b1 = (v2, v3), low half first. Integer-to-float by exponent tricks
/// (the "magic number" conversion of FasterTransformer's int8 weight-only kernels), a few integer
/// and one float instruction per pair instead of a conversion per weight: v ^ 0x80 is v + 128 as
/// an unsigned byte u; as the low mantissa bits of 1024.0 (float16 0x6400) it gives 1024 + u, and
/// subtracting 1152 leaves v. bfloat16's 7 mantissa bits cannot hold u, so its path goes through
/// float32 (2^23 + u, minus 2^23 + 128) and keeps each float's high half, exact for |v| <= 128.
template <class T>
__device__ void int8x4_to_pairs(uint32_t word, uint32_t& b0, uint32_t& b1) {
  const uint32_t u = word ^ 0x80808080u;
  if constexpr (std::is_same_v<T, __half>) {
    const uint32_t lo = __byte_perm(u, 0x64646464u, 0x4140), hi = __byte_perm(u, 0x64646464u, 0x4342);
    constexpr uint32_t k1152 = 0x64806480u;  // (1152, 1152) in float16
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(b0) : "r"(lo), "r"(k1152));
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(b1) : "r"(hi), "r"(k1152));
  } else {
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650 + i)) - 8388736.0f;
    b0 = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632);
    b1 = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632);
  }
}

// ---- the K tail: the last K % 64 input channels as one more chunk, from global memory ----------
// The tensor-core kernels stream whole chunks of 64 input channels; the columns past the last one
// (k >= k0 = K / 64 * 64, fewer than 64) are multiplied as one more chunk by one warp, its operands
// read with guards (as zeros past K, and past x's rows) into the same fragments that the chunks
// of shared memory give, so that each output's sum still meets its scale once.

/// A fragments (mma.m16n8k16) of the K tail of rows [0, 16) of x (16-bit elements, rows `ldx`
/// apart, `rows` of them real) for the tail's four k16 tiles: what load_a (and load_a_swizzled)
/// give for a chunk in shared memory. Register r of tile t holds row l / 4 + 8 (r & 1), columns
/// k0 + 16 t + 2 (l % 4) + 8 (r >> 1) + {0, 1} of lane l, low half first.
__device__ void tail_a(const uint16_t* x, int64_t ldx, int64_t rows, int64_t k0, int tail, int lane,
                       uint32_t (&a)[4][4]) {
#pragma unroll
  for (int t = 0; t < 4; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = lane / 4 + 8 * (r & 1), col = 16 * t + 2 * (lane % 4) + 8 * (r >> 1);
      const uint16_t* p = x + row * ldx + k0 + col;
      const bool in = row < rows;
      a[t][r] = uint32_t(in && col < tail ? p[0] : 0) | uint32_t(in && col + 1 < tail ? p[1] : 0) << 16;
    }
}

/// The K tail's weights of output channel `n` (a row of the tail columns, `tail` bytes from
/// `row`; zeros where `valid` is false) as the words int8x4_to_pairs takes for the tail's four
/// k16 tiles: byte i of word t is column 16 t + 2 (l % 4) + {0, 1, 8, 9}[i] of lane l, as the
/// packed chunks give them (int8_linear.h).
__device__ void tail_words(const int8_t* row, int tail, bool valid, int lane, uint32_t (&words)[4]) {
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 16 * t + 2 * (lane % 4) + (i & 1) + 8 * (i >> 1);
      if (valid && col < tail) word |= uint32_t(uint8_t(row[col])) << (8 * i);
    }
    words[t] = word;
  }
}

// ---- M <= 64: weights and x streamed through a shared-memory ring per warp --------------------

constexpr int kWarps = kThreads / 32;
constexpr int kStages = 4;       // chunks a warp has in flight
constexpr int kXRowBytes = 144;  // a chunk's 64 elements of one row of x (128 bytes), padded so that
                                 // ldmatrix's 8 row addresses fall in distinct banks

constexpr int kRingRows = 16;  // rows of x a block of the per-warp rings multiplies (grid.y: the rest)

/// Bytes of one ring stage: the chunk's weights for kStrips strips (32 lanes x 16 bytes each),
/// then the chunk's columns of kRingRows rows of x.
template <int kStrips>
constexpr int kStageBytes = kStrips * 512 + kRingRows* kXRowBytes;

/// Four (x4) or two (x2: r0, r1) 8 x 8 matrices of 16-bit elements from shared memory, lanes
/// 8i..8i+7 addressing matrix i's rows (PTX ISA "ldmatrix").
__device__ void ldmatrix_x4(uint32_t addr, uint32_t (&a)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}
__device__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

/// A fragments (mma.m16n8k16, PTX ISA "Matrix Fragments for mma.m16n8k16") of one k16 tile of
/// 16 rows of x in shared memory, rows kXRowBytes apart.
__device__ void load_a(const char* x_stage, int tile, int lane, uint32_t (&a)[4]) {
  const int row = lane % 16, col = tile * 16 + lane / 16 * 8;
  ldmatrix_x4(static_cast<uint32_t>(__cvta_generic_to_shared(x_stage + row * kXRowBytes + col * 2)), a);
}

/// Where entry e = (accumulator, register, lane) of a warp's mma.m16n8k16 D fragments (PTX ISA
/// "Matrix Fragments for mma.m16n8k16") lands: its row of x, strip (of the block or pass) and
/// output channel in the strip. Accumulator q covers strip q with x as the A operand; with the
/// operands swapped (kSwapped: two strips' weights as A, x as B) it covers strips 2q and 2q + 1.
struct Output {
  int row, strip, channel;
};
template <bool kSwapped>
__device__ Output output_of(int e) {
  const int q = e / 128, r = (e / 32) % 4, l = e % 32;
  if constexpr (kSwapped) return Output{2 * (l % 4) + (r & 1), 2 * q + (r >= 2), l / 4};
  return Output{l / 4 + (r >= 2 ? 8 : 0), q, 2 * (l % 4) + (r & 1)};
}

/// y for 16 rows of x (row block blockIdx.y; rows `ldx` elements apart, a multiple of 8) and
/// kStrips of the N / 8 strips of 8 output channels (blockIdx.x); the tail rows of the weight
/// (N % 8) are tail_rows_kernel's. The block's warps take every kWarps-th chunk of K, and, unless
/// kEvenK (K % 64 == 0, and then ldx == K), warp (K / 64) % kWarps the K tail (tail_a). Each warp
/// streams its chunks through its own ring of kStages stages in shared memory with cp.async (CUDA
/// C++ Programming Guide, "Pipeline Primitives Interface"): a stage holds the chunk's weights and
/// the same 64 columns of x, so a chunk's operands arrive in one round trip and the loop never
/// waits on x after its weights; rows past M are zero-filled, not read. The weights go to the
/// tensor cores as exact integers (int8x4_to_pairs) and each output channel's float32 sum is
/// multiplied by its scale once: scale * sum(x * q) equals sum(x * (q * scale)) up to the rounding
/// of that product, which the reference rounds to T per weight instead. The warps' sums meet in
/// shared memory (each over its own ring, once drained).
template <class T, int kStrips, bool kEvenK>
__global__ void __launch_bounds__(kThreads)
    small_m_kernel(const T* __restrict__ x, int64_t ldx, const int4* __restrict__ qw, const float* __restrict__ scales,
                   const float* __restrict__ bias, T* __restrict__ y, int64_t M, int64_t N, int64_t K) {
  constexpr int kStage = kStageBytes<kStrips>;
  constexpr int kEntries = kStrips * 4 * 32;  // (strip, accumulator, lane) sums of a block
  constexpr int kPerThread = (kEntries + kThreads - 1) / kThreads;
  static_assert(kStage % 16 == 0 && (kStrips * 512) % 16 == 0, "16-byte aligned stages");
  static_assert(kEntries * sizeof(float) <= kStages * kStage, "the sums fit a warp's ring");
  extern __shared__ int4 ring[];  // [kWarps][kStages][kStage bytes]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunks = K / int8_linear::kChunk, strips = N / 8, strip0 = int64_t{blockIdx.x} * kStrips;
  const int64_t m0 = int64_t{blockIdx.y} * 16, ld = kEvenK ? K : ldx;
  char* my_ring = reinterpret_cast<char*>(ring) + warp * kStages * kStage;
  const int64_t my_chunks = chunks > warp ? (chunks - warp + kWarps - 1) / kWarps : 0;  // chunk j is warp + j * kWarps

  // This thread's outputs of the epilogue, read now so that their latency is not at the end.
  float out_scale[kPerThread], out_bias[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = threadIdx.x + i * kThreads, s = e / 128, l = e % 32, r = (e / 32) % 4;
    const int64_t n = (strip0 + s) * 8 + 2 * (l % 4) + (r & 1);
    const bool valid = e < kEntries && strip0 + s < strips;
    out_scale[i] = valid ? scales[n] : 0.0f;
    out_bias[i] = valid && bias != nullptr ? bias[n] : 0.0f;
  }

  auto issue = [&](int64_t j) {  // chunk j's weights and x into stage j % kStages
    if (j < my_chunks) {
      const int64_t c = warp + j * kWarps;
      char* stage = my_ring + (j % kStages) * kStage;
#pragma unroll
      for (int s = 0; s < kStrips; ++s)
        if (strip0 + s < strips)
          __pipeline_memcpy_async(reinterpret_cast<int4*>(stage) + s * 32 + lane,
                                  qw + ((strip0 + s) * chunks + c) * 32 + lane, sizeof(int4));
#pragma unroll
      for (int v = 0; v < kRingRows / 4; ++v) {  // 16 rows of 8 16-byte vectors, 4 a lane
        const int idx = lane + 32 * v, row = idx / 8, col = idx % 8;
        const bool in = m0 + row < M;
        __pipeline_memcpy_async(stage + kStrips * 512 + row * kXRowBytes + col * 16,
                                in ? x + (m0 + row) * ld + c * int8_linear::kChunk + col * 8 : x, sizeof(int4),
                                in ? 0 : sizeof(int4));  // rows past M: zeros, nothing read
      }
    }
    __pipeline_commit();  // empty batches past the end keep wait_prior's count in step
  };

  float acc[kStrips][4] = {};
  // One chunk's products into acc: x's fragments `a`, and words_of(s, words) the weights of strip s.
  auto multiply = [&](const uint32_t(&a)[4][4], auto&& words_of) {
#pragma unroll
    for (int s = 0; s < kStrips; ++s) {
      if (strip0 + s >= strips) continue;
      uint32_t words[4];
      words_of(s, words);
#pragma unroll
      for (int tile = 0; tile < 4; ++tile) {
        uint32_t b0, b1;
        int8x4_to_pairs<T>(words[tile], b0, b1);
        mma<T>(acc[s], a[tile], b0, b1);
      }
    }
  };

  for (int j = 0; j < kStages - 1; ++j) issue(j);
  for (int64_t j = 0; j < my_chunks; ++j) {
    issue(j + kStages - 1);
    __pipeline_wait_prior(kStages - 1);  // chunk j's batch has landed (this lane's copies)
    __syncwarp();                        // and every lane's: ldmatrix reads rows other lanes copied
    const char* stage = my_ring + (j % kStages) * kStage;
    uint32_t a[4][4];
#pragma unroll
    for (int tile = 0; tile < 4; ++tile) load_a(stage + kStrips * 512, tile, lane, a[tile]);
    multiply(a, [&](int s, uint32_t(&words)[4]) {
      const int4 b = reinterpret_cast<const int4*>(stage)[s * 32 + lane];
      words[0] = uint32_t(b.x), words[1] = uint32_t(b.y), words[2] = uint32_t(b.z), words[3] = uint32_t(b.w);
    });
    __syncwarp();  // every lane has read the stage before the next issue overwrites it
  }
  __pipeline_wait_prior(0);
  const int tail = static_cast<int>(K - chunks * int8_linear::kChunk);
  if (!kEvenK && warp == chunks % kWarps) {  // the warp with the fewest chunks (or as few as any)
    const int8_t* tail_columns = reinterpret_cast<const int8_t*>(qw) + strips * 8 * chunks * int8_linear::kChunk;
    uint32_t a[4][4];
    tail_a(reinterpret_cast<const uint16_t*>(x) + m0 * ldx, ldx, M - m0, chunks * int8_linear::kChunk, tail, lane, a);
    multiply(a, [&](int s, uint32_t(&words)[4]) {
      tail_words(tail_columns + ((strip0 + s) * 8 + lane / 4) * tail, tail, true, lane, words);
    });
  }
  // Each warp's sums over its own ring, then the block's.
  float* partial = reinterpret_cast<float*>(my_ring);
#pragma unroll
  for (int s = 0; s < kStrips; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) partial[(s * 4 + r) * 32 + lane] = acc[s][r];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = threadIdx.x + i * kThreads;
    if (e >= kEntries) break;
    const int s = e / 128, r = (e / 32) % 4, l = e % 32;
    float sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += reinterpret_cast<const float*>(ring)[(w * kStages * kStage) / 4 + e];
    const int64_t m = m0 + l / 4 + (r >= 2 ? 8 : 0), n = (strip0 + s) * 8 + 2 * (l % 4) + (r & 1);
    if (m < M && strip0 + s < strips) y[m * N + n] = static_cast<T>(sum * out_scale[i] + out_bias[i]);
  }
}

/// Launches small_m_kernel<T, kStrips, K % 64 == 0> on `stream` (nothing where N < 8: no whole strip).
template <class T, int kStrips>
void small_m(const T* x, int64_t ldx, const int4* qw, const float* scales, const float* bias, T* y, int64_t M,
             int64_t N, int64_t K, cudaStream_t stream) {
  if (N < 8) return;
  const auto kernel =
      K % int8_linear::kChunk == 0 ? small_m_kernel<T, kStrips, true> : small_m_kernel<T, kStrips, false>;
  constexpr size_t kSmem = size_t{kWarps} * kStages * kStageBytes<kStrips>;
  opforge::cuda::allow_dynamic_smem(kernel, kSmem);
  const dim3 grid(static_cast<unsigned>((N / 8 + kStrips - 1) / kStrips), static_cast<unsigned>((M + 15) / 16));
  kernel<<<grid, kThreads, kSmem, stream>>>(x, ldx, qw, scales, bias, y, M, N, K);
}

// ---- M <= 16 on sm_90: a persistent grid fed by the tensor-memory accelerator ------------------

// Each block owns a contiguous range of strips (the strips split evenly over one block per
// multiprocessor, so no block has more than one strip more than another, and no wave is partly
// empty) and streams their weights over all of K, with the same columns of x, through a ring of
// stages in shared memory. One producer thread issues each stage as bulk tensor copies
// (cp.async.bulk.tensor, PTX ISA "Data Movement and Conversion Instructions"), which complete on
// the stage's "full" mbarrier; 8 consumer warps wait on it, multiply, and arrive on the stage's
// "empty" mbarrier, which the producer waits on before it refills the slot (the producer/consumer
// pipeline of CUTLASS's sm90 kernels and FlashAttention-3). A stage holds kPassChunks chunks of
// K: their columns of x (kRows rows, in one copy; rows past M and chunks past K arrive as zeros),
// then the same chunks of the pass's strips (one copy per set bit of their count). Warp w
// multiplies chunk w of every stage for all the pass's strips (independent accumulators, so the
// tensor cores' latency overlaps); the 8 warps' sums of a strip meet in shared memory at the end
// of a pass. With 8 rows of x (M <= 8) the operands swap: two strips' weights are the A operand
// (16 output channels) and x the B operand (8 rows), so no mma multiplies padding rows.

constexpr int kPassWarps = 8;  // consumers; warp 8 is the producer
constexpr int kPassThreads = (kPassWarps + 1) * 32;
constexpr int kPassChunks = kPassWarps;              // chunks of K a stage: one a consumer warp
constexpr int kPassMaxStrips = 8;                    // strips a pass at most
constexpr int kPassMaxStages = 4;                    // bench/RESULTS.md: at M = 1 faster than 6-8, at M = 16 as fast
constexpr int kStripStageBytes = kPassChunks * 512;  // one strip's weights of a stage
constexpr int kPassHeaderBytes = 2 * kPassMaxStages * sizeof(uint64_t);  // the mbarriers
constexpr int kPassPartialBytes = kPassWarps * kPassMaxStrips * 4 * 32 * sizeof(float);
constexpr int kPassAlign = 1024;  // a stage's start: the 128-byte swizzle repeats every 1024 bytes

/// How the strips split over a launch of pass_kernel, computed on the host.
struct PassPlan {
  int blocks;       // grid size: one block per multiprocessor, at most one per strip
  int strips;       // strips a pass (1, 2, 4 or 8, at least 2 with 8 rows: the kernel's kStrips)
  int stages;       // slots of the ring
  int stage_bytes;  // x's tile (kPassChunks x kRows rows x 128 bytes), then strips x kStripStageBytes
};

/// Tensor maps of the packed weights as [strips][chunks][64] 8-byte elements, with boxes of
/// kPassChunks chunks of 1, 2, 4 and 8 strips: a pass's strips arrive in one copy per set bit of
/// their count.
struct WeightMaps {
  CUtensorMap strips[4];  // box of 2^i strips
};

/// Bytes of dynamic shared memory of a pass_kernel launch with `plan`.
constexpr size_t pass_smem_bytes(const PassPlan& plan) {
  return kPassHeaderBytes + kPassPartialBytes + kPassAlign + size_t(plan.stages) * size_t(plan.stage_bytes);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// A fragments of k16 tile `tile` of kRows (8 or 16) rows of x in a tile of 128-byte rows written
/// with the tensor map's 128-byte swizzle (16-byte unit u of row r at unit u ^ (r % 8)), by
/// ldmatrix; with 8 rows, the fragments of rows 8..15 are zeros (and a[0], a[2] are the B
/// fragments of x as mma's B operand).
template <int kRows>
__device__ void load_a_swizzled(const char* tile_base, int tile, int lane, uint32_t (&a)[4]) {
  const int row = kRows == 16 ? lane % 16 : lane % 8, unit = tile * 2 + (kRows == 16 ? lane / 16 : (lane / 8) % 2);
  const auto addr = tma::smem_address(tile_base + row * 128 + ((unit ^ (row % 8)) * 16));
  if constexpr (kRows == 16) {
    ldmatrix_x4(addr, a);
  } else {
    ldmatrix_x2(addr, a[0], a[2]);
    a[1] = a[3] = 0u;
  }
}
#endif

/// One chunk's products into a warp's accumulators of a pass: x's fragments `a` (A; with kSwap,
/// its B fragments in a[.][0] and a[.][2]) and the words (int8x4_to_pairs) of the pass's kStrips
/// strips. With kSwap accumulator q takes strips 2q and 2q + 1 as A, else strip q as B.
template <class T, bool kSwap, int kStrips>
__device__ __forceinline__ void multiply_chunk(float (&acc)[kSwap ? kStrips / 2 : kStrips][4],
                                               const uint32_t (&a)[4][4], const uint32_t (&words)[kStrips][4]) {
  constexpr int kAccumulators = kSwap ? kStrips / 2 : kStrips;
#pragma unroll
  for (int tile = 0; tile < 4; ++tile)
#pragma unroll
    for (int q = 0; q < kAccumulators; ++q) {
      if constexpr (kSwap) {  // A: strip 2q's channels in rows 0-7, strip 2q + 1's in rows 8-15
        uint32_t w[4];
        int8x4_to_pairs<T>(words[2 * q][tile], w[0], w[2]);
        int8x4_to_pairs<T>(words[2 * q + 1][tile], w[1], w[3]);
        mma<T>(acc[q], w, a[tile][0], a[tile][2]);
      } else {
        uint32_t b0, b1;
        int8x4_to_pairs<T>(words[q][tile], b0, b1);
        mma<T>(acc[q], a[tile], b0, b1);
      }
    }
}

/// y for M <= kRows rows of x (kRows 8 or 16; rows `ldx` elements apart) and the N / 8 strips of
/// the weight `qw` (its tail rows are tail_rows_kernel's), kStrips strips a pass (PassPlan).
/// `x_map`: x's whole chunks as [K / 64][M][64] 16-bit elements (strides 128 and ldx * 2 bytes),
/// boxes of kPassChunks chunks of kRows rows with the 128-byte swizzle; `w_maps`: WeightMaps; the
/// K tail (K % 64 columns; none where kEvenK, and then ldx == K) is read from `x` and `qw` by
/// warp (K / 64) % kPassWarps (tail_a).
/// Dynamic shared memory (pass_smem_bytes): the mbarriers, the consumers' partial sums, then
/// plan.stages slots of plan.stage_bytes from the first 1024-byte boundary.
template <class T, int kRows, int kStrips, bool kEvenK>
__global__ void __launch_bounds__(kPassThreads, 1)
    pass_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ WeightMaps w_maps,
                const T* __restrict__ x, int64_t ldx, const int8_t* __restrict__ qw, const float* __restrict__ scales,
                const float* __restrict__ bias, T* __restrict__ y, int64_t M, int64_t N, int64_t K, PassPlan plan) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem[];
  auto* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kPassMaxStages;
  auto* partial = reinterpret_cast<float*>(smem + kPassHeaderBytes);  // [warp][strip][4][32]
  char* ring = smem + kPassHeaderBytes + kPassPartialBytes;
  ring += (kPassAlign - tma::smem_address(ring) % kPassAlign) % kPassAlign;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t strips = N / 8;
  const int chunks = static_cast<int>(K / int8_linear::kChunk);
  const int64_t strip_begin = strips * blockIdx.x / gridDim.x, strip_end = strips * (blockIdx.x + 1) / gridDim.x;
  const int passes = static_cast<int>((strip_end - strip_begin + kStrips - 1) / kStrips);
  const int steps = (chunks + kPassChunks - 1) / kPassChunks;  // stages a pass
  const int tail = static_cast<int>(K - int64_t{chunks} * int8_linear::kChunk);
  constexpr int kXTileBytes = kPassChunks * kRows * 128;
  constexpr bool kSwap = kRows == 8;  // x as the B operand (block comment above)
  static_assert(!kSwap || kStrips >= 2, "with 8 rows a pass has strips in pairs");
  constexpr int kAccumulators = kSwap ? kStrips / 2 : kStrips;  // mma tiles (16 x 8) a warp holds
  constexpr int kPerThread = (kAccumulators * 128 + kPassWarps * 32 - 1) / (kPassWarps * 32);

  if (threadIdx.x == kPassWarps * 32) {  // the producer: its tensor maps on their way while the block starts
    tma::prefetch_tensor_map(x_map);
    for (int i = 0; (1 << i) <= kStrips; ++i) tma::prefetch_tensor_map(w_maps.strips[i]);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < plan.stages; ++s) {
      tma::mbarrier_init(&full[s], 1);            // the producer's arrive, plus the copies' bytes
      tma::mbarrier_init(&empty[s], kPassWarps);  // one arrive per consumer warp
    }
    tma::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == kPassWarps) {  // producer
    if (lane != 0) return;
    const uint64_t evict_first = tma::evict_first(), evict_last = tma::evict_last();  // the weights are read
                                                                                      // once; x by every block
    int slot = 0;
    uint32_t phase = 0;
    for (int pass = 0; pass < passes; ++pass) {
      const int64_t p0 = strip_begin + int64_t{pass} * kStrips;
      const int pstrips = static_cast<int>(std::min<int64_t>(kStrips, strip_end - p0));
      for (int step = 0; step < steps; ++step) {
        tma::mbarrier_wait(&empty[slot], phase ^ 1);  // the slot's previous stage is consumed (a fresh
                                                      // barrier passes parity 1: the first round waits not)
        // Boxes reaching past K (and x's rows past M) arrive as zeros and count whole.
        tma::mbarrier_arrive_expect_tx(&full[slot], static_cast<uint32_t>(kXTileBytes + pstrips * kStripStageBytes));
        char* stage = ring + slot * plan.stage_bytes;
        tma::copy_3d(stage, x_map, 0, 0, step * kPassChunks, &full[slot], evict_last);
        for (int i = 3, p = 0; i >= 0; --i)
          if ((1 << i) <= kStrips && (pstrips >> i) & 1) {
            tma::copy_3d(stage + kXTileBytes + p * kStripStageBytes, w_maps.strips[i], 0, step * kPassChunks,
                         static_cast<int>(p0 + p), &full[slot], evict_first);
            p += 1 << i;
          }
        if (++slot == plan.stages) slot = 0, phase ^= 1;
      }
    }
    return;
  }

  int slot = 0;
  uint32_t phase = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const int64_t p0 = strip_begin + int64_t{pass} * kStrips;
    const int pstrips = static_cast<int>(std::min<int64_t>(kStrips, strip_end - p0));
    // The epilogue's scales and biases, read now so that their latency is not at the end.
    float out_scale[kPerThread], out_bias[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const Output o = output_of<kSwap>(threadIdx.x + i * kPassWarps * 32);
      const int64_t n = (p0 + o.strip) * 8 + o.channel;
      out_scale[i] = o.strip < pstrips ? scales[n] : 0.0f;
      out_bias[i] = o.strip < pstrips && bias != nullptr ? bias[n] : 0.0f;
    }
    float acc[kAccumulators][4] = {};
    for (int step = 0; step < steps; ++step) {
      tma::mbarrier_wait(&full[slot], phase);
      const char* stage = ring + slot * plan.stage_bytes;
      uint32_t a[4][4];  // x's fragments: A (16 rows), or with 8 rows B in a[.][0] and a[.][2]
#pragma unroll
      for (int tile = 0; tile < 4; ++tile) load_a_swizzled<kRows>(stage + warp * kRows * 128, tile, lane, a[tile]);
      uint32_t words[kStrips][4];
#pragma unroll
      for (int p = 0; p < kStrips; ++p) {  // a strip past the pass's end multiplies zeros
        const int4 b =
            p < pstrips ? reinterpret_cast<const int4*>(stage + kXTileBytes + p * kStripStageBytes + warp * 512)[lane]
                        : int4{0, 0, 0, 0};
        words[p][0] = uint32_t(b.x), words[p][1] = uint32_t(b.y), words[p][2] = uint32_t(b.z),
        words[p][3] = uint32_t(b.w);
      }
      __syncwarp();  // every lane has read the stage
      if (lane == 0) tma::mbarrier_arrive(&empty[slot]);
      multiply_chunk<T, kSwap, kStrips>(acc, a, words);
      if (++slot == plan.stages) slot = 0, phase ^= 1;
    }
    if (!kEvenK && warp == chunks % kPassWarps) {  // the K tail: the warp with the fewest chunks (or as few as any)
      const int8_t* tail_columns = qw + strips * 8 * chunks * int8_linear::kChunk;
      uint32_t a[4][4], words[kStrips][4];
      tail_a(reinterpret_cast<const uint16_t*>(x), ldx, M, int64_t{chunks} * int8_linear::kChunk, tail, lane, a);
#pragma unroll
      for (int p = 0; p < kStrips; ++p)  // a strip past the pass's end multiplies zeros
        tail_words(tail_columns + ((p0 + p) * 8 + lane / 4) * tail, tail, p < pstrips, lane, words[p]);
      multiply_chunk<T, kSwap, kStrips>(acc, a, words);
    }
    // The 8 warps of each strip (one per chunk of a stage) add their sums; named barrier 1 holds
    // the consumers only. The first barrier keeps this pass's writes behind the last pass's reads.
    asm volatile("bar.sync 1, %0;\n" ::"n"(kPassWarps * 32) : "memory");
#pragma unroll
    for (int q = 0; q < kAccumulators; ++q)
#pragma unroll
      for (int r = 0; r < 4; ++r) partial[((warp * kPassMaxStrips + q) * 4 + r) * 32 + lane] = acc[q][r];
    asm volatile("bar.sync 1, %0;\n" ::"n"(kPassWarps * 32) : "memory");
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kPassWarps * 32;
      const Output o = output_of<kSwap>(e);
      if (e >= kAccumulators * 128 || o.strip >= pstrips || o.row >= M) continue;
      float sum = 0;
#pragma unroll
      for (int w = 0; w < kPassWarps; ++w) sum += partial[w * kPassMaxStrips * 128 + e];
      y[o.row * N + (p0 + o.strip) * 8 + o.channel] = static_cast<T>(sum * out_scale[i] + out_bias[i]);
    }
  }
#else
  __trap();  // pass_small_m() launches this kernel only where its image was built for sm_90 or newer
#endif
}

/// True if the current device runs pass_kernel's sm_90 body (its image was built from PTX for
/// compute capability 9.0 or newer; cached per device).
inline bool pass_kernel_supported() { return opforge::cuda::ptx_version<pass_kernel<__half, 16, 1, true>>() >= 90; }

/// Launches pass_kernel<T, kRows, kStrips, K % 64 == 0> on `stream` with `plan`, its shared memory
/// allowed first.
template <class T, int kRows, int kStrips>
void launch_pass_kernel(const CUtensorMap& x_map, const WeightMaps& w_maps, const T* x, int64_t ldx, const int8_t* qw,
                        const float* scales, const float* bias, T* y, int64_t M, int64_t N, int64_t K,
                        const PassPlan& plan, cudaStream_t stream) {
  const auto kernel =
      K % int8_linear::kChunk == 0 ? pass_kernel<T, kRows, kStrips, true> : pass_kernel<T, kRows, kStrips, false>;
  const size_t smem = pass_smem_bytes(plan);
  opforge::cuda::allow_dynamic_smem(kernel, smem);
  kernel<<<plan.blocks, kPassThreads, smem, stream>>>(x_map, w_maps, x, ldx, qw, scales, bias, y, M, N, K, plan);
}

/// y [M, N8] (N8 = N / 8 * 8, rows N apart; nothing where N < 8) for M <= 16 rows of x [M, K]
/// (16-bit T, rows `ldx` elements apart, a multiple of 8) on sm_90: one block per multiprocessor
/// (at most one per strip); the strips of a pass the power of two that holds a block's share (at
/// most kPassMaxStrips, more passes past that; halved while fewer than 2 stages fit); as many ring
/// slots (up to kPassMaxStages) as the rest of the block's shared memory holds. Throws
/// opforge::InternalError where not even 2 stages of the fewest strips fit, or where the driver
/// refuses a tensor map.
template <class T>
void pass_small_m(const T* x, int64_t ldx, const int8_t* qw, const float* scales, const float* bias, T* y, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream) {
  const int64_t strips = N / 8, chunks = K / int8_linear::kChunk;
  if (strips == 0) return;
  const int rows = M <= 8 ? 8 : 16;
  PassPlan plan{};
  plan.blocks = static_cast<int>(std::min<int64_t>(opforge::cuda::sm_count(), strips));
  const int64_t share = (strips + plan.blocks - 1) / plan.blocks;
  const int fewest = rows == 8 ? 2 : 1;  // with 8 rows strips go in pairs
  plan.strips = fewest;
  while (plan.strips < kPassMaxStrips && plan.strips < share) plan.strips *= 2;
  const int64_t room = opforge::cuda::smem_per_block_optin() - pass_smem_bytes(PassPlan{0, 0, 0, 0});
  for (;; plan.strips /= 2) {  // fewer strips a pass where shared memory holds fewer than 2 stages
    plan.stage_bytes = kPassChunks * rows * 128 + plan.strips * kStripStageBytes;
    plan.stages = static_cast<int>(std::min<int64_t>(kPassMaxStages, room / plan.stage_bytes));
    if (plan.stages >= 2) break;
    if (plan.strips == fewest)
      throw opforge::InternalError("int8_linear: the device's shared memory per block holds no two ring stages");
  }
  CUtensorMap x_map{};
  WeightMaps w_maps{};
  if (chunks > 0) {  // with K == 0 no stage is copied (y = bias), and a map of no elements is invalid
    const auto ld64 = static_cast<uint64_t>(ldx), chunks64 = static_cast<uint64_t>(chunks);
    x_map = opforge::cuda::tiled_tensor_map<3>(
        CU_TENSOR_MAP_DATA_TYPE_UINT16, x, {64, static_cast<uint64_t>(M), chunks64}, {ld64 * 2, 128},
        {64, static_cast<uint32_t>(rows), kPassChunks}, CU_TENSOR_MAP_SWIZZLE_128B);
    for (int i = 0; (1 << i) <= plan.strips; ++i)
      w_maps.strips[i] = opforge::cuda::tiled_tensor_map<3>(
          CU_TENSOR_MAP_DATA_TYPE_UINT64, qw, {64, chunks64, static_cast<uint64_t>(strips)}, {512, chunks64 * 512},
          {64, kPassChunks, static_cast<uint32_t>(1 << i)});
  }
  auto launch = [&]<int kRows>() {
    constexpr int kFewest = kRows == 8 ? 2 : 1;  // with 8 rows strips go in pairs (plan.strips >= 2)
    switch (plan.strips) {
      case 1:
        return launch_pass_kernel<T, kRows, kFewest>(x_map, w_maps, x, ldx, qw, scales, bias, y, M, N, K, plan, stream);
      case 2:
        return launch_pass_kernel<T, kRows, 2>(x_map, w_maps, x, ldx, qw, scales, bias, y, M, N, K, plan, stream);
      case 4:
        return launch_pass_kernel<T, kRows, 4>(x_map, w_maps, x, ldx, qw, scales, bias, y, M, N, K, plan, stream);
      default:
        return launch_pass_kernel<T, kRows, 8>(x_map, w_maps, x, ldx, qw, scales, bias, y, M, N, K, plan, stream);
    }
  };
  if (rows == 8) launch.template operator()<8>();
  else launch.template operator()<16>();
}

// ---- M <= 64: what the tensor-core kernels leave -------------------------------------------------

/// xp [M, ldx] = x [M, K] (ldx >= K), zeros in the columns from K: rows 16-byte aligned for the
/// tensor-core kernels' copies where K % 8 != 0.
template <class T>
__global__ void pad_rows_kernel(const T* __restrict__ x, T* __restrict__ xp, int64_t M, int64_t K, int64_t ldx) {
  for (int64_t i = opforge::kernel::global_index(); i < M * ldx; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = i / ldx, k = i % ldx;
    xp[i] = k < K ? x[m * K + k] : static_cast<T>(0.0f);
  }
}

constexpr int kTailRowThreads = 128;

/// y[m][n] for the tail rows of the weight (n >= N8 = N / 8 * 8, row-major in qweight: W[n][k] at
/// n * K + k) and the rows m of x [M, K] (16-bit T, dense), block (n - N8, m) each: the float32
/// sum of x[m][k] * q[n][k] (exact integer weights, as the tensor-core kernels multiply them),
/// scaled once, plus the bias.
template <class T>
__global__ void __launch_bounds__(kTailRowThreads)
    tail_rows_kernel(const T* __restrict__ x, const int8_t* __restrict__ q, const float* __restrict__ scales,
                     const float* __restrict__ bias, T* __restrict__ y, int64_t N, int64_t K) {
  const int64_t n = N / int8_linear::kStrip * int8_linear::kStrip + blockIdx.x, m = blockIdx.y;
  float sum = 0;
  for (int64_t k = threadIdx.x; k < K; k += kTailRowThreads)
    sum += static_cast<float>(x[m * K + k]) * static_cast<float>(q[n * K + k]);
  sum = opforge::kernel::block_sum(sum);
  if (threadIdx.x == 0) y[m * N + n] = static_cast<T>(sum * scales[n] + (bias != nullptr ? bias[n] : 0.0f));
}

/// y [M, N] = x [M, K] (qweight dequantised)^T + bias for M <= 64 rows of 16-bit T: the whole
/// strips by pass_small_m (M <= 16 where the device runs it) or small_m (reading x's rows from an
/// aligned copy where K % 8 != 0), the tail rows (N % 8) by tail_rows_kernel.
template <class T>
void small_batch(const opforge::Context& ctx, const T* x, const int8_t* qw, const float* scales, const float* bias,
                 T* y, int64_t M, int64_t N, int64_t K) {
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  const T* xs = x;
  int64_t ldx = K;
  if (K % 8 != 0 && K >= int8_linear::kChunk && N >= int8_linear::kStrip) {  // whole chunks of x to copy
    ldx = (K + 7) / 8 * 8;
    T* xp = static_cast<T*>(ctx.allocate(static_cast<size_t>(M * ldx) * sizeof(T)));
    pad_rows_kernel<T><<<opforge::cuda::grid_for(M * ldx, kThreads), kThreads, 0, stream>>>(x, xp, M, K, ldx);
    xs = xp;
  }
  if (M <= 16 && pass_kernel_supported()) pass_small_m<T>(xs, ldx, qw, scales, bias, y, M, N, K, stream);
  else small_m<T, 4>(xs, ldx, reinterpret_cast<const int4*>(qw), scales, bias, y, M, N, K, stream);
  if (N % int8_linear::kStrip != 0)
    tail_rows_kernel<T><<<dim3(static_cast<unsigned>(N % int8_linear::kStrip), static_cast<unsigned>(M)),
                          kTailRowThreads, 0, stream>>>(x, qw, scales, bias, y, N, K);
}

// ---- larger M: dequantise, then cuBLAS -------------------------------------------------------

/// 16 bytes of weights, read once: through the non-coherent path, not kept in L1.
__device__ int4 load_streamed(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// The aligned block (int8_linear.h) of w [N, K] in T, rows `ldw` elements apart (a multiple of
/// 8), each weight dequantised as the small-M kernel does. One warp per (strip, chunk) of the
/// packed layout: its 32 lanes read 512 contiguous bytes (8 output channels x 64 input channels),
/// scatter them through shared memory, and write the 8 rows of 64 as 16-byte vectors, 8 lanes a
/// row, so reads and writes are both whole sectors.
template <class T>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const int4* __restrict__ qw, const float* __restrict__ scales, T* __restrict__ w, int64_t N,
                      int64_t K, int64_t ldw) {
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
      *reinterpret_cast<int4*>(w + (strip * 8 + row) * ldw + chunk * kCols + col) =
          *reinterpret_cast<const int4*>(&rows[warp][row][col]);
    }
    __syncwarp();
  }
}

/// The rest of w [N, K] (rows `ldw` >= K elements apart): the tail columns and tail rows of the
/// weight (the qweight bytes from N8 * K64 on, in their order; int8_linear.h) dequantised as
/// dequantize_kernel does the aligned block, and zeros in the columns from K to ldw.
template <class T>
__global__ void dequantize_tail_kernel(const int8_t* __restrict__ q, const float* __restrict__ scales,
                                       T* __restrict__ w, int64_t N, int64_t K, int64_t ldw) {
  const int64_t N8 = N / int8_linear::kStrip * int8_linear::kStrip, K64 = K / int8_linear::kChunk * int8_linear::kChunk;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x, tail = K - K64, begin = N8 * K64;
  for (int64_t i = begin + opforge::kernel::global_index(); i < N * K; i += stride) {
    const bool tail_column = i < N8 * K;  // else a tail row, row-major
    const int64_t n = tail_column ? (i - begin) / tail : i / K, k = tail_column ? K64 + (i - begin) % tail : i % K;
    w[n * ldw + k] = static_cast<T>(int8_linear::dequantise(q[i], scales[n]));
  }
  for (int64_t i = opforge::kernel::global_index(); i < N * (ldw - K); i += stride)
    w[i / (ldw - K) * ldw + K + i % (ldw - K)] = static_cast<T>(0.0f);
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
  const int64_t ldw = (K + 7) / 8 * 8;  // w's rows 16-byte aligned for dequantize_kernel's stores
  const int64_t aligned =
      N / int8_linear::kStrip * int8_linear::kStrip * (K / int8_linear::kChunk * int8_linear::kChunk);
  T* w = static_cast<T*>(ctx.allocate(static_cast<size_t>(N * ldw) * sizeof(T)));
  dequantize_kernel<T>
      <<<opforge::cuda::grid_for(aligned / 16, kThreads), kThreads, 0, stream>>>(qw, scales, w, N, K, ldw);
  if (aligned < N * ldw)  // a tail (N % 8 or K % 64), or padding columns
    dequantize_tail_kernel<T><<<opforge::cuda::grid_for(N * ldw - aligned, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const int8_t*>(qw), scales, w, N, K, ldw);
  if (bias != nullptr)
    fill_bias_kernel<T><<<opforge::cuda::grid_for(M * N, kThreads), kThreads, 0, stream>>>(bias, y, M, N);
  opforge::cuda::check_launch("int8_linear");
  // cuBLAS wants leading dims >= 1, also for K == 0
  const int ldx = static_cast<int>(std::max<int64_t>(K, 1)), lda = static_cast<int>(std::max<int64_t>(ldw, 1));
  constexpr cudaDataType_t type = std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
  const float alpha = 1.0f, beta = bias != nullptr ? 1.0f : 0.0f;
  cublasHandle_t handle = cublas_handle();
  check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  // cuBLAS's workspace from the framework's allocator, so that nothing is cudaMalloc'ed during a
  // call (CUDA-graph capture; torch does the same): 32 MiB, cuBLAS's default on Hopper.
  constexpr size_t kWorkspace = size_t{32} << 20;
  check_cublas(cublasSetWorkspace(handle, ctx.allocate(kWorkspace), kWorkspace), "cublasSetWorkspace");
  // Column-major, as cuBLAS sees row-major buffers: y^T [N, M] = w [N, K] (from w^T, ld ldw) * x^T [K, M].
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                            static_cast<int>(K), &alpha, w, type, lda, x, type, ldx, &beta, y, type,
                            static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
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
      acc += double(x[m * K + k]) * int8_linear::dequantise(q[int8_linear::packed_offset(n, k, N, K)], scales[n]);
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
    if (N > 0)
      pack_kernel<T><<<N, kThreads, 0, stream>>>(weight.data<T>(), qweight.data<int8_t>(), scales.data<float>(), N, K);
  });
  if (bias.defined() && N > 0) {
    opforge::cuda::visit_dtype<opforge::floating>(bias.dtype(), [&]<class B>(opforge::type_tag<B>) {
      to_float_kernel<B>
          <<<opforge::cuda::grid_for(N, kThreads), kThreads, 0, stream>>>(bias.data<B>(), bias_fp32.data<float>(), N);
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
    } else if (M <= 64) {
      small_batch<T>(ctx, x.data<T>(), qweight.data<int8_t>(), scales.data<float>(), bias, y.data<T>(), M, N, K);
    } else {
      dequantize_and_gemm<T>(ctx, x.data<T>(), qw, scales.data<float>(), bias, y.data<T>(), M, N, K);
    }
  });
  opforge::cuda::check_launch("int8_linear");
}
