// kv_cache_write: the paged KV-cache write of LLM serving (vLLM's reshape_and_cache_flash):
// each token's key and value rows go to their slot of the [blocks, block_size, heads, head_dim]
// caches, in place; slot s is row s % block_size of block s / block_size, and a negative slot
// (padding) is skipped. Keys and values may be head-split views of a fused qkv projection.
#include <opforge/op.h>

#include <algorithm>
#include <cstring>

// CPU reference: a copy of each token's [heads, head_dim] rows into its slot (key and value
// rows through their strides: they arrive as the views they are).
static void kv_cache_write_cpu(opforge::Tensor key, opforge::Tensor value, opforge::MutableTensor key_cache,
                               opforge::MutableTensor value_cache, opforge::Tensor slot_mapping) {
  const int64_t heads = key.size(1), dim = key.size(2);
  const size_t item = opforge::dtype_size(key.dtype()), row = static_cast<size_t>(dim) * item;
  auto copy = [&](opforge::Tensor from, opforge::MutableTensor to, int64_t t, int64_t slot) {
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(static_cast<char*>(to.raw_data()) + ((slot * heads + h) * dim) * item,
                  static_cast<const char*>(from.raw_data()) + (t * from.stride(0) + h * from.stride(1)) * item, row);
  };
  for (int64_t t = 0; t < key.size(0); ++t) {
    const int64_t slot = slot_mapping.data<int64_t>()[t];
    if (slot < 0) continue;
    copy(key, key_cache, t, slot);
    copy(value, value_cache, t, slot);
  }
}

// One block per token; the kernel's arguments after the pointers: tokens, heads, head_dim, and
// the token and head strides of key and value (elements), which may be views.
static opforge::LaunchConfig kv_cache_grid(opforge::Tensor key, opforge::Tensor value, opforge::MutableTensor,
                                           opforge::MutableTensor, opforge::Tensor) {
  opforge::LaunchConfig cfg;
  const int64_t vectors = key.size(1) * key.size(2) * static_cast<int64_t>(opforge::dtype_size(key.dtype())) / 16;
  cfg.grid[0] = static_cast<unsigned>(key.size(0));
  cfg.block[0] = static_cast<unsigned>(std::min<int64_t>(1024, std::max<int64_t>(32, (vectors + 31) / 32 * 32)));
  cfg.args = {key.size(0), key.size(1), key.size(2), key.stride(0), key.stride(1), value.stride(0), value.stride(1)};
  return cfg;
}

OPFORGE_OP(examples, kv_cache_write)
    .doc("key_cache[slot] = key, value_cache[slot] = value for each token whose slot is not negative, in place")
    .input("key", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16,
           opforge::shape({opforge::any, opforge::any, opforge::multiple_of(8)}), opforge::contiguous_last_dim)
    .input("value", opforge::same_dtype("key"), opforge::same_shape("key"), opforge::contiguous_last_dim)
    .input("key_cache", opforge::same_dtype("key"),
           opforge::shape({opforge::any, opforge::any, opforge::dim("key", 1), opforge::dim("key", 2)}),
           opforge::mutated)
    .input("value_cache", opforge::same_dtype("key"), opforge::same_shape("key_cache"), opforge::mutated)
    .input(
        "slot_mapping", opforge::kInt64, opforge::shape({opforge::dim("key", 0)}),
        opforge::values_in(0, opforge::dim("key_cache", 0) * opforge::dim("key_cache", 1)).unique_values().or_value(-1))
    .equivalent(
        "(key_cache.reshape(-1, *key.shape[1:]).index_put((slot_mapping[slot_mapping >= 0],), "
        "key[slot_mapping >= 0]).view(key_cache.shape), value_cache.reshape(-1, *key.shape[1:]).index_put("
        "(slot_mapping[slot_mapping >= 0],), value[slot_mapping >= 0]).view(value_cache.shape))")
    .reference(kv_cache_write_cpu)
    .cuda_source("kv_cache_write.cu", "kv_cache_write<{T}>")
    .launch_grid(kv_cache_grid);
