// paged_decode_attention: one decode step of attention over a paged KV cache (vLLM's
// paged_attention, FlashInfer's batch decode), forward only. Each sequence has one query token
// per head and attends to its first seq_lens[s] cached tokens:
//   out[s, h] = softmax_t(query[s, h] . key[s, t, h / G] * scale) v[s, t, h / G],  t < seq_lens[s]
// with G = heads / kv_heads query heads sharing each key/value head (grouped-query attention,
// SDPA's enable_gqa: query head h reads kv head h / G). Token t of sequence s lives in the
// caches written by examples::kv_cache_write, [blocks, block_size, kv_heads, head_dim]: row
// t % block_size of block block_tables[s, t / block_size]. Every entry of block_tables is a block
// index, used or not (pad with 0, as vLLM does). A sequence with no tokens, or whose every score
// is -inf, gets zeros. The CUDA kernels (paged_decode_attention.cu) split long contexts over
// several thread blocks and combine their partial softmax sums (flash-decoding).
//
// The caches may hold float8, as vLLM's paged_attention_v1/v2 read them (csrc/attention): under
// kv_cache_dtype "auto" they have the query's dtype; under "fp8" or "fp8_e4m3" they are
// float8_e4m3fn and under "fp8_e5m2" float8_e5m2, and a cached element x stands for the key
// element float(x) * k_scale, or the value element float(x) * v_scale, the per-tensor scales
// (0-dim float32 tensors, as examples::reshape_and_cache_flash writes with them). A scale left
// out is 1 (the default of vLLM's layers); under "auto" the scales are not read. The query may be
// of any floating dtype beside float8 caches too: the CPU reference computes in double whatever
// the dtypes, and the CUDA kernels take float16 and bfloat16 queries (.kernel_dtypes).
#include <opforge/op.h>

#include <cmath>
#include <string_view>
#include <type_traits>
#include <vector>

// CPU reference, in double: each (sequence, head)'s scores over its tokens, their log-sum-exp
// relative to the maximum, then the weighted sum of the value rows. A cached element of type C
// (T, or a float8 type) counts as double(element) * its cache's scale.
template <class T, class C>
static void decode_cpu(opforge::Tensor query, opforge::Tensor key_cache, opforge::Tensor value_cache,
                       opforge::Tensor block_tables, opforge::Tensor seq_lens, double scale, double k_scale,
                       double v_scale, opforge::MutableTensor out) {
  const int64_t heads = query.size(1), dim = query.size(2), block_size = key_cache.size(1),
                kv_heads = key_cache.size(2), group = heads / kv_heads;
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(dim));
  const auto row = [&](opforge::Tensor cache, int64_t seq, int64_t t, int64_t kv_head) {
    const int64_t block = block_tables.data<int32_t>()[seq * block_tables.size(1) + t / block_size];
    return cache.data<C>() + ((block * block_size + t % block_size) * kv_heads + kv_head) * dim;
  };
  std::vector<double> p;
  for (int64_t seq = 0; seq < query.size(0); ++seq) {
    const int64_t len = seq_lens.data<int32_t>()[seq];
    p.resize(static_cast<size_t>(len));
    for (int64_t h = 0; h < heads; ++h) {
      const T* q = query.data<T>() + seq * query.stride(0) + h * query.stride(1);
      double mx = -HUGE_VAL, sum = 0;
      bool nan = false;
      for (int64_t t = 0; t < len; ++t) {
        const C* k = row(key_cache, seq, t, h / group);
        double dot = 0;
        for (int64_t c = 0; c < dim; ++c) dot += double(q[c]) * (double(k[c]) * k_scale);
        p[t] = dot * s;
        nan |= std::isnan(p[t]);
        mx = std::max(mx, p[t]);
      }
      const bool none = !nan && std::isinf(mx) && mx < 0;  // no token, or every score -inf: zeros
      for (int64_t t = 0; t < len; ++t) sum += p[t] = none ? 0.0 : std::exp(p[t] - mx);
      T* o = out.data<T>() + (seq * heads + h) * dim;
      for (int64_t c = 0; c < dim; ++c) {
        double acc = 0;
        for (int64_t t = 0; t < len; ++t) acc += p[t] * (double(row(value_cache, seq, t, h / group)[c]) * v_scale);
        o[c] = T(none ? 0.0 : acc / sum);
      }
    }
  }
}

/// The scale of a cache: 1 under kv_cache_dtype "auto" or where none is given, else its value.
static double cache_scale(std::string_view kv_cache_dtype, opforge::Tensor scale) {
  return kv_cache_dtype == "auto" || !scale.defined() ? 1.0 : double(scale.data<float>()[0]);
}

static void paged_decode_attention_cpu(opforge::Tensor query, opforge::Tensor key_cache, opforge::Tensor value_cache,
                                       opforge::Tensor block_tables, opforge::Tensor seq_lens, double scale,
                                       std::string_view kv_cache_dtype, opforge::Tensor k_scale,
                                       opforge::Tensor v_scale, opforge::MutableTensor out) {
  const double ks = cache_scale(kv_cache_dtype, k_scale), vs = cache_scale(kv_cache_dtype, v_scale);
  opforge::visit_dtype<opforge::floating>(query.dtype(), [&]<class T>(opforge::type_tag<T>) {
    opforge::visit_dtype<opforge::floating | opforge::float8>(key_cache.dtype(), [&]<class C>(opforge::type_tag<C>) {
      // The dtype rule admits the query's dtype and the float8 ones only.
      if constexpr (std::is_same_v<C, T> || std::is_same_v<C, opforge::Float8_e4m3fn> ||
                    std::is_same_v<C, opforge::Float8_e5m2>)
        decode_cpu<T, C>(query, key_cache, value_cache, block_tables, seq_lens, scale, ks, vs, out);
    });
  });
}

// paged_decode_attention.cu
void paged_decode_attention_cuda(const opforge::Context& ctx, opforge::Tensor query, opforge::Tensor key_cache,
                                 opforge::Tensor value_cache, opforge::Tensor block_tables, opforge::Tensor seq_lens,
                                 double scale, std::string_view kv_cache_dtype, opforge::Tensor k_scale,
                                 opforge::Tensor v_scale, opforge::MutableTensor out);

OPFORGE_OP(examples, paged_decode_attention)
    .doc(
        "softmax(query . key * scale) value per sequence and head over its seq_lens tokens of a paged KV cache; "
        "under an fp8 kv_cache_dtype the caches hold float8 and a cached x stands for x * k_scale (keys) or "
        "x * v_scale (values)")
    .input("query", opforge::floating, opforge::shape({opforge::any, opforge::any, opforge::multiple_of(8)}),
           opforge::contiguous_last_dim)
    .input("key_cache",
           opforge::when("kv_cache_dtype", "auto", opforge::same_dtype("query"))
               .when("fp8_e5m2", opforge::kFloat8_e5m2)
               .otherwise(opforge::kFloat8_e4m3fn),
           opforge::shape({opforge::any, opforge::any, opforge::any, opforge::dim("query", 2)}))
    .input("value_cache", opforge::same_dtype("key_cache"), opforge::same_shape("key_cache"))
    .input("block_tables", opforge::kInt32, opforge::shape({opforge::dim("query", 0), opforge::any}),
           opforge::values_in(0, opforge::dim("key_cache", 0)))
    .input("seq_lens", opforge::kInt32, opforge::shape({opforge::dim("query", 0)}),
           opforge::values_in(0, opforge::dim("block_tables", 1) * opforge::dim("key_cache", 1) + 1))
    .param<double>("scale", 0.0, opforge::at_least(0.0))  // 0: 1 / sqrt(head_dim)
    .param<std::string>("kv_cache_dtype", "auto", opforge::one_of({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}))
    .input("k_scale", opforge::kFloat32, opforge::rank(0), opforge::optional)
    .input("v_scale", opforge::kFloat32, opforge::rank(0), opforge::optional)
    .output("out", opforge::like("query"))
    .require(opforge::dim("query", 1) % opforge::dim("key_cache", 2) == 0)  // grouped-query heads
    .require(opforge::dim("query", 2) <= 256)                               // the kernels' head dims
    // The torch expression, per sequence over its seq_lens tokens (gathered from their blocks), in
    // float32 at least (as the kernels and vLLM's reference compute): with float8 caches over the
    // formats' whole range, logits reach 1e5 and float32's rounding of them moves the softmax past
    // the 16-bit dtypes' tolerance, in the kernels as in torch. A device result that misses that
    // tolerance is held to 8 x this expression's error on the device, both against the float64
    // reference (FlashAttention's criterion, verify's .tolerance_vs_equivalent).
    .equivalent(
        "(lambda w: (lambda key_cache, value_cache: torch.cat([(lambda k, v: (lambda s: torch.einsum('kgt,tkd->kgd', "
        "torch.where((s == -torch.inf).all(-1, True), 0.0, s.softmax(-1)), v))(torch.einsum('kgd,tkd->kgt', "
        "q.unflatten(0, (key_cache.shape[2], -1)), k) * (scale or query.shape[2]**-0.5)))(*(c[block_tables[i, "
        "t//c.shape[1]].long(), t%c.shape[1]] for c in (key_cache, value_cache))).flatten(0, 1)[None] for i, q, t in "
        "((i, q, torch.arange(int(n), device=query.device)) for i, (q, n) in enumerate(zip(query.to(w), seq_lens)))] "
        "+ [query.new_zeros((0, *query.shape[1:]), dtype=w)]).to(query.dtype))(*(c.to(w) if kv_cache_dtype == 'auto' "
        "else c.to(w) * (1.0 if s is None else s) for c, s in ((key_cache, k_scale), (value_cache, "
        "v_scale)))))(torch.promote_types(query.dtype, torch.float32))")
    .tolerance_vs_equivalent(8.0)
    .reference(paged_decode_attention_cpu)
    .cuda(paged_decode_attention_cuda)
    .kernel_dtypes("query", opforge::half_precision);
