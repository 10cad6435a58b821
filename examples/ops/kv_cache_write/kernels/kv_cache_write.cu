// kv_cache_write, compiled at run time: one block per token; its threads copy the token's
// [heads, head_dim] key and value rows to the slot's rows of the caches in 16-byte vectors
// (head_dim is a multiple of 8 elements, so rows are whole vectors). A token with a negative
// slot writes nothing.
#include <opforge/kernel.cuh>

template <class T>
__global__ void kv_cache_write(const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ key_cache,
                               T* __restrict__ value_cache, const int64_t* __restrict__ slot_mapping, int64_t tokens,
                               int64_t heads, int64_t head_dim, int64_t key_token_stride, int64_t key_head_stride,
                               int64_t value_token_stride, int64_t value_head_stride) {
  constexpr int kWidth = 16 / sizeof(T);
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const int64_t per_head = head_dim / kWidth, vectors = heads * per_head;
  const T* k = key + t * key_token_stride;
  const T* v = value + t * value_token_stride;
  uint4* kc = reinterpret_cast<uint4*>(key_cache + slot * heads * head_dim);
  uint4* vc = reinterpret_cast<uint4*>(value_cache + slot * heads * head_dim);
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const int64_t h = i / per_head, e = (i % per_head) * kWidth;
    const uint4 kv = *reinterpret_cast<const uint4*>(k + h * key_head_stride + e);
    const uint4 vv = *reinterpret_cast<const uint4*>(v + h * value_head_stride + e);
    kc[i] = kv;
    vc[i] = vv;
  }
}
