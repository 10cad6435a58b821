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
// On Hopper (compiled as sm_90a), head dims 64 and 128 take another path, attention_sm90 below, in the
// manner of FlashAttention-3 (Shah et al., "FlashAttention-3: Fast and Accurate Attention with
// Asynchrony and Low-precision", 2024): warp specialisation, a producer warpgroup whose one
// thread moves Q and a two-stage ring of K and V tiles by bulk tensor copies (TMA) onto
// mbarriers, and consumer warpgroups of 64 query rows each (two at head dim 128, three at 64)
// that run warpgroup MMAs (wgmma: Q and K from 128-byte-swizzled shared memory, P from
// registers) over 128 keys per step. Each consumer overlaps the P V product of one step with the
// softmax of the next (Algorithm 2, intra-warpgroup overlap), and the consumers take turns
// issuing their products (ping-pong, named barriers) so that one's softmax runs while another's
// MMAs do; setmaxnreg moves registers from the producer to the consumers.
//
// Arguments (opforge run-time kernel convention): q, k, v [B, H, Sq|Sk, D] with contiguous,
// 16-byte aligned rows (opforge::contiguous_last_dim), mask [B, Sk] or null, o [B, H, Sq, D]
// dense, lse [B, H, Sq] float32 dense (each row's log-sum-exp of its scores, natural log; -inf
// where every key is masked); then the grid function's heads, Sq, Sk and the batch, head and row strides of q, k,
// v; its tensor maps of q, k and v (boxes of 64 columns by 128 rows, q's by attention_sm90::kRows
// rows, 128-byte swizzle; used by the Hopper path only, all zeros otherwise); then scale
// (0: 1/sqrt(D)).
// Grid: (ceil(Sq / 128), H, B); 128 threads and (128 + 2 * kBlockN) * D * sizeof(T) bytes of
// dynamic shared memory, or on the Hopper path (ceil(Sq / kRows), H, B),
// attention_detail::kThreadsFor threads and attention_sm90::Smem::kBytes (attention.cpp's grid
// function, which asks opforge::kernel_target).
#include <opforge/kernel.cuh>
#include <opforge/tma.cuh>

namespace attention_detail {

constexpr int kBlockM = 128, kThreads = 128;
/// Keys per step: 32 for head dim 128 (more would spill registers), 64 for head dims 32 and 64.
template <int D>
constexpr int kBlockN = D == 128 ? 32 : 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool kHopper = true;  // compiled as sm_90a: wgmma available
#else
constexpr bool kHopper = false;
#endif
/// Whether head dim D takes the wgmma path; that path's consumer warpgroups (64 query rows
/// each: three at head dim 64, where a step's softmax costs about as much as its products and
/// two consumers cannot hide each other's, two at 128; FlashAttention-3's 192- and 128-row
/// tiles), and threads per block (a producer warpgroup and the consumers).
template <int D>
constexpr bool kUsesWgmma = (kHopper && D >= 64);
template <int D>
constexpr int kConsumers = D == 64 ? 3 : 2;
template <int D>
constexpr int kThreadsFor = kUsesWgmma<D> ? 128 * (1 + kConsumers<D>) : kThreads;
template <int D>
constexpr int kMinBlocksFor = kUsesWgmma<D> ? 1 : 2;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

/// The dynamic shared memory the launch gave the block, in bytes (PTX %dynamic_smem_size).
__device__ __forceinline__ unsigned dynamic_shared_bytes() {
  unsigned bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(bytes));
  return bytes;
}

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

// Helpers over one 16-row accumulator tile, shared by both paths: mma.sync m16n8 and wgmma
// accumulators have the same layout, tile[j][e] being row lane / 4 (+ 8 for e >= 2) and column
// 8 j + 2 (lane % 4) + e % 2 of the tile (PTX ISA, "Matrix Fragments for mma.m16n8k16" and
// "Register Fragments" of wgmma); each row's values are spread over the 4 threads of a quad.

/// One online-softmax step (Milakov & Gimelshein 2018) for the thread's two rows of a tile of
/// scores that are `scale` times smaller than log2 units (1: in log2 units; the scale in log2
/// units for raw scores, so that scaling and subtracting the maximum are one multiply-add, as
/// FlashAttention-2 does; scale > 0, so the maximum of raw scores is the raw maximum): the new
/// row maxima (over the quad, in log2 units), the scores exponentiated in place relative to
/// them, the running sums rescaled and extended, and in `correction` the factor by which each
/// row's output accumulators must be rescaled.
template <int N>
__device__ __forceinline__ void online_softmax(float (&s)[N][4], float (&row_max)[2], float (&row_sum)[2],
                                               float (&correction)[2], float scale) {
  // Both rows at once, each over four independent partial maxima and sums: the chains of
  // dependent max and add instructions are a quarter as long.
  static_assert(N % 4 == 0, "whole groups of four 8-column chunks");
  float part[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[h][i] = fmaxf(s[i][2 * h], s[i][2 * h + 1]);
#pragma unroll
  for (int j = 4; j < N; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) part[h][j % 4] = fmaxf(part[h][j % 4], fmaxf(s[j][2 * h], s[j][2 * h + 1]));
  float base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(fmaxf(part[h][0], part[h][1]), fmaxf(part[h][2], part[h][3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(row_max[h], mx * scale);
    base[h] = mx == neg_inf() ? 0.0f : mx;  // a row masked so far stays at zero
    correction[h] = fast_exp2(row_max[h] - base[h]);
    row_max[h] = mx;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = fast_exp2(fmaf(s[j][e], scale, -base[e / 2]));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float pair = s[j][2 * h] + s[j][2 * h + 1];
      part[h][j % 4] = j < 4 ? pair : part[h][j % 4] + pair;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    row_sum[h] = row_sum[h] * correction[h] + ((part[h][0] + part[h][1]) + (part[h][2] + part[h][3]));
}

/// Scales a tile of raw scores to log2 units and adds the padding mask, `mask` pointing at the
/// tile's first key: s = s * scale_log2 + mask * log2(e) for key columns below `keys` (those at
/// or past it are mask_edge's).
template <class T, int N>
__device__ __forceinline__ void add_mask(float (&s)[N][4], const T* mask, int keys, float scale_log2, int lane) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = j * 8 + (lane & 3) * 2 + c;
      const float add = col < keys ? opforge::kernel::to_acc(mask[col]) * kLog2e : 0.0f;
      s[j][c] = s[j][c] * scale_log2 + add;
      s[j][2 + c] = s[j][2 + c] * scale_log2 + add;
    }
  }
}

/// Removes (sets to -inf) the scores of key columns at or past `keys` and, with kCausal, of key
/// columns after the query: column col of the thread's row r (lane / 4, + 8 for elements 2, 3)
/// is after it if col > r + `diagonal` (the tile's first query minus its first key).
template <bool kCausal, int N>
__device__ __forceinline__ void mask_edge(float (&s)[N][4], int keys, int diagonal, int lane) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = j * 8 + (lane & 3) * 2 + e % 2, row = lane / 4 + (e / 2) * 8;
      if (col >= keys || (kCausal && col > row + diagonal)) s[j][e] = neg_inf();
    }
  }
}

/// Scales each of the thread's two rows of an output tile by its correction.
template <int N>
__device__ __forceinline__ void rescale(float (&acc)[N][4], const float (&correction)[2]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    acc[j][0] *= correction[0];
    acc[j][1] *= correction[0];
    acc[j][2] *= correction[1];
    acc[j][3] *= correction[1];
  }
}

/// The A operand of the P V product for keys 16 kk .. 16 kk + 15: the probabilities of chunks
/// 2 kk and 2 kk + 1 rounded to T and packed (the accumulator layout is the A fragment layout).
template <class T, int N>
__device__ __forceinline__ void pack_p(const float (&s)[N][4], int kk, unsigned (&p)[4]) {
  p[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
  p[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
  p[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  p[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/// o = acc / row sum for the thread's two rows of a tile whose first row is `row0` (rows whose
/// every key is masked out get zeros, NaN stays NaN), and the rows' log-sum-exp
/// lse = (row max + log2(row sum)) ln 2 (the online softmax's statistics, in log2 units of the
/// scores; -inf for a row without keys), written by the quad's first lane; rows at or past `sq`
/// are not stored.
template <class T, int D>
__device__ __forceinline__ void store_rows(const float (&acc)[D / 8][4], const float (&row_max)[2],
                                           const float (&row_sum)[2], T* o, float* lse, int64_t bh, int64_t sq,
                                           int64_t row0, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    const int64_t row = row0 + h * 8;
    if (row >= sq) continue;
    if ((lane & 3) == 0) lse[bh * sq + row] = sum == 0.0f ? neg_inf() : (row_max[h] + log2f(sum)) * kLn2;
    T* out = o + (bh * sq + row) * D + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<unsigned*>(out + j * 8) = pack2<T>(acc[j][2 * h] * inv, acc[j][2 * h + 1] * inv);
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
  __device__ unsigned operator()(int j, int row_offset) const {
    return base[j % 4] + (j / 4) * 128 + row_offset * D * 2;
  }
};

/// Copies rows [row0, row0 + ROWS) of a [rows, D] matrix (rows `row_stride` elements apart)
/// into shared memory with cp.async by THREADS threads, 16-byte chunk c of row r to
/// `to(r, c)` (opforge passes rows 16-byte aligned); rows at or past `limit` become zeros.
template <class T, int D, int ROWS, int THREADS, class To>
__device__ __forceinline__ void load_rows(const T* src, int64_t row_stride, int64_t row0, int64_t limit, To to) {
  constexpr int kChunks = D / 8;
  static_assert(ROWS * kChunks % THREADS == 0, "whole chunks per thread");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int i = it * THREADS + threadIdx.x, r = i / kChunks, c = i % kChunks;
    const bool valid = row0 + r < limit;
    cp_async_16(to(r, c), src + (valid ? (row0 + r) * row_stride + c * 8 : 0), valid);
  }
}

/// load_rows by the block's kThreads threads into a swizzled shared tile of rows of D elements.
template <class T, int D, int ROWS>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t row_stride, int64_t row0, int64_t limit) {
  load_rows<T, D, ROWS, kThreads>(src, row_stride, row0, limit,
                                  [tile](int r, int c) { return tile + swizzled<D>(r, c); });
}

/// Batch, head and row strides (elements) of one of q, k, v, whose rows are contiguous and
/// 16-byte aligned (opforge::contiguous_last_dim: a head split's transpose arrives as is).
struct Strides {
  int64_t batch, head, row;
};
/// The problem: heads, query and key lengths, and the strides of q, k and v.
struct Layout {
  int64_t heads, sq, sk;
  Strides q, k, v;
};

/// What one block of either path works on: its (batch, head) `bh`, its first query row `m0`
/// (causal grids run the heaviest blocks, the last rows, first), the slices of q, k, v and the
/// mask, the scale in log2 units, and the number of key blocks of kBlockN it visits (causal:
/// none past its last row); kRows query rows per block.
template <class T, int D, int kRows, int kBlockN, bool kCausal>
struct BlockWork {
  int64_t bh, m0;
  const T *q, *k, *v, *mask;
  float scale_log2;
  int n_blocks;
  __device__ BlockWork(const T* q_, const T* k_, const T* v_, const T* mask_, const Layout& l, double scale) {
    const int64_t batch = blockIdx.z, head = blockIdx.y, sk = l.sk;
    bh = batch * l.heads + head;
    m0 = static_cast<int64_t>(kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kRows;
    q = q_ + batch * l.q.batch + head * l.q.head;
    k = k_ + batch * l.k.batch + head * l.k.head;
    v = v_ + batch * l.v.batch + head * l.v.head;
    mask = mask_ ? mask_ + batch * sk : nullptr;
    scale_log2 = static_cast<float>(scale > 0 ? scale : 1.0 / sqrt(static_cast<double>(D))) * kLog2e;
    const int64_t n_end = kCausal ? (sk < m0 + kRows ? sk : m0 + kRows) : sk;
    n_blocks = static_cast<int>((n_end + kBlockN - 1) / kBlockN);
  }
};
}  // namespace attention_detail

namespace attention_detail {

/// The mma.sync path: every head dim off Hopper, head dims 32 and 64 on it.
template <class T, int D, bool kCausal>
__device__ __forceinline__ void attention_mma(unsigned char* shared, const T* __restrict__ q, const T* __restrict__ k,
                                              const T* __restrict__ v, const T* __restrict__ mask, T* __restrict__ o,
                                              float* __restrict__ lse, const Layout& l, double scale) {
  const int64_t sq = l.sq, sk = l.sk;
  constexpr int kBlockN = attention_detail::kBlockN<D>, kTilesN = kBlockN / 8, kTilesD = D / 8;
  // The grid function and this path disagree: fail, never compute wrong.
  if (blockDim.x != kThreads || dynamic_shared_bytes() < (kBlockM + 2 * kBlockN) * D * sizeof(T)) __trap();
  T* sQ = reinterpret_cast<T*>(shared);
  T* sK = sQ + kBlockM * D;
  T* sV = sK + kBlockN * D;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BlockWork<T, D, kBlockM, kBlockN, kCausal> work(q, k, v, mask, l, scale);
  const int64_t bh = work.bh, m0 = work.m0;
  const T *qb = work.q, *kb = work.k, *vb = work.v, *mb = work.mask;
  const float scale_log2 = work.scale_log2;
  const int n_blocks = work.n_blocks;

  load_tile<T, D, kBlockM>(sQ, qb, l.q.row, m0, sq);
  if (n_blocks > 0) load_tile<T, D, kBlockN>(sK, kb, l.k.row, 0, sk);
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
    load_tile<T, D, kBlockN>(sV, vb, l.v.row, n0, sk);
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
      load_tile<T, D, kBlockN>(sK, kb, l.k.row, n0 + kBlockN, sk);
      cp_async_commit();
    }

    // Masks: the padding mask added (scores then in log2 units), keys past Sk and (causal)
    // keys after the query removed (key n0 + col of query m0 + row, col > row + m0 - n0);
    // without a padding mask the scale is applied in the exponent.
    const int keys = static_cast<int>(sk - n0 < kBlockN ? sk - n0 : kBlockN);
    const int diagonal = kCausal ? static_cast<int>(m0 - n0) : 0;
    const bool edge = keys < kBlockN || (kCausal && diagonal < kBlockN);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      if (mb != nullptr) add_mask(s[mt], mb + n0, keys, scale_log2, lane);
      if (edge) mask_edge<kCausal>(s[mt], keys, warp * 32 + mt * 16 + diagonal, lane);
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      float correction[2];
      online_softmax(s[mt], row_max[mt], row_sum[mt], correction, mb != nullptr ? 1.0f : scale_log2);
      rescale(acc[mt], correction);
    }

    // O += P V: the score accumulators are laid out as the A operand of the next MMA.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      unsigned p[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) pack_p<T>(s[mt], kk, p[mt]);
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

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    store_rows<T, D>(acc[mt], row_max[mt], row_sum[mt], o, lse, bh, sq, m0 + row_in_block + mt * 16, lane);
}

}  // namespace attention_detail

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace attention_sm90 {

using attention_detail::neg_inf;

constexpr int kBlockN = 128, kStages = 2;
using attention_detail::kConsumers;
/// Query rows per block: 64 per consumer warpgroup.
template <int D>
constexpr int kRows = 64 * kConsumers<D>;
/// One 64-column half of a tile of 128 keys: 128 rows of 128 bytes, a box of the tensor maps
/// of k and v (64 columns by 128 rows; q's boxes are kRows<D> rows); the copy engine's 128-byte
/// swizzle stores row r's 16-byte chunk c at chunk c ^ (r % 8) (cute's Swizzle<3, 4, 3>), the
/// layout descriptors of layout type 1 read.
constexpr unsigned kHalf = kBlockN * 128;
/// Registers a thread of the producer and of a consumer warpgroup holds after setmaxnreg:
/// FlashAttention-3's splits, 128 x 24 + 256 x 240 <= 65536 for two consumers and
/// 128 x 32 + 384 x 160 = 65536 for three.
template <int D>
constexpr int kProducerRegisters = kConsumers<D> == 3 ? 32 : 24;
template <int D>
constexpr int kConsumerRegisters = kConsumers<D> == 3 ? 160 : 240;

/// Shared memory for head dim D, from a 1024-byte-aligned base: Q (D / 64 halves of kRows<D>
/// rows), then K in kStages stages, then V in kStages stages, each a tile of D / 64 halves of
/// kHalf; then the mbarriers (Q's, and full and empty ones per stage of K and of V). The 1024
/// spare bytes pay for aligning the base (attention.cpp's grid function asks the same).
template <int D>
struct Smem {
  static constexpr unsigned kQHalf = kRows<D> * 128, kTile = D / 64 * kHalf, kQ = 0, kK = D / 64 * kQHalf,
                            kV = kK + kStages * kTile, kBarriers = kV + kStages * kTile,
                            kBytes = kBarriers + (1 + 4 * kStages) * 8 + 1024;
  static_assert(kBytes <= 227 * 1024, "a block of sm_90 takes at most 227 KiB of shared memory");
  static __device__ unsigned k_tile(int stage) { return kK + stage * kTile; }
  static __device__ unsigned v_tile(int stage) { return kV + stage * kTile; }
};

/// The mbarriers in shared memory: Q's full one, and per stage K's and V's full and empty ones.
struct Barriers {
  uint64_t* base;
  __device__ uint64_t* q_full() const { return base; }
  __device__ uint64_t* k_full(int stage) const { return base + 1 + stage; }
  __device__ uint64_t* k_empty(int stage) const { return base + 1 + kStages + stage; }
  __device__ uint64_t* v_full(int stage) const { return base + 1 + 2 * kStages + stage; }
  __device__ uint64_t* v_empty(int stage) const { return base + 1 + 3 * kStages + stage; }
};

/// Copies rows [row0, row0 + ROWS) of (batch, head) of the [B, H, S, D] tensor of `map` (boxes
/// of 64 columns by ROWS rows) into the tile at `tile` (generic address) as D / 64 halves,
/// completing on `full`, which expects their bytes (rows past S arrive as zeros and count).
template <int D, int ROWS>
__device__ __forceinline__ void copy_tile(unsigned char* tile, const opforge::kernel::TensorMap& map, int row0,
                                          int head, int batch, uint64_t* full, uint64_t policy) {
  opforge::tma::mbarrier_arrive_expect_tx(full, D / 64 * ROWS * 128);
#pragma unroll
  for (int h = 0; h < D / 64; ++h)
    opforge::tma::copy_4d(tile + h * ROWS * 128, map, 64 * h, row0, head, batch, full, policy);
}

/// Named barriers of the consumer warpgroups' round-robin turns (ping-pong for two; ids
/// 1 .. C, 0 is __syncthreads): consumer c waits on barrier 1 + c until consumer c - 1 (mod C)
/// has issued its products, then passes the turn on to consumer c + 1 (mod C).
__device__ __forceinline__ void turn_wait(int consumer) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory");
}
template <int C>
__device__ __forceinline__ void turn_pass(int consumer) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (consumer + 1) % C) : "memory");
}

/// A wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start
/// address, leading and stride byte offsets (16-byte units), layout type 1 (128-byte swizzle).
/// K-major operands (Q, K): stride = 1024 bytes between 8-row groups, leading unused.
/// MN-major V: leading = bytes between the 64-column halves, stride = 1024 bytes between 8-row
/// groups along the keys.
__device__ __forceinline__ unsigned long long descriptor(unsigned address, unsigned leading, unsigned stride) {
  return static_cast<unsigned long long>((address & 0x3FFFF) >> 4) |
         (static_cast<unsigned long long>(leading >> 4) << 16) | (static_cast<unsigned long long>(stride >> 4) << 32) |
         (1ull << 62);
}

// The 64 accumulator operands of an m64n128 wgmma with f32 accumulators (PTX ISA, "Register
// Fragments and Shared Memory Matrix Layouts", wgmma .m64nNk16): d[4 j + e] is row
// 16 * warp + lane / 4 (+ 8 for e >= 2) and column 8 j + 2 * (lane % 4) + e % 2 of the
// warp's 16 rows of the 64 x 128 tile, as mma.sync m16n8 accumulators are.
#define ATTENTION_WGMMA_D                                                                                             \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),            \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),        \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),        \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),        \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),        \
      "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),      \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), \
      "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), \
      "+f"(d[15][3])
#define ATTENTION_WGMMA_D_REGS                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
  "%62, %63}"

/// d (+)= A B for a 64 x 128 tile, k = 16; A and B from shared memory, both K-major.
/// `accumulate` 0 overwrites d.
template <class T>
__device__ __forceinline__ void wgmma_ss(float (&d)[16][4], unsigned long long a, unsigned long long b,
                                         int accumulate) {
  if constexpr (opforge::kernel::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ATTENTION_WGMMA_D_REGS
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : ATTENTION_WGMMA_D
        : "l"(a), "l"(b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ATTENTION_WGMMA_D_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : ATTENTION_WGMMA_D
        : "l"(a), "l"(b), "r"(accumulate));
  }
}

/// d += A B for a 64 x 128 tile, k = 16; A (16 rows per warp, mma.sync's A fragment layout)
/// from registers, B from shared memory MN-major (transposed).
template <class T>
__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const unsigned (&a)[4], unsigned long long b) {
  if constexpr (opforge::kernel::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ATTENTION_WGMMA_D_REGS
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : ATTENTION_WGMMA_D
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " ATTENTION_WGMMA_D_REGS
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : ATTENTION_WGMMA_D
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}

// The 32 accumulator operands of an m64n64 wgmma, laid out as the m64n128 ones' first 8 j.
#define ATTENTION_WGMMA_D64                                                                                    \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),     \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define ATTENTION_WGMMA_D64_REGS                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

/// wgmma_rs for a 64 x 64 tile (head dim 64's P V product).
template <class T>
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b) {
  if constexpr (opforge::kernel::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ATTENTION_WGMMA_D64_REGS
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : ATTENTION_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " ATTENTION_WGMMA_D64_REGS
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : ATTENTION_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}
/// d (+)= A B for a 64 x 64 tile, k = 16; A and B from shared memory, each K-major, or MN-major
/// (transposed) where kTransA / kTransB is 1 (attention_backward's products). `accumulate` 0
/// overwrites d.
template <class T, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], unsigned long long a, unsigned long long b, int accumulate) {
  if constexpr (opforge::kernel::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ATTENTION_WGMMA_D64_REGS
        ", %32, %33, p, 1, 1, %35, %36;\n}\n"
        : ATTENTION_WGMMA_D64
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " ATTENTION_WGMMA_D64_REGS
        ", %32, %33, p, 1, 1, %35, %36;\n}\n"
        : ATTENTION_WGMMA_D64
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  }
}
#undef ATTENTION_WGMMA_D64
#undef ATTENTION_WGMMA_D64_REGS
#undef ATTENTION_WGMMA_D
#undef ATTENTION_WGMMA_D_REGS

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Makes this thread's cp.async writes to shared memory visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/// Keeps the compiler from moving accesses of registers an in-flight wgmma reads or writes
/// across the wait that ends it (cutlass's warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(r[i][e])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(unsigned (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

/// Head dims 64 and 128 on Hopper. Block: 1 + C warpgroups (C = kConsumers<D>), 64 C query rows.
/// Warpgroup 0 produces: one thread copies Q, then K_j and V_j into stage j % kStages once the
/// consumers have released the stage's previous tiles. Consumer warpgroup g = 1 .. C owns rows
/// 64 (g - 1) .. 64 (g - 1) + 63 (within it, warp w rows 16 w .. 16 w + 15). Per key block j a
/// consumer waits for K_j, takes its turn, issues S_j = Q K_j^T and then
/// O += P_{j-1} V_{j-1}, passes the turn, waits for S_j only and releases K_j, masks and
/// exponentiates S_j while the P V product runs, waits for it and releases V_{j-1}, rescales O
/// by the new row maxima and rounds S_j to P_j. P_{n-1} V_{n-1} closes the loop. Turns go
/// round the consumers in order; consumer 0 takes its first without waiting and consumer C - 1
/// passes none after its last, so every named barrier sees as many arrivals as waits.
template <class T, int D, bool kCausal>
__device__ __forceinline__ void attention(unsigned char* shared, const T* __restrict__ q, const T* __restrict__ k,
                                          const T* __restrict__ v, const T* __restrict__ mask, T* __restrict__ o,
                                          float* __restrict__ lse, const attention_detail::Layout& l, double scale,
                                          const opforge::kernel::TensorMap& q_map,
                                          const opforge::kernel::TensorMap& k_map,
                                          const opforge::kernel::TensorMap& v_map) {
  const int64_t sq = l.sq, sk = l.sk;
  using S = Smem<D>;
  // The grid function and this path disagree: fail, never compute wrong.
  constexpr int C = kConsumers<D>;
  if (blockDim.x != 128 * (1 + C) || attention_detail::dynamic_shared_bytes() < S::kBytes) __trap();
  const unsigned raw = attention_detail::smem_address(shared);
  const unsigned base = (raw + 1023u) & ~1023u;
  unsigned char* const tiles = shared + (base - raw);  // generic address of `base`
  const Barriers bars{reinterpret_cast<uint64_t*>(tiles + S::kBarriers)};
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const attention_detail::BlockWork<T, D, kRows<D>, kBlockN, kCausal> work(q, k, v, mask, l, scale);
  const int64_t bh = work.bh, m0 = work.m0;
  const T* mb = work.mask;
  const float scale_log2 = work.scale_log2;
  const int n_blocks = work.n_blocks;

  if (threadIdx.x == 0) {
    opforge::tma::mbarrier_init(bars.q_full(), 1);
    for (int st = 0; st < kStages; ++st) {
      opforge::tma::mbarrier_init(bars.k_full(st), 1);
      opforge::tma::mbarrier_init(bars.v_full(st), 1);
      opforge::tma::mbarrier_init(bars.k_empty(st), 4 * C);  // one arrival per consumer warp
      opforge::tma::mbarrier_init(bars.v_empty(st), 4 * C);
    }
    opforge::tma::fence_mbarrier_init();
  }
  __syncthreads();

  if (group == 0) {  // the producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters<D>));
    if (threadIdx.x != 0) return;
    const int head = blockIdx.y, batch = blockIdx.z;
    opforge::tma::prefetch_tensor_map(q_map);
    opforge::tma::prefetch_tensor_map(k_map);
    opforge::tma::prefetch_tensor_map(v_map);
    // Q is read by this block only; K and V by every block of the (batch, head).
    const uint64_t once = opforge::tma::evict_first(), shared_kv = opforge::tma::evict_last();
    copy_tile<D, kRows<D>>(tiles + S::kQ, q_map, static_cast<int>(m0), head, batch, bars.q_full(), once);
    for (int nb = 0; nb < n_blocks; ++nb) {
      const int stage = nb % kStages;
      const unsigned parity = (nb / kStages) & 1;
      opforge::tma::mbarrier_wait(bars.k_empty(stage), parity ^ 1);
      copy_tile<D, kBlockN>(tiles + S::k_tile(stage), k_map, nb * kBlockN, head, batch, bars.k_full(stage), shared_kv);
      opforge::tma::mbarrier_wait(bars.v_empty(stage), parity ^ 1);
      copy_tile<D, kBlockN>(tiles + S::v_tile(stage), v_map, nb * kBlockN, head, batch, bars.v_full(stage), shared_kv);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters<D>));
  const int consumer = group - 1;
  float acc[D / 8][4], s[kBlockN / 8][4];
  unsigned p[kBlockN / 16][4];
  float row_max[2] = {neg_inf(), neg_inf()}, row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
  // This thread's rows, relative to m0: row_in_block (+ 8 for accumulator elements 2, 3).
  const int row_in_block = consumer * 64 + warp * 16 + lane / 4;
  const unsigned q_rows = base + S::kQ + consumer * 64 * 128;
  opforge::tma::mbarrier_wait(bars.q_full(), 0);

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb % kStages, previous = (nb + kStages - 1) % kStages;
    const unsigned parity = (nb / kStages) & 1, previous_parity = ((nb - 1) / kStages) & 1;
    const int64_t n0 = static_cast<int64_t>(nb) * kBlockN;
    opforge::tma::mbarrier_wait(bars.k_full(stage), parity);
    if (nb > 0) opforge::tma::mbarrier_wait(bars.v_full(previous), previous_parity);
    if (nb > 0 || consumer > 0) turn_wait(consumer);  // consumer 0 issues first

    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned at = (kk % 4) * 32;  // columns 16 kk ..: half kk / 4, 32 bytes per step
      wgmma_ss<T>(s, descriptor(q_rows + (kk / 4) * S::kQHalf + at, 16, 1024),
                  descriptor(base + S::k_tile(stage) + (kk / 4) * kHalf + at, 16, 1024), kk > 0);
    }
    wgmma_commit();
    if (nb > 0) {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)  // keys 16 kk ..: 16 rows of 128 bytes per step
        wgmma_rs<T>(acc, p[kk], descriptor(base + S::v_tile(previous) + kk * 16 * 128, kHalf, 1024));
      wgmma_commit();
      turn_pass<C>(consumer);
      wgmma_wait<1>();  // S_nb done; P V may still run
    } else {
      turn_pass<C>(consumer);
      wgmma_wait<0>();
    }
    fence_operands(s);
    __syncwarp();
    if (lane == 0) opforge::tma::mbarrier_arrive(bars.k_empty(stage));  // this warp is done with K_nb

    // Masks: the padding mask added (scores then in log2 units), keys past Sk and (causal)
    // keys after the query removed; without a padding mask the scale is applied in the
    // exponent (attention_detail::online_softmax).
    const int keys = static_cast<int>(sk - n0 < kBlockN ? sk - n0 : kBlockN);
    const int diagonal = kCausal ? static_cast<int>(m0 - n0) : 0;
    if (mb != nullptr) attention_detail::add_mask(s, mb + n0, keys, scale_log2, lane);
    if (keys < kBlockN || (kCausal && diagonal < kBlockN))
      attention_detail::mask_edge<kCausal>(s, keys, consumer * 64 + warp * 16 + diagonal, lane);
    float correction[2];
    attention_detail::online_softmax(s, row_max, row_sum, correction, mb != nullptr ? 1.0f : scale_log2);

    wgmma_wait<0>();  // P_{nb-1} V_{nb-1} done: acc and p are free
    fence_operands(acc);
    fence_operands(p);
    if (nb > 0) {
      __syncwarp();
      if (lane == 0) opforge::tma::mbarrier_arrive(bars.v_empty(previous));  // this warp is done with V_{nb-1}
    }
    attention_detail::rescale(acc, correction);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) attention_detail::pack_p<T>(s, kk, p[kk]);
  }
  if (n_blocks > 0) {
    const int last = (n_blocks - 1) % kStages;
    opforge::tma::mbarrier_wait(bars.v_full(last), ((n_blocks - 1) / kStages) & 1);
    turn_wait(consumer);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      wgmma_rs<T>(acc, p[kk], descriptor(base + S::v_tile(last) + kk * 16 * 128, kHalf, 1024));
    wgmma_commit();
    if (consumer < C - 1) turn_pass<C>(consumer);  // consumer C - 1 issues last
    wgmma_wait<0>();
    fence_operands(acc);
    fence_operands(p);
  }

  attention_detail::store_rows<T, D>(acc, row_max, row_sum, o, lse, bh, sq, m0 + row_in_block, lane);
}

}  // namespace attention_sm90
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <class T, int D, bool kCausal>
__global__ void __launch_bounds__(attention_detail::kThreadsFor<D>, attention_detail::kMinBlocksFor<D>)
    attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ mask,
              T* __restrict__ o, float* __restrict__ lse, int64_t heads, int64_t sq, int64_t sk, int64_t q_batch,
              int64_t q_head, int64_t q_row, int64_t k_batch, int64_t k_head, int64_t k_row, int64_t v_batch,
              int64_t v_head, int64_t v_row, const __grid_constant__ opforge::kernel::TensorMap q_map,
              const __grid_constant__ opforge::kernel::TensorMap k_map,
              const __grid_constant__ opforge::kernel::TensorMap v_map, double scale) {
  static_assert(D == 32 || D == 64 || D == 128, "head dim 32, 64 or 128");
  const attention_detail::Layout l{
      heads, sq, sk, {q_batch, q_head, q_row}, {k_batch, k_head, k_row}, {v_batch, v_head, v_row}};
  extern __shared__ __align__(1024) unsigned char shared[];
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (attention_detail::kUsesWgmma<D>)
    attention_sm90::attention<T, D, kCausal>(shared, q, k, v, mask, o, lse, l, scale, q_map, k_map, v_map);
  else
#endif
    attention_detail::attention_mma<T, D, kCausal>(shared, q, k, v, mask, o, lse, l, scale);
}
