// The device code of paged_decode_attention on CUDA (the host side, which picks the kernels and
// the split of the context, is paged_decode_attention.cu).
//
// Note [Paged decode on CUDA]
// ---------------------------
// Decode attention reads every cached key and value row of a sequence once and does little
// arithmetic per byte (2 * G multiply-adds per element for G query heads per kv head), so the
// kernels are built to keep the memory system busy:
//   - split_kernel: one block of four warps per (sequence, kv head, split of the context, chunk of
//     at most kHeads of its G query heads). The block reads its pages' block ids into shared
//     memory, then each warp streams its own stages of tokens (warp w takes stages w, w + 4, ...)
//     into a ring of kStages stages in shared memory with cp.async, kStages - 1 stages ahead of
//     the one it computes: bytes in flight without registers to hold them. A stage is kSteps
//     tokens per group of kLanes lanes; the lanes of a group split one token's head_dim into
//     vectors of kVec elements, one load each (kLanes = head_dim / kVec rounded up to a power of
//     two, at least 4), and each lane reads back only the vectors it copied, so no barrier orders
//     the ring. A vector is 16 bytes: 8 elements of a 16-bit cache, 16 of a float8 one (8 bytes,
//     8 float8 elements, where a float8 row is not a whole number of 16-byte vectors).
//   - each lane holds its kVec elements of the block's query heads, scaled by scale * log2(e)
//     (and the keys' scale, for a float8 cache), and the matching elements of each head's running
//     output; a score is a lane's partial dot product summed over its group by shuffles. The
//     online softmax (running maximum m and sum l per head, Milakov and Gimelshein 2018) is
//     updated once per stage, in log2 units. A float8 element is widened to float as it is used
//     (CacheVector::widen); the values' scale multiplies the output once, where it is written.
//   - at the end the groups of a warp, then the warps of the block, merge their (m, l, output)
//     triples; a block that covers the whole context writes the output, otherwise its output
//     divided by l and its log-sum-exp m + log2(l) go to float32 scratch memory.
//   - the splits are combined (flash-decoding's reduction, Dao et al. 2023: each split's output
//     weighed by 2^(lse - max lse)) by combine_row, in one of two places the launch rule picks:
//       * combine_kernel, launched behind split_kernel by programmatic dependent launch: one block
//         per (sequence, head);
//       * or the last block of each (sequence, kv head, chunk) to finish, in split_kernel itself
//         (the "last block" reduction of the CUDA programming guide's threadFenceReduction
//         sample, as stream-K's fixup): every block of a split context writes its partial sums,
//         fences them (__threadfence), then takes a ticket from its item's counter (zeroed on the
//         stream before the launch); the block that draws the last ticket fences again, reads the
//         other blocks' partial sums past L1 (__ldcg) and writes the output. No second launch.
//   - the block ids of a split are loaded before its context length is known (every entry of
//     block_tables is a block index), so the two loads overlap. Where the core checked the block
//     ids and context lengths on the device just before (Context::after_value_check), split_kernel
//     is launched as the check's programmatic dependent: it loads its ids, lengths and queries
//     while the check runs and waits for its verdict before the first page is read.
// Special values follow the CPU reference: a NaN score makes the head's output NaN, a sequence
// with no token or only -inf scores gets zeros.
#pragma once

#include <opforge/cuda.h>

namespace paged_decode {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
/// Stages in each warp's ring: kStages - 1 in flight while one is computed.
constexpr int kStages = 3;
/// Pages (cache blocks) one split covers at most: their block ids sit in shared memory.
constexpr int kMaxPages = 256;
static_assert(kMaxPages % kThreads == 0, "split_kernel loads kMaxPages / kThreads block ids per thread");
/// Splits of one context that pages_per_split considers at most (more only where a context has
/// more than kMaxPages * kMaxSplits pages).
constexpr int kMaxSplits = 1024;
constexpr float kLog2e = 1.4426950408889634f;

/// What both kernels read: pointers, sizes (elements) and the split of the contexts.
struct Params {
  const void* query;
  const void* key_cache;
  const void* value_cache;
  const float* k_scale;         // 0-dim: the keys' scale, or null (1: a cache of the query's dtype)
  const float* v_scale;         // 0-dim: the values' scale, or null (1)
  const int32_t* block_tables;  // [seqs, max_blocks], dense
  const int32_t* seq_lens;      // [seqs]
  void* out;                    // [seqs, heads, head_dim], dense
  float* partial_out;           // [seqs, heads, splits, head_dim]: each split's output / l
  float* partial_lse;           // [seqs, heads, splits]: each split's m + log2(l), log2 units
  unsigned* counters;           // [seqs * kv_heads * chunks], zeroed: split_kernel combines; null: combine_kernel
  int64_t query_seq_stride, query_head_stride;
  int64_t heads, kv_heads, group, chunks, head_dim, block_size, max_blocks;
  int64_t pages_per_split, splits;
  float scale_log2;  // the scores' scale times log2(e)
};

/// How split_kernel reads cache elements of type C (the query's 16-bit type, or __nv_fp8_e4m3 or
/// __nv_fp8_e5m2): kVec of them per lane and token row, copied by one cp.async of kBytes (16, or
/// 8 for float8 rows that are not whole 16-byte vectors) into a 16-byte slot of the ring, and
/// widened to float.
template <class C, int kVec>
struct CacheVector {
  static constexpr bool kFloat8 = sizeof(C) == 1;
  static constexpr int kBytes = kVec * static_cast<int>(sizeof(C));
  static_assert(kBytes == 16 || (kFloat8 && kBytes == 8), "a cache vector is 16 bytes, or 8 of float8");

  /// The kVec elements at the start of `v` (a ring slot) as floats.
  __device__ __forceinline__ static void widen(const uint4& v, float (&out)[kVec]) {
    if constexpr (!kFloat8) {
      opforge::kernel::unpack<C>(v, out);
    } else {
      constexpr __nv_fp8_interpretation_t kind =
          opforge::kernel::is_same<C, __nv_fp8_e4m3>::value ? __NV_E4M3 : __NV_E5M2;
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {  // two elements per conversion, exact (float8 -> half -> float)
        const __half2 h =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), kind);
        const float2 f = __half22float2(h);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    }
  }
};

/// The shape of split_kernel<T, C, kVec, kLanes, kHeads>'s work and its dynamic shared memory: the
/// block ids of its pages, then the warps' rings, whose bytes the merge of the warps reuses.
template <int kVec, int kLanes, int kHeads>
struct Layout {
  static constexpr int kGroups = 32 / kLanes;  // tokens per warp and step
  // A lane holds kHeads * kVec elements of the query and of the output: their weight in 8-element
  // vectors sets the steps per stage, fewer where it is large (8, or 4 at 32 lanes), to stay in
  // registers.
  static constexpr int kWeight = kHeads * kVec / 8;
  static constexpr int kSteps = kWeight >= 8 || (kWeight >= 4 && kLanes >= 32) ? 2 : 4;
  static constexpr int kStageTokens = kGroups * kSteps;           // tokens per warp and stage
  static constexpr int kRingVectors = kStages * kSteps * 2 * 32;  // 16-byte slots per warp: K and V
  static constexpr int kPagesBytes = kMaxPages * 4;
  static constexpr int kMergeFloats = kWarps * kHeads * (2 + kLanes * kVec);
  static constexpr int kRingBytes = kWarps * kRingVectors * 16;
  static constexpr int kBytes = kPagesBytes + (kRingBytes > kMergeFloats * 4 ? kRingBytes : kMergeFloats * 4);
};

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

/// 2^x (PTX ex2.approx: 2^-inf = 0, NaN stays NaN).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Copies kBytes (16: bypassing L1, or 8) from global to shared memory asynchronously (cp.async,
/// sm_80); both addresses aligned to kBytes.
template <int kBytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  static_assert(kBytes == 16 || kBytes == 8, "cp_async: 16 or 8 bytes");
#if __CUDA_ARCH__ >= 800
  const auto smem = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(src) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem), "l"(src) : "memory");
#else
  if constexpr (kBytes == 16) *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  else *static_cast<uint2*>(dst) = *static_cast<const uint2*>(src);
#endif
}

/// Closes this thread's group of cp.async copies (an empty group is a group).
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/// Waits until at most kPending of this thread's groups are in flight; the copies of the groups
/// before them are then visible to this thread.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

/// (m, l, acc) merged with (m2, l2, acc2): two softmax partial sums over disjoint tokens, each
/// relative to its own maximum (-inf where it saw no finite score).
template <int kN>
__device__ __forceinline__ void merge(float& m, float& l, float (&acc)[kN], float m2, float l2,
                                      const float (&acc2)[kN]) {
  const float mx = fmaxf(m, m2);
  const float a = m == neg_inf() ? 0.f : fast_exp2(m - mx), b = m2 == neg_inf() ? 0.f : fast_exp2(m2 - mx);
  m = mx;
  l = a * l + b * l2;
#pragma unroll
  for (int e = 0; e < kN; ++e) acc[e] = a * acc[e] + b * acc2[e];
}

/// Floats of shared memory combine_row takes as scratch.
constexpr int kCombineFloats = 6 * kThreads;

/// out[row] (row: sequence * heads + query head) from the first `n` splits of the row, those
/// that hold tokens: their outputs weighted by 2^(lse - max lse), over the weights' sum (zeros
/// where that is 0: no token, or only -inf scores; NaN where a weight is). Called by every
/// thread of a block of kThreads threads, after the splits' writes are visible; `scratch` is
/// kCombineFloats floats of shared memory, free again when it returns. The threads form
/// head_dim / 4 columns (a float4 of each split's output) by kThreads / columns groups; group k
/// reads splits k, k + groups, ... and merges them as it goes (merge: a split is the partial sum
/// (lse, 1, its output)), so no thread waits for a block-wide maximum before its loads; then the
/// groups' sums are merged through shared memory.
template <class T>
__device__ void combine_row(const Params& p, int64_t row, int64_t n, float* scratch) {
  const int dim = static_cast<int>(p.head_dim), cols = dim / 4, groups = kThreads / cols;
  const int col = threadIdx.x % cols, grp = threadIdx.x / cols;  // grp >= groups: no column
  float* const group_m = scratch;                                // [groups]
  float* const group_l = scratch + kThreads;                     // [groups]
  float* const group_acc = scratch + 2 * kThreads;               // [groups][dim]
  const float* const lse = p.partial_lse + row * p.splits;
  const float4* const part = reinterpret_cast<const float4*>(p.partial_out + row * p.splits * dim) + col;
  if (grp < groups) {
    float m = neg_inf(), l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int64_t j = grp; j < n; j += groups) {
      const float x = __ldcg(lse + j);
      const float4 v = __ldcg(part + j * cols);
      const float split_out[4] = {v.x, v.y, v.z, v.w};
      merge(m, l, acc, x, 1.f, split_out);
    }
    if (col == 0) {
      group_m[grp] = m;
      group_l[grp] = l;
    }
    *reinterpret_cast<float4*>(group_acc + grp * dim + col * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  }
  __syncthreads();  // the groups' partial sums
  T* const out = static_cast<T*>(p.out) + row * dim;
  for (int d = threadIdx.x; d < dim; d += kThreads) {
    float mx = neg_inf();
    for (int g = 0; g < groups; ++g) mx = fmaxf(mx, group_m[g]);
    float sum = 0.f, o = 0.f;
    for (int g = 0; g < groups; ++g) {
      const float mg = group_m[g], a = mg == neg_inf() ? 0.f : fast_exp2(mg - mx);
      sum += a * group_l[g];
      o += a * group_acc[g * dim + d];
    }
    out[d] = opforge::kernel::from_acc<T>(sum == 0.f ? 0.f : o / sum);
  }
  __syncthreads();  // scratch is free again
}

/// One split of one (sequence, kv head, chunk of query heads): Note [Paged decode on CUDA].
/// Grid: seqs * splits * kv_heads * chunks blocks (chunk fastest, so the blocks that read the
/// same rows run together), kThreads threads, Layout::kBytes of dynamic shared memory.
template <class T, class C, int kVec, int kLanes, int kHeads>
__global__ void __launch_bounds__(kThreads) split_kernel(const Params p) {
  using L = Layout<kVec, kLanes, kHeads>;
  using V = CacheVector<C, kVec>;
  static_assert(L::kRingBytes >= kCombineFloats * 4, "combine_row's scratch reuses the rings");
  constexpr int kGroups = L::kGroups, kSteps = L::kSteps, kStageTokens = L::kStageTokens;
  extern __shared__ __align__(16) unsigned char smem[];
  int32_t* const pages = reinterpret_cast<int32_t*>(smem);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / kLanes, vec = lane % kLanes;
  int64_t b = blockIdx.x;
  const int64_t chunk = b % p.chunks;
  b /= p.chunks;
  const int64_t kv_head = b % p.kv_heads;
  b /= p.kv_heads;
  const int64_t split = b % p.splits, seq = b / p.splits;
  const int64_t split_tokens = p.pages_per_split * p.block_size, first = split * split_tokens;
  // The split's block ids, loaded while its context length is: every entry is a block index.
  const int32_t* const table = p.block_tables + seq * p.max_blocks + split * p.pages_per_split;
  const int64_t table_left = p.max_blocks - split * p.pages_per_split;
  const int n_table = static_cast<int>(table_left < p.pages_per_split ? table_left : p.pages_per_split);
  int32_t page_ids[kMaxPages / kThreads];
#pragma unroll
  for (int j = 0; j < kMaxPages / kThreads; ++j) {
    const int i = j * kThreads + static_cast<int>(threadIdx.x);
    page_ids[j] = i < n_table ? table[i] : 0;
  }
  const int64_t seq_len = p.seq_lens[seq], left = seq_len - first;
  const int tokens = static_cast<int>(left < split_tokens ? left : split_tokens);  // <= 0: none here
  const int64_t used = (seq_len + split_tokens - 1) / split_tokens;                // splits holding tokens
  const bool alone = p.splits == 1 || (p.counters != nullptr && used == 1);        // writes the output itself
  const int64_t head0 = kv_head * p.group + chunk * kHeads;                        // the block's first query head
  const int64_t heads_left = p.group - chunk * kHeads;
  const int heads_here = heads_left < kHeads ? static_cast<int>(heads_left) : kHeads;
  const int dim = static_cast<int>(p.head_dim);
  T* const out = static_cast<T*>(p.out);
  if (tokens <= 0) {
    // The whole context is empty: zeros, from its only split or, where split_kernel combines,
    // its first (combine_kernel writes them otherwise).
    if (p.splits == 1 || (p.counters != nullptr && split == 0))
      for (int i = threadIdx.x; i < heads_here * dim; i += kThreads)
        out[(seq * p.heads + head0 + i / dim) * dim + i % dim] = opforge::kernel::from_acc<T>(0.f);
    return;
  }

  const int block_size = static_cast<int>(p.block_size);
  const int n_pages = (tokens + block_size - 1) / block_size;
#pragma unroll
  for (int j = 0; j < kMaxPages / kThreads; ++j)
    if (const int i = j * kThreads + static_cast<int>(threadIdx.x); i < n_pages) pages[i] = page_ids[j];

  const bool active = vec < dim / kVec;  // lanes past head_dim's vectors hold zeros
  float q[kHeads][kVec], acc[kHeads][kVec], m[kHeads], l[kHeads];
  const T* const query = static_cast<const T*>(p.query) + seq * p.query_seq_stride + vec * kVec;
  const float q_scale = p.k_scale != nullptr ? p.scale_log2 * *p.k_scale : p.scale_log2;
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    if (active && g < heads_here) {
#pragma unroll
      for (int j = 0; j < kVec / 8; ++j) {  // 16 bytes of the query's 16-bit elements each
        float part[8];
        opforge::kernel::unpack<T>(reinterpret_cast<const uint4*>(query + (head0 + g) * p.query_head_stride)[j], part);
#pragma unroll
        for (int e = 0; e < 8; ++e) q[g][8 * j + e] = part[e] * q_scale;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) q[g][e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[g][e] = 0.f;
    m[g] = neg_inf();
    l[g] = 0.f;
  }
  __syncthreads();  // the block ids
  // Launched beside the device value check of block_tables and seq_lens (where the host saw
  // Context::after_value_check()): its verdict comes before the first read through a block id.
  opforge::kernel::wait_for_value_checks();

  const C* const key_cache = static_cast<const C*>(p.key_cache) + kv_head * dim + vec * kVec;
  const C* const value_cache = static_cast<const C*>(p.value_cache) + kv_head * dim + vec * kVec;
  const int64_t row_stride = p.kv_heads * dim;  // elements from one cache row (slot) to the next
  uint4* const ring = reinterpret_cast<uint4*>(smem + L::kPagesBytes) + warp * L::kRingVectors;
  const int stages = (tokens + kStageTokens - 1) / kStageTokens;  // of the block, dealt to its warps in turn
  const int my_stages = stages > warp ? (stages - warp + kWarps - 1) / kWarps : 0;
  const auto token_of = [&](int i, int r) { return (i * kWarps + warp) * kStageTokens + r * kGroups + group; };
  const auto issue = [&](int i) {  // the copies of this warp's stage i into its ring slot i % kStages
    if (i < my_stages) {
      uint4* const slot = ring + (i % kStages) * (kSteps * 2 * 32);
#pragma unroll
      for (int r = 0; r < kSteps; ++r) {
        const int t = token_of(i, r);
        if (active && t < tokens) {
          const int64_t row = static_cast<int64_t>(pages[t / block_size]) * block_size + t % block_size;
          cp_async<V::kBytes>(slot + (2 * r) * 32 + lane, key_cache + row * row_stride);
          cp_async<V::kBytes>(slot + (2 * r + 1) * 32 + lane, value_cache + row * row_stride);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  for (int i = 0; i < my_stages; ++i) {
    issue(i + kStages - 1);
    cp_async_wait<kStages - 1>();  // stage i has landed
    const uint4* const slot = ring + (i % kStages) * (kSteps * 2 * 32);
    bool valid[kSteps];
    float s[kSteps][kHeads];  // scores, then probabilities
#pragma unroll
    for (int r = 0; r < kSteps; ++r) {
      valid[r] = token_of(i, r) < tokens;  // the same for every lane of a group
      float k[kVec] = {};
      if (active && valid[r]) V::widen(slot[(2 * r) * 32 + lane], k);
#pragma unroll
      for (int g = 0; g < kHeads; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot = fmaf(q[g][e], k[e], dot);
        s[r][g] = dot;
      }
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
#pragma unroll
      for (int r = 0; r < kSteps; ++r)
#pragma unroll
        for (int g = 0; g < kHeads; ++g) s[r][g] += __shfl_xor_sync(0xffffffffu, s[r][g], offset);
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      float mx = m[g];
#pragma unroll
      for (int r = 0; r < kSteps; ++r)
        if (valid[r]) mx = fmaxf(mx, s[r][g]);
      const float alpha = m[g] == neg_inf() ? 0.f : fast_exp2(m[g] - mx);
      m[g] = mx;
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][e] *= alpha;
#pragma unroll
      for (int r = 0; r < kSteps; ++r) {
        s[r][g] = valid[r] && s[r][g] != neg_inf() ? fast_exp2(s[r][g] - mx) : 0.f;
        l[g] += s[r][g];
      }
    }
#pragma unroll
    for (int r = 0; r < kSteps; ++r) {
      if (!(active && valid[r])) continue;
      float v[kVec];
      V::widen(slot[(2 * r + 1) * 32 + lane], v);
#pragma unroll
      for (int g = 0; g < kHeads; ++g)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] = fmaf(s[r][g], v[e], acc[g][e]);
    }
  }
  cp_async_wait<0>();
  opforge::cuda::allow_dependent_launch();  // the combine kernel may start; it waits for our writes

  // The groups of the warp (lanes vec, vec + kLanes, ...), then the warps, through shared memory.
#pragma unroll
  for (int offset = kLanes; offset < 32; offset *= 2)
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      float other[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) other[e] = __shfl_xor_sync(0xffffffffu, acc[g][e], offset);
      const float m2 = __shfl_xor_sync(0xffffffffu, m[g], offset), l2 = __shfl_xor_sync(0xffffffffu, l[g], offset);
      merge(m[g], l[g], acc[g], m2, l2, other);
    }
  __syncthreads();  // every warp is done with its ring: the merge reuses it
  float* const merged_m = reinterpret_cast<float*>(smem + L::kPagesBytes);  // [kWarps][kHeads]
  float* const merged_l = merged_m + kWarps * kHeads;                       // [kWarps][kHeads]
  float* const merged_acc = merged_l + kWarps * kHeads;                     // [kWarps][kHeads][kLanes * kVec]
  if (group == 0) {
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      if (lane == 0) {
        merged_m[warp * kHeads + g] = m[g];
        merged_l[warp * kHeads + g] = l[g];
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) merged_acc[((warp * kHeads + g) * kLanes + vec) * kVec + e] = acc[g][e];
    }
  }
  __syncthreads();
  const float v_scale = p.v_scale != nullptr ? *p.v_scale : 1.f;
  for (int i = threadIdx.x; i < heads_here * dim; i += kThreads) {
    const int g = i / dim, d = i % dim;
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, merged_m[w * kHeads + g]);
    float sum = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = merged_m[w * kHeads + g], a = mw == neg_inf() ? 0.f : fast_exp2(mw - mx);
      sum += a * merged_l[w * kHeads + g];
      o += a * merged_acc[(w * kHeads + g) * kLanes * kVec + d];
    }
    const int64_t row = seq * p.heads + head0 + g;  // (sequence, query head)
    const float o_row = sum == 0.f ? 0.f : o / sum * v_scale;
    if (alone) {
      out[row * dim + d] = opforge::kernel::from_acc<T>(o_row);
    } else {
      p.partial_out[(row * p.splits + split) * dim + d] = o_row;
      if (d == 0) p.partial_lse[row * p.splits + split] = sum == 0.f ? neg_inf() : mx + __log2f(sum);
    }
  }
  if (alone || p.counters == nullptr) return;

  // The last block of the item to finish combines its splits (Note [Paged decode on CUDA]).
  __shared__ bool last;
  __threadfence();  // this block's partial sums, before its ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t item = (seq * p.kv_heads + kv_head) * p.chunks + chunk;
    last = atomicAdd(p.counters + item, 1u) == static_cast<unsigned>(used - 1);
  }
  __syncthreads();  // also: every thread is done with merged_*, which combine_row's scratch reuses
  if (!last) return;
  __threadfence();  // the other blocks' partial sums, after their tickets
  for (int g = 0; g < heads_here; ++g)
    combine_row<T>(p, seq * p.heads + head0 + g, used, reinterpret_cast<float*>(smem + L::kPagesBytes));
}

/// out[s, h] from its splits' partial sums (combine_row). Grid: seqs * heads blocks of kThreads
/// threads, launched behind split_kernel by launch_after.
template <class T>
__global__ void __launch_bounds__(kThreads) combine_kernel(const Params p) {
  __shared__ __align__(16) float scratch[kCombineFloats];
  const int64_t row = blockIdx.x, seq = row / p.heads;  // row: (sequence, query head)
  const int64_t split_tokens = p.pages_per_split * p.block_size;
  const int64_t n = (p.seq_lens[seq] + split_tokens - 1) / split_tokens;
  opforge::cuda::wait_for_prior_grid();  // split_kernel's partial sums
  combine_row<T>(p, row, n, scratch);
}

}  // namespace paged_decode
