// attention_backward on CUDA: FlashAttention-2's backward (Dao, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning", 2023, Algorithm 2). The [Sq, Sk]
// probability matrix is recomputed block by block from q, k and each query row's log-sum-exp,
// never stored. Three kernels on the call's stream:
//   1. stats: per query row, the forward's log-sum-exp of its scores (its output lse) in log2
//      units and delta = grad_o . o;
//   2. kv: one block per 64 keys of one (batch, head) walks over the query rows kQueriesFor<D>
//      at a time (the next step's rows loading while this one computes) and accumulates grad_k
//      and grad_v of its keys in registers; grad_q's share of each step is added into a float32
//      buffer with atomics (the blocks of all key blocks meet there); on compute capability 9.0,
//      head dims 64 and 128, kv_sm90 instead: 128 keys a block, the same products as warpgroup
//      MMAs (wgmma) of two warpgroups;
//   3. the float32 grad_q buffer, scaled, rounded to the input dtype.
// Products use mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate) through the forward kernel's
// tile helpers, or its wgmma helpers in kv_sm90 (attention_detail and attention_sm90 in
// kernels/attention.cu, included below for them alone: its run-time kernel is not instantiated
// here); P and dS are rounded to the input dtype before they enter a product, as in
// FlashAttention-2. The library carries sm_90a code for kv_sm90 where the build targets compute
// capability 9.0 (CMakeLists.txt).
#include <opforge/cuda.h>

#include <cmath>

#include "kernels/attention.cu"

namespace attention_backward {

using attention_detail::cp_async_commit;
using attention_detail::cp_async_wait_all;
using attention_detail::fast_exp2;
using attention_detail::kLog2e;
using attention_detail::ldmatrix_x4;
using attention_detail::ldmatrix_x4_trans;
using attention_detail::load_tile;
using attention_detail::mma;
using attention_detail::neg_inf;
using attention_detail::pack2;
using attention_detail::smem_address;
using attention_detail::Strides;
using attention_detail::swizzled;
using attention_detail::TileAddress;

constexpr int kThreads = attention_detail::kThreads;  // 4 warps: load_tile's thread count
constexpr int kKeys = 64;                             // keys per kv block: 16 per warp
/// Query rows per kv step: 64 (more products per shared-memory load and per barrier) where the
/// registers allow, 32 at head dim 128 (its grad_k and grad_v take 128 registers a thread).
template <int D>
constexpr int kQueriesFor = D == 128 ? 32 : 64;
constexpr int kStatRows = 128;  // sq_stats is a multiple of it: the stats kernel's rows per block

/// What the three kernels share: the problem's sizes, the strides of the inputs (batch, head,
/// row; rows contiguous and 16-byte aligned: opforge::contiguous_last_dim), the scale in log2
/// units, the forward's lse and the float32 scratch rows: lse (log2 units) and delta per query
/// row, grad_q.
template <class T>
struct Problem {
  const T *grad_o, *q, *k, *v, *o, *mask;
  const float* forward_lse;  // [B * H, Sq]: the forward's log-sum-exp per query row (natural log)
  Strides s_grad_o, s_q, s_k, s_v, s_o;
  int64_t heads, sq, sk;
  int64_t sq_stats;  // Sq rounded up to kStatRows: the row count of lse and delta per (batch, head)
  float scale, scale_log2;
  float *lse, *delta, *dq;  // [B * H, sq_stats], [B * H, sq_stats], [B * H, Sq, D]
};

template <class T>
__device__ __forceinline__ const T* rows_of(const T* base, const Strides& s, int64_t batch, int64_t head) {
  return base + batch * s.batch + head * s.head;
}

/// acc += A B^T over the head dim for one warp: A's 16 rows and B's N rows are rows of D
/// elements in swizzled shared tiles (`a_rows` addresses A as the forward's Q, `b_rows` B as
/// its K); acc is the 16 x N accumulator (rows A's, columns B's).
template <class T, int D, int N>
__device__ __forceinline__ void rows_times_rows(float (&acc)[N / 8][4], const TileAddress<D>& a_rows,
                                                const TileAddress<D>& b_rows) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[4];
    ldmatrix_x4(a, a_rows(kk, 0));
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      unsigned b[4];
      ldmatrix_x4(b, b_rows(kk, np * 16));
      mma<T>(acc[2 * np], a, b[0], b[1]);
      mma<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

/// acc += P B for one warp: P the 16 x K accumulator `p` (rounded to T; accumulators are laid
/// out as A operands), B K rows of D elements in a swizzled shared tile (`b_rows` addresses it as
/// the forward's V); acc is 16 x D.
template <class T, int D, int K>
__device__ __forceinline__ void registers_times_rows(float (&acc)[D / 8][4], const float (&p)[K / 8][4],
                                                     const TileAddress<D>& b_rows) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    unsigned a[4];
    attention_detail::pack_p<T>(p, kk, a);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      unsigned b[4];
      ldmatrix_x4_trans(b, b_rows(dp, kk * 16));
      mma<T>(acc[2 * dp], a, b[0], b[1]);
      mma<T>(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

/// delta = grad_o . o of query row `row` (two lanes a row, half a row each: lanes 2 i and
/// 2 i + 1), written by the even lane; rows past Sq (up to sq_stats) get 0.
template <class T, int D>
__device__ __forceinline__ void write_delta(const Problem<T>& p, int64_t batch, int64_t head, int64_t bh, int64_t row,
                                            int lane) {
  float sum = 0.0f;
  if (row < p.sq) {
    const T* g = rows_of(p.grad_o, p.s_grad_o, batch, head) + row * p.s_grad_o.row + (lane & 1) * (D / 2);
    const T* o = rows_of(p.o, p.s_o, batch, head) + row * p.s_o.row + (lane & 1) * (D / 2);
#pragma unroll
    for (int c = 0; c < D / 2; c += 8) {
      float gv[8], ov[8];
      opforge::kernel::unpack<T>(*reinterpret_cast<const uint4*>(g + c), gv);
      opforge::kernel::unpack<T>(*reinterpret_cast<const uint4*>(o + c), ov);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += gv[e] * ov[e];
    }
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  if ((lane & 1) == 0) p.delta[bh * p.sq_stats + row] = sum;
}

/// Kernel 1. Grid (sq_stats / kStatRows, H, B), 2 * kStatRows threads, two a query row (lanes
/// 2 i and 2 i + 1): the row's delta (write_delta) and its lse in log2 units, the forward's
/// times log2(e); +inf where the forward's is -inf (a row without keys) and for the rows past Sq
/// up to sq_stats, so that each exp2(s - lse) of such a row is zero.
template <class T, int D>
__global__ void __launch_bounds__(2 * kStatRows) stats(Problem<T> p) {
  const int lane = threadIdx.x % 32;
  const int64_t batch = blockIdx.z, head = blockIdx.y, bh = batch * p.heads + head;
  const int64_t row = int64_t{blockIdx.x} * kStatRows + threadIdx.x / 2;
  write_delta<T, D>(p, batch, head, bh, row, lane);
  if ((lane & 1) == 0) {
    const float lse = row < p.sq ? p.forward_lse[bh * p.sq + row] : neg_inf();
    p.lse[bh * p.sq_stats + row] = lse == neg_inf() ? __int_as_float(0x7f800000) : lse * kLog2e;
  }
}

/// Shared memory of a kv block: K and V of its keys; two stages of Q and grad_o of a step's query
/// rows and of their lse and delta (the next step's loads overlap this step's products); dS^T of
/// the step ([key][query]).
template <class T, int D>
struct KvShared {
  static constexpr int kQueries = kQueriesFor<D>;
  static constexpr size_t kStage = 2 * kQueries * D;  // elements of T: Q, then grad_o
  static constexpr size_t kK = 0, kV = kK + kKeys * D, kStages = kV + kKeys * D, kDs = kStages + 2 * kStage,
                          kEnd = kDs + kKeys * kQueries;  // elements of T
  static constexpr size_t kBytes = kEnd * sizeof(T) + 2 * 2 * kQueries * sizeof(float);
};

/// Starts the cp.async loads (committed by the caller) of the lse, then the delta, of query rows
/// m0 .. m0 + kQueries - 1 into `stats` (the stats kernel wrote rows up to sq_stats, a multiple
/// of kStatRows, which the step divides).
template <int kQueries, class T>
__device__ __forceinline__ void load_statistics(const Problem<T>& p, int64_t bh, int64_t m0, float* stats) {
  constexpr int kChunks = kQueries / 4;  // 16-byte chunks of one statistic's rows
  static_assert(kStatRows % kQueries == 0, "a step's statistics (m0 < Sq) lie within sq_stats");
  if (threadIdx.x < 2 * kChunks) {
    const float* from = (threadIdx.x < kChunks ? p.lse : p.delta) + bh * p.sq_stats + m0 + (threadIdx.x % kChunks) * 4;
    attention_detail::cp_async_16(stats + threadIdx.x * 4, from, true);
  }
}

/// Starts the cp.async loads (committed by the caller) of one step's kQueriesFor<D> query rows from m0 into
/// a stage: Q, then grad_o (rows past Sq zero), and into `stats` their lse, then their delta.
template <class T, int D>
__device__ __forceinline__ void load_step(const Problem<T>& p, const T* qb, const T* gb, int64_t bh, int64_t m0,
                                          T* stage, float* stats) {
  constexpr int kQueries = kQueriesFor<D>;
  load_tile<T, D, kQueries>(stage, qb, p.s_q.row, m0, p.sq);
  load_tile<T, D, kQueries>(stage + kQueries * D, gb, p.s_grad_o.row, m0, p.sq);
  load_statistics<kQueries>(p, bh, m0, stats);
}

/// Adds a pair of adjacent float32 values into global memory (8-byte aligned): one vector atomic
/// on sm_90 and later, two scalar ones before.
__device__ __forceinline__ void atomic_add_pair(float* to, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(to), make_float2(a, b));
#else
  atomicAdd(to, a);
  atomicAdd(to + 1, b);
#endif
}

/// grad_k = scale * dK and grad_v = dV for the thread's keys `key` and key + 8 (accumulator
/// rows of a 16-row tile, columns the head dim): dense [B, H, Sk, D] rows; keys at or past Sk
/// are not stored.
template <class T, int D>
__device__ __forceinline__ void store_key_rows(const float (&dk)[D / 8][4], const float (&dv)[D / 8][4],
                                               const Problem<T>& p, int64_t bh, int64_t key, int lane, T* grad_k,
                                               T* grad_v) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key + h * 8 >= p.sk) continue;
    T* gk = grad_k + (bh * p.sk + key + h * 8) * D + (lane & 3) * 2;
    T* gv = grad_v + (bh * p.sk + key + h * 8) * D + (lane & 3) * 2;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<unsigned*>(gk + nt * 8) = pack2<T>(dk[nt][2 * h] * p.scale, dk[nt][2 * h + 1] * p.scale);
      *reinterpret_cast<unsigned*>(gv + nt * 8) = pack2<T>(dv[nt][2 * h], dv[nt][2 * h + 1]);
    }
  }
}

/// The thread's two keys in a kv block (accumulator rows key_in_block and key_in_block + 8 after
/// the block's first key n0; columns are a step's queries, nt * 8 + (lane % 4) * 2 (+ 1)):
/// whether each is one of the Sk keys, and its padding mask in log2 units.
struct BlockKeys {
  int key_in_block;
  float add[2];
  bool in[2];
  template <class T>
  __device__ BlockKeys(int key_in_block_, int64_t n0, int64_t sk, const T* mask) : key_in_block(key_in_block_) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t key = n0 + key_in_block + h * 8;
      in[h] = key < sk;
      add[h] = mask != nullptr && in[h] ? opforge::kernel::to_acc(mask[key]) * kLog2e : 0.0f;
    }
  }

  /// S^T to P^T in place, P^T = exp2(S^T scale_log2 + mask - lse) with `lse` the step's (first
  /// query m0); keys past Sk and (causal) keys after their query get zero. A key is after its
  /// query if key_in_block + 8 h - col > m0 - n0, which lies in (-step, inf): clamped to the
  /// block's `keys`, the difference keeps every outcome in 32 bits.
  template <bool kCausal, int N>
  __device__ __forceinline__ void probabilities(float (&s)[N][4], int64_t m0, int64_t n0, int keys, float scale_log2,
                                                const float* lse, int lane) const {
    const int ahead = static_cast<int>(m0 - n0 < keys ? m0 - n0 : keys);
#pragma unroll
    for (int nt = 0; nt < N; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + (lane & 3) * 2 + (e & 1), h = e >> 1;
        const bool keep = in[h] && !(kCausal && key_in_block + h * 8 - col > ahead);
        s[nt][e] = keep ? fast_exp2(s[nt][e] * scale_log2 + add[h] - lse[col]) : 0.0f;
      }
  }
};

/// dP^T to dS^T in place: dS^T = P^T (dP^T - delta), `delta` the step's (columns as BlockKeys').
template <int N>
__device__ __forceinline__ void scores_gradient(float (&dp)[N][4], const float (&p)[N][4], const float* delta,
                                                int lane) {
#pragma unroll
  for (int nt = 0; nt < N; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[nt][e] = p[nt][e] * (dp[nt][e] - delta[nt * 8 + (lane & 3) * 2 + (e & 1)]);
}

/// Kernel 2. Grid (ceil(Sk / 64), H, B), 128 threads, KvShared<T, D>::kBytes of dynamic shared
/// memory. Warp w owns keys n0 + 16 w .. + 15; per step of kQueriesFor<D> query rows
/// (accumulator rows are keys, columns queries):
///   S^T = K Q^T, P^T = exp2(S^T scale_log2 + mask - lse), dV += P^T dO, dP^T = V dO^T,
///   dS^T = P^T (dP^T - delta), dK += dS^T Q, and (all warps, through shared memory)
///   dQ += dS K into the float32 buffer.
template <class T, int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, D == 128 ? 1 : 2)
    kv(Problem<T> p, T* __restrict__ grad_k, T* __restrict__ grad_v) {
  extern __shared__ __align__(16) unsigned char shared[];
  using L = KvShared<T, D>;
  constexpr int kQueries = L::kQueries;
  T* base = reinterpret_cast<T*>(shared);
  T *sK = base + L::kK, *sV = base + L::kV, *sDs = base + L::kDs;
  float* sStats = reinterpret_cast<float*>(base + L::kEnd);  // per stage: kQueries lse, then kQueries delta

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t batch = blockIdx.z, head = blockIdx.y, bh = batch * p.heads + head;
  const int64_t n0 = int64_t{blockIdx.x} * kKeys, sq = p.sq, sk = p.sk;
  const T* qb = rows_of(p.q, p.s_q, batch, head);
  const T* gb = rows_of(p.grad_o, p.s_grad_o, batch, head);
  const T* mb = p.mask ? p.mask + batch * sk : nullptr;

  load_tile<T, D, kKeys>(sK, rows_of(p.k, p.s_k, batch, head), p.s_k.row, n0, sk);
  load_tile<T, D, kKeys>(sV, rows_of(p.v, p.s_v, batch, head), p.s_v.row, n0, sk);
  // Causal: query rows before n0 see none of these keys. A block whose keys no query sees
  // (causal, n0 >= Sq) loads no step: its statistics would lie past sq_stats.
  const int64_t m_begin = kCausal ? (n0 / kQueries) * kQueries : 0;
  if (m_begin < sq) load_step<T, D>(p, qb, gb, bh, m_begin, base + L::kStages, sStats);
  cp_async_commit();

  constexpr int kTilesD = D / 8, kTilesQ = kQueries / 8;
  float dk[kTilesD][4] = {}, dv[kTilesD][4] = {};
  const BlockKeys keys(warp * 16 + lane / 4, n0, sk, mb);
  const TileAddress<D> k_rows(smem_address(sK), warp * 16 + (lane & 15), lane >> 4);                          // A: K
  const TileAddress<D> v_rows(smem_address(sV), warp * 16 + (lane & 15), lane >> 4);                          // A: V
  const TileAddress<D> k_trans(smem_address(sK), lane & 15, lane >> 4);                                       // B: K
  const TileAddress<kQueries> ds_trans(smem_address(sDs), (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);  // A: dS

  for (int64_t m0 = m_begin, step = 0; m0 < sq; m0 += kQueries, ++step) {
    // Stage `step % 2` holds this step's rows; the next step's loads go to the other stage while
    // this step computes.
    cp_async_wait_all();
    __syncthreads();  // this step's rows have landed; every warp is done with the previous step
    T* stage = base + L::kStages + (step & 1) * L::kStage;
    const float* sLse = sStats + (step & 1) * 2 * kQueries;
    const float* sDelta = sLse + kQueries;
    if (m0 + kQueries < sq)
      load_step<T, D>(p, qb, gb, bh, m0 + kQueries, base + L::kStages + ((step + 1) & 1) * L::kStage,
                      sStats + ((step + 1) & 1) * 2 * kQueries);
    cp_async_commit();
    const unsigned sQ = smem_address(stage), sG = smem_address(stage + kQueries * D);
    const TileAddress<D> q_cols(sQ, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);  // B: Q^T
    const TileAddress<D> g_cols(sG, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);  // B: dO^T
    const TileAddress<D> q_rows(sQ, lane & 15, lane >> 4);                              // B: Q
    const TileAddress<D> g_rows(sG, lane & 15, lane >> 4);                              // B: dO

    // S^T = K Q^T for the warp's 16 keys and the step's queries.
    float s[kTilesQ][4] = {};
    rows_times_rows<T, D, kQueries>(s, k_rows, q_cols);
    keys.probabilities<kCausal>(s, m0, n0, kKeys, p.scale_log2, sLse, lane);

    // dV += P^T dO.
    registers_times_rows<T, D, kQueries>(dv, s, g_rows);

    // dP^T = V dO^T, then dS^T = P^T (dP^T - delta) in place.
    float ds[kTilesQ][4] = {};
    rows_times_rows<T, D, kQueries>(ds, v_rows, g_cols);
    scores_gradient(ds, s, sDelta, lane);

    // dK += dS^T Q.
    registers_times_rows<T, D, kQueries>(dk, ds, q_rows);

    // dS^T to shared memory, [key][query] (rows of the step's queries), for dQ across the warps.
#pragma unroll
    for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = keys.key_in_block + h * 8, col = nt * 8 + (lane & 3) * 2;
        *reinterpret_cast<unsigned*>(sDs + swizzled<kQueries>(key, col / 8) + col % 8) =
            pack2<T>(ds[nt][2 * h], ds[nt][2 * h + 1]);
      }
    __syncthreads();

    // dQ += dS K: the step's 16-row query tiles times the parts of the head dim make the four
    // warps' shares; warp w takes query tile w % kMTiles and head-dim part w / kMTiles.
    {
      constexpr int kMTiles = kQueries / 16, kParts = 4 / kMTiles;
      constexpr int kPairs = D / 16 / kParts;  // 16-column pairs of n-tiles per warp
      const int mt = warp % kMTiles, part = warp / kMTiles;
      float dq[2 * kPairs][4] = {};
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        unsigned a[4];
        // (Selects between compile-time chunk pairs: a run-time index into TileAddress's
        // registers would put them in local memory.)
        if constexpr (kMTiles == 2) {
          ldmatrix_x4_trans(a, mt ? ds_trans(1, kk * 16) : ds_trans(0, kk * 16));
        } else {
          static_assert(kMTiles == 4);
          ldmatrix_x4_trans(a, mt == 0   ? ds_trans(0, kk * 16)
                               : mt == 1 ? ds_trans(1, kk * 16)
                               : mt == 2 ? ds_trans(2, kk * 16)
                                         : ds_trans(3, kk * 16));
        }
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          unsigned b[4];
          if constexpr (kParts == 2) {
            ldmatrix_x4_trans(b, part ? k_trans(kPairs + j, kk * 16) : k_trans(j, kk * 16));
          } else {
            static_assert(kParts == 1);
            ldmatrix_x4_trans(b, k_trans(j, kk * 16));
          }
          mma<T>(dq[2 * j], a, b[0], b[1]);
          mma<T>(dq[2 * j + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t query = m0 + mt * 16 + lane / 4 + h * 8;
        if (query >= sq) continue;
        float* row = p.dq + (bh * sq + query) * D + part * (D / kParts) + (lane & 3) * 2;
#pragma unroll
        for (int nt = 0; nt < 2 * kPairs; ++nt) atomic_add_pair(row + nt * 8, dq[nt][2 * h], dq[nt][2 * h + 1]);
      }
    }
  }
  cp_async_wait_all();
  store_key_rows<T, D>(dk, dv, p, bh, n0 + keys.key_in_block, lane, grad_k, grad_v);
}

/// The kv kernel's Hopper form (compiled as sm_90a: warpgroup MMAs). Block: two warpgroups,
/// kKeys keys; per step of kQueries<D> query rows, warpgroup g computes for its keys
/// n0 + 64 g .. + 63 (accumulator rows; columns are the step's queries) the products kv does:
/// S^T = K Q^T and dP^T = V dO^T (both operands from shared memory), P^T and dS^T in registers,
/// dV += P^T dO and dK += dS^T Q (P^T and dS^T from registers), then dS^T to shared memory; then
/// each warpgroup computes one 64 x 64 tile of dQ = dS K over all the block's keys (both
/// operands transposed from shared memory) and adds it into the float32 buffer. Tiles are 128-byte-swizzled halves of
/// 64 columns (Shared), loaded with cp.async by all threads; the next step's Q, dO, lse and delta load while this step
/// computes.
namespace sm90 {
constexpr int kKeys = 128, kThreads = 256;
constexpr unsigned kRow = 128;  // bytes of a tile row: 64 columns
/// Query rows a step: 128 at head dim 64 (more products per block barrier; the registers allow),
/// 64 at 128 (its dK and dV take 128 registers a thread).
template <int D>
constexpr int kQueries = D == 64 ? 128 : 64;

/// Shared memory for head dim D, from a 1024-byte-aligned base: K and V of the block's keys
/// (D / 64 halves of kKeys rows each), two stages of a step's Q and dO (D / 64 halves of
/// kQueries<D> rows each), dS^T per warpgroup (64 keys by kQueries<D> queries, as kQueries<D> / 64
/// halves of 64 rows) and two stages of the step's lse, then delta. The 1024 spare bytes pay
/// for aligning the base.
template <int D>
struct Shared {
  static constexpr unsigned kQ = kQueries<D>, kKeyTile = D / 64 * kKeys * kRow, kQueryTile = D / 64 * kQ * kRow;
  static constexpr unsigned kK = 0, kV = kKeyTile, kStages = 2 * kKeyTile, kStage = 2 * kQueryTile,
                            kDs = kStages + 2 * kStage, kDsTile = kQ / 64 * 64 * kRow, kStats = kDs + 2 * kDsTile,
                            kBytes = kStats + 2 * 2 * kQ * sizeof(float) + 1024;
  static_assert(kBytes <= 227 * 1024, "a block of sm_90 takes at most 227 KiB of shared memory");
};

/// Copies rows [row0, row0 + ROWS) of a [rows, D] matrix (rows `row_stride` elements apart)
/// into a tile of D / 64 halves of ROWS rows of 128 bytes with cp.async, chunk c of row r at
/// chunk c ^ (r % 8) (the 128-byte swizzle of the wgmma layout descriptors); rows at or past
/// `limit` become zeros.
template <class T, int D, int ROWS>
__device__ __forceinline__ void load_tile(unsigned char* tile, const T* src, int64_t row_stride, int64_t row0,
                                          int64_t limit) {
  attention_detail::load_rows<T, D, ROWS, kThreads>(src, row_stride, row0, limit, [tile](int r, int c) {
    return tile + (c / 8) * ROWS * kRow + r * kRow + (((c % 8) ^ (r % 8)) << 4);
  });
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/// d (+)= A B for a 64 x N tile (N = 8 * N8: 64 or 128), k = 16, A and B K-major from shared
/// memory (attention_sm90's wgmma_ss).
template <class T, int N8>
__device__ __forceinline__ void scores(float (&d)[N8][4], unsigned long long a, unsigned long long b, int accumulate) {
  if constexpr (N8 == 16) attention_sm90::wgmma_ss<T>(d, a, b, accumulate);
  else attention_sm90::wgmma_ss<T, 0, 0>(d, a, b, accumulate);
}
#endif

/// Starts the cp.async loads (committed by the caller) of one step's kQueries<D> query rows from
/// m0: Q, then dO, into `stage`, their lse, then delta into `stats`.
template <class T, int D>
__device__ __forceinline__ void load_step(const Problem<T>& p, const T* qb, const T* gb, int64_t bh, int64_t m0,
                                          unsigned char* stage, float* stats) {
  load_tile<T, D, kQueries<D>>(stage, qb, p.s_q.row, m0, p.sq);
  load_tile<T, D, kQueries<D>>(stage + Shared<D>::kQueryTile, gb, p.s_grad_o.row, m0, p.sq);
  load_statistics<kQueries<D>>(p, bh, m0, stats);
}
}  // namespace sm90

/// Kernel 2 on Hopper. Grid (ceil(Sk / 128), H, B), 256 threads, sm90::Shared<D>::kBytes of
/// dynamic shared memory; launched only where the library carries sm_90a code and the device is
/// compute capability 9.0 (elsewhere the kernel stops).
template <class T, int D, bool kCausal>
__global__ void __launch_bounds__(sm90::kThreads, 1)
    kv_sm90(Problem<T> p, T* __restrict__ grad_k, T* __restrict__ grad_v) {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using attention_sm90::descriptor;
  using attention_sm90::fence_operands;
  using attention_sm90::fence_proxy_async;
  using attention_sm90::wgmma_commit;
  using attention_sm90::wgmma_fence;
  using attention_sm90::wgmma_rs;
  using attention_sm90::wgmma_ss;
  using attention_sm90::wgmma_wait;
  using L = sm90::Shared<D>;
  using sm90::kKeys;
  using sm90::kRow;
  using sm90::scores;
  constexpr int kQueries = sm90::kQueries<D>, kTilesQ = kQueries / 8;
  extern __shared__ __align__(16) unsigned char shared[];  // aligned to 1024 bytes below
  // The launch and this kernel disagree: fail, never compute wrong.
  if (blockDim.x != sm90::kThreads || attention_detail::dynamic_shared_bytes() < L::kBytes) __trap();
  const unsigned raw = smem_address(shared), base = (raw + 1023u) & ~1023u;
  unsigned char* const tiles = shared + (base - raw);  // generic address of `base`
  float* const stats = reinterpret_cast<float*>(tiles + L::kStats);

  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int64_t batch = blockIdx.z, head = blockIdx.y, bh = batch * p.heads + head;
  const int64_t n0 = int64_t{blockIdx.x} * kKeys, sq = p.sq, sk = p.sk;
  const T* qb = rows_of(p.q, p.s_q, batch, head);
  const T* gb = rows_of(p.grad_o, p.s_grad_o, batch, head);
  const T* mb = p.mask ? p.mask + batch * sk : nullptr;

  sm90::load_tile<T, D, kKeys>(tiles + L::kK, rows_of(p.k, p.s_k, batch, head), p.s_k.row, n0, sk);
  sm90::load_tile<T, D, kKeys>(tiles + L::kV, rows_of(p.v, p.s_v, batch, head), p.s_v.row, n0, sk);
  // Causal: query rows before n0 see none of these keys. A block whose keys no query sees
  // (causal, n0 >= Sq) loads no step: its statistics would lie past sq_stats.
  const int64_t m_begin = kCausal ? (n0 / kQueries) * kQueries : 0;
  if (m_begin < sq) sm90::load_step<T, D>(p, qb, gb, bh, m_begin, tiles + L::kStages, stats);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
  const BlockKeys keys(group * 64 + warp * 16 + lane / 4, n0, sk, mb);
  // The warpgroup's rows of K and V (in half 0; half h is kKeys rows further), and its dS^T.
  const unsigned k_rows = base + L::kK + group * 64 * kRow, v_rows = base + L::kV + group * 64 * kRow;
  const unsigned k_all = base + L::kK, ds_all = base + L::kDs;  // both warpgroups' K rows and dS^T
  unsigned char* const ds_tile = tiles + L::kDs + group * L::kDsTile;

  for (int64_t m0 = m_begin, step = 0; m0 < sq; m0 += kQueries, ++step) {
    // Stage `step % 2` holds this step's rows; the next step's loads go to the other stage, whose
    // readers (the previous step's products) every warpgroup has waited for.
    cp_async_wait_all();
    fence_proxy_async();  // this thread's cp.async writes, visible to wgmma
    __syncthreads();
    const int st = static_cast<int>(step & 1);
    if (m0 + kQueries < sq)
      sm90::load_step<T, D>(p, qb, gb, bh, m0 + kQueries, tiles + L::kStages + (st ^ 1) * L::kStage,
                            stats + (st ^ 1) * 2 * kQueries);
    cp_async_commit();
    const unsigned q_at = base + L::kStages + st * L::kStage, g_at = q_at + L::kQueryTile;
    const float* lse = stats + st * 2 * kQueries;
    const float* delta = lse + kQueries;

    // S^T = K Q^T and dP^T = V dO^T for the warpgroup's 64 keys and the step's queries.
    float s[kTilesQ][4], dp[kTilesQ][4];
#pragma unroll
    for (int j = 0; j < kTilesQ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {  // head-dim columns 16 kk ..: half kk / 4, 32 bytes per step
      const unsigned at = (kk / 4) * kKeys * kRow + (kk % 4) * 32, q_col = (kk / 4) * kQueries * kRow + (kk % 4) * 32;
      scores<T>(s, descriptor(k_rows + at, 16, 1024), descriptor(q_at + q_col, 16, 1024), kk > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned at = (kk / 4) * kKeys * kRow + (kk % 4) * 32, g_col = (kk / 4) * kQueries * kRow + (kk % 4) * 32;
      scores<T>(dp, descriptor(v_rows + at, 16, 1024), descriptor(g_at + g_col, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_operands(s);
    keys.probabilities<kCausal>(s, m0, n0, kKeys, p.scale_log2, lse, lane);
    wgmma_wait<0>();
    fence_operands(dp);
    scores_gradient(dp, s, delta, lane);

    // dV += P^T dO and dK += dS^T Q: P^T and dS^T rounded to T as A operands; dO and Q as
    // transposed B operands (queries 16 kk .. are 16 rows of 128 bytes).
    unsigned pa[kQueries / 16][4], da[kQueries / 16][4];
#pragma unroll
    for (int kk = 0; kk < kQueries / 16; ++kk) {
      attention_detail::pack_p<T>(s, kk, pa[kk]);
      attention_detail::pack_p<T>(dp, kk, da[kk]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQueries / 16; ++kk)
      wgmma_rs<T>(dv, pa[kk], descriptor(g_at + kk * 16 * kRow, kQueries * kRow, 1024));
#pragma unroll
    for (int kk = 0; kk < kQueries / 16; ++kk)
      wgmma_rs<T>(dk, da[kk], descriptor(q_at + kk * 16 * kRow, kQueries * kRow, 1024));
    wgmma_commit();

    // dS^T to shared memory, [key][query] in halves of 64 queries, swizzled as the tiles.
#pragma unroll
    for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = warp * 16 + lane / 4 + h * 8;
        *reinterpret_cast<unsigned*>(ds_tile + (nt / 8) * 64 * kRow + key * kRow + (((nt % 8) ^ (key % 8)) << 4) +
                                     (lane & 3) * 4) = pack2<T>(dp[nt][2 * h], dp[nt][2 * h + 1]);
      }
    fence_proxy_async();
    __syncthreads();  // both warpgroups' dS^T are whole
    // dQ += dS K over the block's 128 keys as two 64 x 64 tiles: warpgroup g computes tile g
    // (queries 64 (g / (D / 64)) .., head-dim columns 64 (g % (D / 64)) ..) from both
    // warpgroups' dS^T and K rows (dS: M = queries, K: N = head dim, both MN-major), and adds it
    // into the float32 buffer: one atomic per element and block.
    static_assert(kQueries / 64 * (D / 64) == 2, "one dQ tile per warpgroup");
    const int queries = group / (D / 64), half = group % (D / 64);
    float dq[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[j][e] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {  // keys 16 kk ..: warpgroup kk / 4's, 16 rows of 128 bytes
      const unsigned owner = kk / 4, rows = (kk % 4) * 16 * kRow;
      wgmma_ss<T, 1, 1>(dq, descriptor(ds_all + owner * L::kDsTile + queries * 64 * kRow + rows, 64 * kRow, 1024),
                        descriptor(k_all + owner * 64 * kRow + half * kKeys * kRow + rows, kKeys * kRow, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(dq);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t query = m0 + queries * 64 + warp * 16 + lane / 4 + h * 8;
      if (query >= sq) continue;
      float* row = p.dq + (bh * sq + query) * D + half * 64 + (lane & 3) * 2;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) atomic_add_pair(row + nt * 8, dq[nt][2 * h], dq[nt][2 * h + 1]);
    }
    fence_operands(dv);
    fence_operands(dk);
    fence_operands(pa);
    fence_operands(da);
  }
  cp_async_wait_all();
  store_key_rows<T, D>(dk, dv, p, bh, n0 + keys.key_in_block, lane, grad_k, grad_v);
#else
  __trap();  // launched only where sm_90a code is carried (attention_backward_cuda)
#endif
}

/// Kernel 3. grad_q = scale * the float32 buffer, rounded to T; a grid-stride loop over n
/// elements.
template <class T>
__global__ void __launch_bounds__(256)
    finish_q(const float* __restrict__ dq, float scale, T* __restrict__ grad_q, int64_t n) {
  for (int64_t i = opforge::kernel::global_index(); i < n; i += int64_t{gridDim.x} * blockDim.x)
    grad_q[i] = opforge::kernel::from_acc<T>(dq[i] * scale);
}

Strides strides_of(const opforge::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

/// Whether kv_sm90 runs here: the library carries sm_90a code (OPFORGE_ATTENTION_SM90A, set by
/// the build where it targets compute capability 9.0) and the device is compute capability 9.0,
/// whose images the driver takes from that code.
inline bool uses_sm90a() {
#if defined(OPFORGE_ATTENTION_SM90A)
  return opforge::cuda::compute_capability() == 90;
#else
  return false;
#endif
}

/// Kernel 1 on `stream`: each query row's lse and delta into the scratch rows.
template <class T, int D>
void launch_stats(cudaStream_t stream, const Problem<T>& p, int64_t batch) {
  const dim3 grid(static_cast<unsigned>(p.sq_stats / kStatRows), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(batch));
  stats<T, D><<<grid, 2 * kStatRows, 0, stream>>>(p);
  opforge::cuda::check_launch("attention_backward::stats");
}

/// Kernel 2 on `stream`: kv_sm90 where uses_sm90a() (head dims 64 and 128), kv elsewhere.
template <class T, int D, bool kCausal>
void launch_kv(cudaStream_t stream, const Problem<T>& p, int64_t batch, T* grad_k, T* grad_v) {
  if constexpr (D >= 64) {
    if (uses_sm90a()) {
      const dim3 grid(static_cast<unsigned>((p.sk + sm90::kKeys - 1) / sm90::kKeys), static_cast<unsigned>(p.heads),
                      static_cast<unsigned>(batch));
      constexpr size_t kBytes = sm90::Shared<D>::kBytes;
      opforge::cuda::allow_dynamic_smem(kv_sm90<T, D, kCausal>, kBytes);
      kv_sm90<T, D, kCausal><<<grid, sm90::kThreads, kBytes, stream>>>(p, grad_k, grad_v);
      opforge::cuda::check_launch("attention_backward::kv_sm90");
      return;
    }
  }
  const dim3 grid(static_cast<unsigned>((p.sk + kKeys - 1) / kKeys), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(batch));
  opforge::cuda::allow_dynamic_smem(kv<T, D, kCausal>, KvShared<T, D>::kBytes);
  kv<T, D, kCausal><<<grid, kThreads, KvShared<T, D>::kBytes, stream>>>(p, grad_k, grad_v);
  opforge::cuda::check_launch("attention_backward::kv");
}

template <class T, int D, bool kCausal>
void launch(const opforge::Context& ctx, const Problem<T>& p, int64_t batch, T* grad_q, T* grad_k, T* grad_v) {
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  launch_stats<T, D>(stream, p, batch);
  launch_kv<T, D, kCausal>(stream, p, batch, grad_k, grad_v);

  const int64_t n = batch * p.heads * p.sq * D;
  finish_q<T><<<opforge::cuda::grid_for(n, 256), 256, 0, stream>>>(p.dq, p.scale, grad_q, n);
  opforge::cuda::check_launch("attention_backward::finish_q");
}

}  // namespace attention_backward

void attention_backward_cuda(const opforge::Context& ctx, opforge::Tensor q, opforge::Tensor k, opforge::Tensor v,
                             opforge::Tensor grad_o, opforge::Tensor o, opforge::Tensor lse, int64_t head_dim,
                             opforge::Tensor mask, bool causal, double scale, opforge::MutableTensor grad_q,
                             opforge::MutableTensor grad_k, opforge::MutableTensor grad_v) {
  namespace ab = attention_backward;
  OPFORGE_CHECK(q.size(0) <= 65535 && q.size(1) <= 65535,
                "batch and heads must be at most 65535 each (one grid dim each), got ", q.size(0), " and ", q.size(1));
  const int64_t batch = q.size(0), heads = q.size(1), sq = q.size(2), sk = k.size(2);
  if (batch * heads * sk == 0) {  // no keys: every probability is absent, so is every gradient
    const cudaStream_t stream = opforge::cuda::stream(ctx);
    OPFORGE_CUDA_CHECK(cudaMemsetAsync(grad_q.raw_data(), 0, q.numel() * opforge::dtype_size(q.dtype()), stream));
    return;
  }
  if (sq == 0) {
    const cudaStream_t stream = opforge::cuda::stream(ctx);
    OPFORGE_CUDA_CHECK(cudaMemsetAsync(grad_k.raw_data(), 0, k.numel() * opforge::dtype_size(k.dtype()), stream));
    OPFORGE_CUDA_CHECK(cudaMemsetAsync(grad_v.raw_data(), 0, v.numel() * opforge::dtype_size(v.dtype()), stream));
    return;
  }
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int64_t sq_stats = (sq + ab::kStatRows - 1) / ab::kStatRows * ab::kStatRows;
  const size_t rows = static_cast<size_t>(batch * heads * sq),
               stat_rows = static_cast<size_t>(batch * heads * sq_stats);
  float* scratch =
      static_cast<float*>(ctx.allocate((2 * stat_rows + rows * static_cast<size_t>(head_dim)) * sizeof(float)));
  float* dq = scratch + 2 * stat_rows;
  OPFORGE_CUDA_CHECK(cudaMemsetAsync(dq, 0, rows * head_dim * sizeof(float), opforge::cuda::stream(ctx)));
  opforge::cuda::visit_dtype<opforge::half_precision>(q.dtype(), [&]<class T>(opforge::type_tag<T>) {
    ab::Problem<T> p{grad_o.data<T>(),
                     q.data<T>(),
                     k.data<T>(),
                     v.data<T>(),
                     o.data<T>(),
                     mask.defined() ? mask.data<T>() : nullptr,
                     lse.data<float>(),
                     ab::strides_of(grad_o),
                     ab::strides_of(q),
                     ab::strides_of(k),
                     ab::strides_of(v),
                     ab::strides_of(o),
                     heads,
                     sq,
                     sk,
                     sq_stats,
                     static_cast<float>(s),
                     static_cast<float>(s) * ab::kLog2e,
                     scratch,
                     scratch + stat_rows,
                     dq};
    T *gq = grad_q.data<T>(), *gk = grad_k.data<T>(), *gv = grad_v.data<T>();
    const auto run = [&]<int D>() {
      if (causal) ab::launch<T, D, true>(ctx, p, batch, gq, gk, gv);
      else ab::launch<T, D, false>(ctx, p, batch, gq, gk, gv);
    };
    if (head_dim == 32) run.template operator()<32>();
    else if (head_dim == 64) run.template operator()<64>();
    else run.template operator()<128>();
  });
}
