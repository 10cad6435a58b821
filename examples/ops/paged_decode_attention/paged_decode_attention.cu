// paged_decode_attention on CUDA, the host side: picks split_kernel's instantiation (16-bit
// dtype, cache dtype and elements per load, lanes per token row, query heads per block), how many
// splits each context gets and
// where split contexts are combined, then launches split_kernel and, where it does not combine,
// combine_kernel behind it (Note [Paged decode on CUDA] in paged_decode_attention.cuh).
//
// Ahead-of-time CUDA rather than a run-time kernel: a split context needs float32 scratch memory
// for its partial sums (opforge::Context::allocate) and a second launch that reduces them, and an
// op's run-time kernel (.cuda_source, .triton_source) is one launch with no scratch memory.
#include <opforge/cuda.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "paged_decode_attention.cuh"

namespace paged_decode {

/// The launch rule's free choices: where split contexts are combined (in split_kernel's last
/// block of each item, or by combine_kernel) and the fewest tokens a split takes where a context
/// has several. The defaults hold unless OPFORGE_PAGED_DECODE_TUNING, read on every call, says
/// otherwise: a tuning knob for benchmarks (bench/bench_decode.py --sweep), not an interface,
/// "combine=last_block|kernel" and "split_tokens=<1..65536>", comma-separated, either optional.
/// Throws opforge::InvalidArgument naming the variable for any other text.
struct Tuning {
  bool last_block = false;
  int64_t split_tokens = 128;
};

Tuning tuning() {
  Tuning t;
  const char* env = std::getenv("OPFORGE_PAGED_DECODE_TUNING");
  if (env == nullptr || *env == 0) return t;
  const std::string text = env;
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, end - start);
    bool ok = true;
    if (part == "combine=last_block" || part == "combine=kernel") {
      t.last_block = part == "combine=last_block";
    } else if (part.rfind("split_tokens=", 0) == 0 && part.size() > 13 && part.size() <= 18 &&
               part.find_first_not_of("0123456789", 13) == std::string::npos) {
      t.split_tokens = std::stoll(part.substr(13));
      ok = t.split_tokens >= 1 && t.split_tokens <= 65536;
    } else {
      ok = false;
    }
    OPFORGE_CHECK(ok, "OPFORGE_PAGED_DECODE_TUNING: expected comma-separated ",
                  "combine=last_block|kernel and split_tokens=<1..65536>, got '", text, "'");
    start = end + 1;
  }
  return t;
}

/// Blocks of split_kernel<T, C, kVec, kLanes, kHeads> resident on the current device at once
/// (occupancy times multiprocessors), computed once per device, after letting the kernel take its
/// dynamic shared memory (more than the default 48 KiB at some instantiations).
template <class T, class C, int kVec, int kLanes, int kHeads>
int64_t resident() {
  static std::atomic<int> per_device[64] = {};
  return opforge::cuda::detail::per_device(per_device, [](int) {
    constexpr auto kernel = split_kernel<T, C, kVec, kLanes, kHeads>;
    constexpr int bytes = Layout<kVec, kLanes, kHeads>::kBytes;
    opforge::cuda::allow_dynamic_smem(kernel, bytes);
    return static_cast<int>(opforge::cuda::resident_blocks(kernel, kThreads, bytes));
  });
}

/// Pages per split for `items` (sequence, kv head, chunk) items whose block tables have
/// `max_blocks` entries, with `resident` blocks fitting on the device at once (resident blocks
/// per multiprocessor times the device's multiprocessors). Contexts are split so that the grid
/// fills the device in whole waves: of the splittings that keep at most kMaxPages pages (and 2^30
/// tokens) per split and at least `split_tokens` tokens per split (where there are several), the
/// one whose blocks use the largest share of the resident slots over their waves, a split context
/// (which costs a combine and scratch memory) only where that gains more than 3 % (for 64
/// sequences of 4096 tokens on 8 kv heads on an H100, 512 blocks fill 512 of 528 slots: one split
/// each; for one sequence, 32 splits of 128 tokens).
int64_t pages_per_split(int64_t items, int64_t max_blocks, int64_t block_size, int64_t resident, int64_t split_tokens) {
  const int64_t most = std::min<int64_t>(kMaxPages, std::max<int64_t>(1, (int64_t{1} << 30) / block_size));
  const int64_t fewest = std::max<int64_t>(1, (split_tokens + block_size - 1) / block_size);
  const int64_t min_splits = (max_blocks + most - 1) / most;
  const int64_t max_splits = std::max(min_splits, std::min<int64_t>(kMaxSplits, (2 * resident + items - 1) / items));
  int64_t best = (max_blocks + min_splits - 1) / min_splits;
  double best_share = -1;
  for (int64_t n = min_splits; n <= max_splits; ++n) {
    const int64_t pages = (max_blocks + n - 1) / n, splits = (max_blocks + pages - 1) / pages;
    if (splits > 1 && pages < fewest && n > min_splits) break;
    const int64_t blocks = items * splits, waves = (blocks + resident - 1) / resident;
    const double share = static_cast<double>(blocks) / static_cast<double>(waves * resident) - (splits > 1 ? 0.03 : 0);
    if (share > best_share) {
      best_share = share;
      best = pages;
    }
  }
  return best;
}

template <class T, class C, int kVec, int kLanes, int kHeads>
void launch(const opforge::Context& ctx, Params p, int64_t seqs, const Tuning& tune) {
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  p.chunks = (p.group + kHeads - 1) / kHeads;
  const int64_t items = seqs * p.kv_heads * p.chunks;
  p.pages_per_split =
      pages_per_split(items, p.max_blocks, p.block_size, resident<T, C, kVec, kLanes, kHeads>(), tune.split_tokens);
  p.splits = (p.max_blocks + p.pages_per_split - 1) / p.pages_per_split;
  OPFORGE_CHECK(items * p.splits <= 0x7fffffff, "more than 2^31 - 1 thread blocks (", items, " sequences x kv heads ",
                "x head chunks, ", p.splits, " splits each)");
  const bool last_block = p.splits > 1 && tune.last_block;
  if (p.splits > 1) {  // scratch: partial outputs, their log-sum-exps, then the items' counters
    const auto rows = static_cast<size_t>(seqs * p.heads * p.splits);
    const size_t floats = rows * (static_cast<size_t>(p.head_dim) + 1);
    const size_t counters = last_block ? static_cast<size_t>(items) * sizeof(unsigned) : 0;
    p.partial_out = static_cast<float*>(ctx.allocate(floats * sizeof(float) + counters));
    p.partial_lse = p.partial_out + rows * static_cast<size_t>(p.head_dim);
    if (last_block) {
      p.counters = reinterpret_cast<unsigned*>(p.partial_out + floats);
      OPFORGE_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, counters, stream));
    }
  }
  constexpr auto kSplit = split_kernel<T, C, kVec, kLanes, kHeads>;
  const dim3 grid(static_cast<unsigned>(items * p.splits));
  constexpr size_t kSmem = Layout<kVec, kLanes, kHeads>::kBytes;
  if (ctx.after_value_check() && !last_block) {  // nothing between the check and this launch
    opforge::cuda::launch_after<kSplit>(grid, dim3(kThreads), kSmem, stream, "paged_decode_attention::split_kernel", p);
  } else {
    kSplit<<<grid, kThreads, kSmem, stream>>>(p);
    opforge::cuda::check_launch("paged_decode_attention::split_kernel");
  }
  if (p.splits > 1 && !last_block)
    opforge::cuda::launch_after<combine_kernel<T>>(dim3(static_cast<unsigned>(seqs * p.heads)), dim3(kThreads), 0,
                                                   stream, "paged_decode_attention::combine_kernel", p);
}

/// launch<T, C, kVec, kLanes, kHeads> for kVec the cache elements per load (8 of a 16-bit cache:
/// 16 bytes; 16 of a float8 one where head_dim is a multiple of 16, else 8: 8 bytes), kLanes the
/// lanes per token row (head_dim / kVec rounded up to a power of two, at least 4; always 32 for
/// 8-byte float8 loads, a rare head dim) and kHeads the query heads per block (the group size
/// rounded up to a power of two, at most 8, or 4 at 16 float8 elements per lane, whose query and
/// output elements take twice the registers: a larger group takes several blocks per kv head).
template <class T, class C>
void dispatch(const opforge::Context& ctx, const Params& p, int64_t seqs, const Tuning& tune) {
  const auto with_heads = [&]<int kVec, int kLanes>() {
    constexpr int most = kVec == 16 ? 4 : 8;
    const int64_t group = std::min<int64_t>(p.group, most);
    if (group <= 1) launch<T, C, kVec, kLanes, 1>(ctx, p, seqs, tune);
    else if (group <= 2) launch<T, C, kVec, kLanes, 2>(ctx, p, seqs, tune);
    else if (group <= 4) launch<T, C, kVec, kLanes, 4>(ctx, p, seqs, tune);
    else if constexpr (most == 8) launch<T, C, kVec, kLanes, 8>(ctx, p, seqs, tune);
  };
  if constexpr (sizeof(C) == 1) {
    if (p.head_dim % 16 != 0) return with_heads.template operator()<8, 32>();
    const int64_t vectors = p.head_dim / 16;
    if (vectors <= 4) with_heads.template operator()<16, 4>();
    else if (vectors <= 8) with_heads.template operator()<16, 8>();
    else with_heads.template operator()<16, 16>();
  } else {
    const int64_t vectors = p.head_dim / 8;
    if (vectors <= 4) with_heads.template operator()<8, 4>();
    else if (vectors <= 8) with_heads.template operator()<8, 8>();
    else if (vectors <= 16) with_heads.template operator()<8, 16>();
    else with_heads.template operator()<8, 32>();
  }
}

}  // namespace paged_decode

void paged_decode_attention_cuda(const opforge::Context& ctx, opforge::Tensor query, opforge::Tensor key_cache,
                                 opforge::Tensor value_cache, opforge::Tensor block_tables, opforge::Tensor seq_lens,
                                 double scale, std::string_view kv_cache_dtype, opforge::Tensor k_scale,
                                 opforge::Tensor v_scale, opforge::MutableTensor out) {
  namespace pd = paged_decode;
  const int64_t seqs = query.size(0), heads = query.size(1), dim = query.size(2), kv_heads = key_cache.size(2);
  const int64_t max_blocks = block_tables.size(1), block_size = key_cache.size(1);
  if (seqs * heads * dim == 0) return;
  if (max_blocks * block_size * kv_heads == 0) {  // no cached token: every output is zero
    OPFORGE_CUDA_CHECK(
        cudaMemsetAsync(out.raw_data(), 0, out.numel() * opforge::dtype_size(out.dtype()), opforge::cuda::stream(ctx)));
    return;
  }
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(dim));
  pd::Params p{};
  p.query = query.raw_data();
  p.key_cache = key_cache.raw_data();
  p.value_cache = value_cache.raw_data();
  if (kv_cache_dtype != "auto") {  // a float8 cache: the scales given, 1 where left out
    p.k_scale = k_scale.defined() ? k_scale.data<float>() : nullptr;
    p.v_scale = v_scale.defined() ? v_scale.data<float>() : nullptr;
  }
  p.block_tables = block_tables.data<int32_t>();
  p.seq_lens = seq_lens.data<int32_t>();
  p.out = out.raw_data();
  p.query_seq_stride = query.stride(0);
  p.query_head_stride = query.stride(1);
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.group = heads / kv_heads;
  p.head_dim = dim;
  p.block_size = block_size;
  p.max_blocks = max_blocks;
  p.scale_log2 = static_cast<float>(s * 1.4426950408889634);
  const pd::Tuning tune = pd::tuning();
  opforge::cuda::visit_dtype<opforge::half_precision>(query.dtype(), [&]<class T>(opforge::type_tag<T>) {
    // The dtype rule admits the query's dtype and the float8 ones only.
    opforge::cuda::visit_dtype<opforge::half_precision | opforge::float8>(
        key_cache.dtype(), [&]<class C>(opforge::type_tag<C>) {
          if constexpr (std::is_same_v<C, T> || sizeof(C) == 1) pd::dispatch<T, C>(ctx, p, seqs, tune);
        });
  });
}
