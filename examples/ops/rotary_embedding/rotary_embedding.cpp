// rotary_embedding: rotary position embedding (Su et al., "RoFormer: Enhanced Transformer with
// Rotary Position Embedding", 2021) applied in place to the query and key heads of each token,
// as serving engines do it (vLLM's rotary_embedding): the first rot_dim = cos_sin_cache.size(1)
// elements of every head are rotated by the angles of the token's position, the rest kept
// (partial rotary). Pairs are (i, i + rot_dim / 2) in the GPT-NeoX layout and (2 i, 2 i + 1) in
// GPT-J's: x' = x cos - y sin, y' = y cos + x sin, with cos and sin the two halves of the cache
// row. query and key are [tokens, heads, head_dim] in any layout (a head split of a fused qkv
// projection is a view), written through their strides; key is optional.
#include <opforge/op.h>

#include <algorithm>
#include <climits>

// CPU reference, in double.
static void rotary_cpu(opforge::Tensor positions, opforge::MutableTensor query, opforge::Tensor cos_sin_cache,
                       opforge::MutableTensor key, bool is_neox) {
  const int64_t rot = cos_sin_cache.size(1), half = rot / 2;
  opforge::visit_dtype<opforge::floating>(query.dtype(), [&]<class T>(opforge::type_tag<T>) {
    auto rotate = [&](opforge::MutableTensor x) {
      for (int64_t t = 0; t < x.size(0); ++t) {
        const T* row = cos_sin_cache.data<T>() + positions.data<int64_t>()[t] * cos_sin_cache.stride(0);
        for (int64_t h = 0; h < x.size(1); ++h) {
          T* head = x.data<T>() + t * x.stride(0) + h * x.stride(1);
          for (int64_t i = 0; i < half; ++i) {
            const int64_t a = (is_neox ? i : 2 * i) * x.stride(2), b = (is_neox ? i + half : 2 * i + 1) * x.stride(2);
            const double c = double(row[i]), s = double(row[half + i]), u = double(head[a]), v = double(head[b]);
            head[a] = T(u * c - v * s);
            head[b] = T(v * c + u * s);
          }
        }
      }
    };
    rotate(query);
    if (key.defined()) rotate(key);
  });
}

// One block per token; after the pointers the kernel gets: query and key heads (0 without a
// key), head_dim, rot_dim, and the strides of query and key (elements).
static opforge::LaunchConfig rotary_grid(opforge::Tensor positions, opforge::MutableTensor query,
                                         opforge::Tensor cos_sin_cache, opforge::MutableTensor key, bool) {
  opforge::LaunchConfig cfg;
  const int64_t key_heads = key.defined() ? key.size(1) : 0;
  OPFORGE_CHECK((query.size(1) + key_heads) * query.size(2) <= INT32_MAX,
                "a token's heads must hold fewer than 2^31 elements, got ",
                (query.size(1) + key_heads) * query.size(2));
  // Enough threads for one vector of 8 elements each, the 16-bit kernels' width.
  const int64_t work = (query.size(1) + key_heads) * (cos_sin_cache.size(1) / 2) / 4;
  cfg.grid[0] = static_cast<unsigned>(positions.size(0));
  cfg.block[0] = static_cast<unsigned>(std::clamp<int64_t>((work + 31) / 32 * 32, 32, 512));
  cfg.args = {query.size(1),
              key_heads,
              query.size(2),
              cos_sin_cache.size(1),
              query.stride(0),
              query.stride(1),
              query.stride(2),
              key.defined() ? key.stride(0) : 0,
              key.defined() ? key.stride(1) : 0,
              key.defined() ? key.stride(2) : 0};
  return cfg;
}

OPFORGE_OP(examples, rotary_embedding)
    .doc(
        "rotate the first cos_sin_cache.size(1) elements of each query and key head by the token's position, "
        "in place (NeoX or GPT-J pairs)")
    .input("positions", opforge::kInt64, opforge::rank(1), opforge::values_in(0, opforge::dim("cos_sin_cache", 0)))
    .input("query", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16,
           opforge::shape({opforge::dim("positions", 0), opforge::any, opforge::any}), opforge::strided,
           opforge::mutated)
    .input("cos_sin_cache", opforge::same_dtype("query"), opforge::shape({opforge::any, opforge::multiple_of(2)}))
    .input("key", opforge::same_dtype("query"),
           opforge::shape({opforge::dim("positions", 0), opforge::any, opforge::dim("query", 2)}), opforge::strided,
           opforge::optional, opforge::mutated)
    .param<bool>("is_neox", true, opforge::compile_time)
    .require(opforge::dim("cos_sin_cache", 1) <= opforge::dim("query", 2))
    .reference(rotary_cpu)
    .cuda_source("rotary_embedding.cu", "rotary_embedding<{T_query}, {is_neox}>")
    .launch_grid(rotary_grid);
