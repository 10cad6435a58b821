// attention, compiled at run time: fused scaled-dot-product attention forward, in the manner of
// FlashAttention-2 (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning", 2023, Algorithm 1): the scores never leave registers; each block keeps a
// running row maximum and sum (online softmax, Milakov & Gimelshein 2018) and rescales its
// output accumulator as it walks over the keys.
//
// One block of 4 warps computes kBlockM = 128 query rows of one (batch, head); each warp owns
// 32 rows (two 16-row MMA tiles) so that every K and V fragment read from shared memory feeds
// two tensor-core MMAs. Keys and values go through shared memory kBlockN rows at a time (32
// for head dim 128, 64 for 64; measured on the H200, see bench/RESULTS.md),
// loaded with cp.async while the previous product is computed (V during Q K^T, the next K
// during softmax and P V). Shared-memory rows are XOR-swizzled in 16-byte chunks so that
// ldmatrix reads are free of bank conflicts. Products use mma.sync m16n8k16 (fp16/bf16 in,
// fp32 accumulate); P is rounded to the input dtype before P V, as in FlashAttention-2.
//
// Arguments (opforge run-time kernel convention): q, k, v [B, H, Sq|Sk, D] dense, mask [B, Sk]
// or null, o [B, H, Sq, D]; then the grid function's heads, Sq, Sk; then scale (0: 1/sqrt(D)).
// Grid: (ceil(Sq / 128), H, B), 128 threads, (128 + 2 * kBlockN) * D * sizeof(T) bytes of
// dynamic shared memory (attention.cpp's grid function).
#include <opforge/kernel.cuh>

namespace attention_detail {

constexpr int kBlockM = 128, kThreads = 128;
/// Keys per step: 32 for head dim 128 (more would spill registers), 64 for head dims 32 and 64.
template <int D>
constexpr int kBlockN = D == 128 ? 32 : 64;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

/// Four 8x8 b16 matrices from shared memory; `address` is a shared-window byte address.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// d += a * b for one m16n8k16 tile (PTX ISA, "Matrix Fragments for mma.m16n8k16").
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (opforge::kernel::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Two floats rounded to T and packed (the lower column in the low half, as MMA operands are).
template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  if constexpr (opforge::kernel::is_same<T, __nv_bfloat16>::value) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
  }
}

/// The XOR pattern of row `row` in a shared tile of rows of D elements: chunk c of the row is
/// stored at chunk c ^ swizzle(row), so that the 8 rows an ldmatrix reads hit 8 different
/// 16-byte bank groups. Rows of 128 or 256 bytes (D = 64, 128): r % 8. Rows of 64 bytes
/// (D = 32) share bank groups pairwise, so (r / 2) % 4 over the 4 chunks.
template <int D>
__device__ __forceinline__ int swizzle(int row) {
  return D >= 64 ? (row & 7) : ((row >> 1) & 3);
}

/// Element offset of (row, 16-byte chunk) in a swizzled shared tile of rows of D elements.
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ swizzle<D>(row)) << 3);
}

/// ldmatrix addresses for a lane that reads row `row` (plus multiples of 8) and chunk
/// 2 * j + `half` of a swizzled tile at shared address `tile`: because the chunk's XOR with
/// the row only touches its low three bits, chunk 2 * j + half lands at
/// base[j % 4] + (j / 4) * 128 bytes, so four registers serve every j (the rest is an
/// immediate offset).
template <int D>
struct TileAddress {
  unsigned base[4];
  __device__ TileAddress(unsigned tile, int row, int half) {
#pragma unroll
    for (int j = 0; j < 4; ++j) base[j] = tile + row * D * 2 + (((half ^ swizzle<D>(row)) ^ (2 * j)) << 4);
  }
  /// Byte address of chunk pair `j` (compile-time after unrolling), `row_offset` rows further.
  __device__ unsigned operator()(int j, int row_offset) const { return base[j % 4] + (j / 4) * 128 + row_offset * D * 2; }
};

/// Copies rows [row0, row0 + ROWS) of a [rows, D] matrix into a swizzled shared tile with
/// cp.async (16-byte chunks: opforge passes dense inputs 16-byte aligned); rows at or past
/// `limit` become zeros.
template <class T, int D, int ROWS>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t row0, int64_t limit) {
  constexpr int kChunks = D / 8;
  static_assert(ROWS * kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / kThreads; ++it) {
    const int i = it * kThreads + threadIdx.x, r = i / kChunks, c = i % kChunks;
    const bool valid = row0 + r < limit;
    const T* from = src + (valid ? (row0 + r) * D + c * 8 : 0);
    cp_async_16(tile + swizzled<D>(r, c), from, valid);
  }
}

}  // namespace attention_detail

template <class T, int D, bool kCausal>
__global__ void __launch_bounds__(128, 2)
    attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ mask,
              T* __restrict__ o, int64_t heads, int64_t sq, int64_t sk, double scale) {
  using namespace attention_detail;
  static_assert(D == 32 || D == 64 || D == 128, "head dim 32, 64 or 128");
  constexpr int kBlockN = attention_detail::kBlockN<D>, kTilesN = kBlockN / 8, kTilesD = D / 8;
  extern __shared__ __align__(128) unsigned char shared[];
  T* sQ = reinterpret_cast<T*>(shared);
  T* sK = sQ + kBlockM * D;
  T* sV = sK + kBlockN * D;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t batch = blockIdx.z, bh = batch * heads + blockIdx.y;
  // Causal blocks do less work the earlier their rows: start the heaviest first.
  const int64_t m0 = static_cast<int64_t>(kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBlockM;
  const T* qb = q + bh * sq * D;
  const T* kb = k + bh * sk * D;
  const T* vb = v + bh * sk * D;
  const T* mb = mask ? mask + batch * sk : nullptr;
  const float scale_log2 = static_cast<float>(scale > 0 ? scale : 1.0 / sqrt(static_cast<double>(D))) * kLog2e;

  const int64_t n_end = kCausal ? (sk < m0 + kBlockM ? sk : m0 + kBlockM) : sk;
  const int n_blocks = static_cast<int>((n_end + kBlockN - 1) / kBlockN);

  load_tile<T, D, kBlockM>(sQ, qb, m0, sq);
  if (n_blocks > 0) load_tile<T, D, kBlockN>(sK, kb, 0, sk);
  cp_async_commit();

  float acc[2][kTilesD][4];
  float row_max[2][2], row_sum[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kTilesD; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.0f;
    row_max[mt][0] = row_max[mt][1] = neg_inf();
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  // This thread's rows, relative to m0: warp * 32 + mt * 16 + lane / 4 (+ 8 for accumulator
  // elements 2, 3); its columns, relative to the key block: nt * 8 + (lane % 4) * 2 (+ 1).
  const int row_in_block = warp * 32 + lane / 4;
  const TileAddress<D> q_at(smem_address(sQ), warp * 32 + (lane & 15), lane >> 4);
  const TileAddress<D> k_at(smem_address(sK), (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const TileAddress<D> v_at(smem_address(sV), lane & 15, lane >> 4);

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int64_t n0 = static_cast<int64_t>(nb) * kBlockN;
    cp_async_wait_all();
    __syncthreads();  // K (and Q) landed; every warp is done with the previous V
    load_tile<T, D, kBlockN>(sV, vb, n0, sk);
    cp_async_commit();

    // S = Q K^T for this warp's 32 rows and the block's 64 keys.
    float s[2][kTilesN][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(a[mt], q_at(kk, mt * 16));
#pragma unroll
      for (int np = 0; np < kTilesN / 2; ++np) {
        unsigned b[4];
        ldmatrix_x4(b, k_at(kk, np * 16));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma<T>(s[mt][2 * np], a[mt], b[0], b[1]);
          mma<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    cp_async_wait_all();
    __syncthreads();  // V landed; every warp is done with K
    if (nb + 1 < n_blocks) {
      load_tile<T, D, kBlockN>(sK, kb, n0 + kBlockN, sk);
      cp_async_commit();
    }

    // Scores in log2 units, masked: padding mask added, keys past Sk and (causal) keys after
    // the query removed. Columns and rows relative to the block: key n0 + col, query m0 + row.
    const int keys = static_cast<int>(sk - n0 < kBlockN ? sk - n0 : kBlockN);
    const int diagonal = kCausal ? static_cast<int>(m0 - n0) : 0;  // key col is after query row if col > row + diagonal
    const bool edge = keys < kBlockN || (kCausal && diagonal < kBlockN);
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = nt * 8 + (lane & 3) * 2 + c;
        const float add = mb != nullptr && col < keys ? opforge::kernel::to_acc(mb[n0 + col]) * kLog2e : 0.0f;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& x = s[mt][nt][2 * h + c];
            x = x * scale_log2 + add;
            if (edge && (col >= keys || (kCausal && col > row_in_block + mt * 16 + h * 8 + diagonal))) x = neg_inf();
          }
        }
      }
    }

    // Online softmax: new row maxima, rescale the accumulator and the running sums.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < kTilesN; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == neg_inf() ? 0.0f : mx;  // a row masked so far stays at zero
        const float correction = fast_exp2(row_max[mt][h] - base);
        row_max[mt][h] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kTilesN; ++nt) {
          s[mt][nt][2 * h] = fast_exp2(s[mt][nt][2 * h] - base);
          s[mt][nt][2 * h + 1] = fast_exp2(s[mt][nt][2 * h + 1] - base);
          sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
        }
        row_sum[mt][h] = row_sum[mt][h] * correction + sum;
#pragma unroll
        for (int dt = 0; dt < kTilesD; ++dt) {
          acc[mt][dt][2 * h] *= correction;
          acc[mt][dt][2 * h + 1] *= correction;
        }
      }
    }

    // O += P V: the score accumulators are laid out as the A operand of the next MMA.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      unsigned p[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        p[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        p[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        p[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        p[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kTilesD / 2; ++dp) {
        unsigned b[4];
        ldmatrix_x4_trans(b, v_at(dp, kk * 16));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma<T>(acc[mt][2 * dp], p[mt], b[0], b[1]);
          mma<T>(acc[mt][2 * dp + 1], p[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait_all();

  // o = acc / row sum (rows whose every key is masked out get zeros).
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;  // NaN stays NaN
      const int64_t row = m0 + row_in_block + mt * 16 + h * 8;
      if (row >= sq) continue;
      T* out = o + (bh * sq + row) * D + (lane & 3) * 2;
#pragma unroll
      for (int dt = 0; dt < kTilesD; ++dt)
        *reinterpret_cast<unsigned*>(out + dt * 8) = pack2<T>(acc[mt][dt][2 * h] * inv, acc[mt][dt][2 * h + 1] * inv);
    }
  }
}
