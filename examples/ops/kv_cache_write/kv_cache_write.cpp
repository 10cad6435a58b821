// kv_cache_write: the paged KV-cache write of LLM serving (vLLM's reshape_and_cache_flash):
// each token's key and value rows go to their slot of the [blocks, block_size, heads, head_dim]
// caches, in place; slot s is row s % block_size of block s / block_size, and a negative slot
// (padding) is skipped. Keys and values may be head-split views of a fused qkv projection.
//
// reshape_and_cache_flash is the same write with vLLM's exact signature (csrc/cache_kernels.cu):
// kv_cache_dtype "auto" keeps the key's dtype; "fp8" and "fp8_e4m3" store float8_e4m3fn and
// "fp8_e5m2" float8_e5m2, each element as sat(float(x) / scale) with the per-tensor scale
// k_scale (keys) or v_scale (values), 0-dim float32 tensors as vLLM's layers hold them. sat() is
// the float8 conversion that saturates to the largest finite value and keeps NaN (CUDA's
// __NV_SATFINITE, which vLLM's scaled_convert uses; opforge::Float8_*::saturated on the host).
// kv_cache_write stays for the models and benchmarks written against its shorter signature.
#include <opforge/op.h>

#include <algorithm>
#include <cstring>
#include <string_view>

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

// CPU reference of reshape_and_cache_flash: a copy under "auto", else each element divided by
// its scale in float and saturated to the cache's float8 type.
static void reshape_and_cache_flash_cpu(opforge::Tensor key, opforge::Tensor value, opforge::MutableTensor key_cache,
                                        opforge::MutableTensor value_cache, opforge::Tensor slot_mapping,
                                        std::string_view kv_cache_dtype, opforge::Tensor k_scale,
                                        opforge::Tensor v_scale) {
  if (kv_cache_dtype == "auto") return kv_cache_write_cpu(key, value, key_cache, value_cache, slot_mapping);
  const int64_t heads = key.size(1), dim = key.size(2);
  opforge::visit_dtype<opforge::float8>(key_cache.dtype(), [&]<class F>(opforge::type_tag<F>) {
    opforge::visit_dtype<opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16>(
        key.dtype(), [&]<class T>(opforge::type_tag<T>) {
          auto write = [&](opforge::Tensor from, opforge::MutableTensor to, float scale, int64_t t, int64_t slot) {
            for (int64_t h = 0; h < heads; ++h)
              for (int64_t e = 0; e < dim; ++e)
                to.data<F>()[(slot * heads + h) * dim + e] =
                    F::saturated(float(from.data<T>()[t * from.stride(0) + h * from.stride(1) + e]) / scale);
          };
          for (int64_t t = 0; t < key.size(0); ++t) {
            const int64_t slot = slot_mapping.data<int64_t>()[t];
            if (slot < 0) continue;
            write(key, key_cache, k_scale.data<float>()[0], t, slot);
            write(value, value_cache, v_scale.data<float>()[0], t, slot);
          }
        });
  });
}

// One block per token; the kernel's arguments after the pointers: tokens, heads, head_dim, and
// the token and head strides of key and value (elements), which may be views.
static opforge::LaunchConfig token_grid(opforge::Tensor key, opforge::Tensor value) {
  opforge::LaunchConfig cfg;
  const int64_t vectors = key.size(1) * key.size(2) * static_cast<int64_t>(opforge::dtype_size(key.dtype())) / 16;
  cfg.grid[0] = static_cast<unsigned>(key.size(0));
  cfg.block[0] = static_cast<unsigned>(std::min<int64_t>(1024, std::max<int64_t>(32, (vectors + 31) / 32 * 32)));
  cfg.args = {key.size(0), key.size(1), key.size(2), key.stride(0), key.stride(1), value.stride(0), value.stride(1)};
  return cfg;
}
static opforge::LaunchConfig kv_cache_grid(opforge::Tensor key, opforge::Tensor value, opforge::MutableTensor,
                                           opforge::MutableTensor, opforge::Tensor) {
  return token_grid(key, value);
}
static opforge::LaunchConfig flash_grid(opforge::Tensor key, opforge::Tensor value, opforge::MutableTensor,
                                        opforge::MutableTensor, opforge::Tensor, std::string_view, opforge::Tensor,
                                        opforge::Tensor) {
  return token_grid(key, value);
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
    .launch_grid(kv_cache_grid)
    .waits_for_value_checks();

OPFORGE_OP(examples, reshape_and_cache_flash)
    .doc(
        "key_cache[slot] = key, value_cache[slot] = value for each token whose slot is not negative, in place; "
        "under an fp8 kv_cache_dtype each element is stored as sat(x / scale) in the cache's float8 dtype")
    .input("key", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16,
           opforge::shape({opforge::any, opforge::any, opforge::multiple_of(8)}), opforge::contiguous_last_dim)
    .input("value", opforge::same_dtype("key"), opforge::same_shape("key"), opforge::contiguous_last_dim)
    .input("key_cache",
           opforge::when("kv_cache_dtype", "auto", opforge::same_dtype("key"))
               .when("fp8_e5m2", opforge::kFloat8_e5m2)
               .otherwise(opforge::kFloat8_e4m3fn),
           opforge::shape({opforge::any, opforge::any, opforge::dim("key", 1), opforge::dim("key", 2)}),
           opforge::mutated)
    .input("value_cache", opforge::same_dtype("key_cache"), opforge::same_shape("key_cache"), opforge::mutated)
    .input(
        "slot_mapping", opforge::kInt64, opforge::shape({opforge::dim("key", 0)}),
        opforge::values_in(0, opforge::dim("key_cache", 0) * opforge::dim("key_cache", 1)).unique_values().or_value(-1))
    .param<std::string>("kv_cache_dtype", opforge::one_of({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}),
                        opforge::compile_time)
    .input("k_scale", opforge::kFloat32, opforge::rank(0))
    .input("v_scale", opforge::kFloat32, opforge::rank(0))
    .equivalent(
        "tuple(c.view(-1, *key.shape[1:]).index_put((slot_mapping[slot_mapping >= 0],), x[slot_mapping >= 0] if "
        "kv_cache_dtype == 'auto' else (x[slot_mapping >= 0].float() / s).clamp(-torch.finfo(c.dtype).max, "
        "torch.finfo(c.dtype).max).to(c.dtype)).view(c.shape) for x, c, s in ((key, key_cache, k_scale), "
        "(value, value_cache, v_scale)))")
    .reference(reshape_and_cache_flash_cpu)
    .cuda_source("kv_cache_write.cu", "reshape_and_cache_flash<{T}, {T_key_cache}>")
    .launch_grid(flash_grid)
    .checks_values_in_kernel();
