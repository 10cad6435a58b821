// kv_cache_write and reshape_and_cache_flash, compiled at run time: block b writes tokens
// [b * tokens_per_block, (b + 1) * tokens_per_block) (at most kMaxTokensPerBlock; the launch
// grid chooses); its threads copy each token's [heads, head_dim] key and value rows to the
// slot's rows of the caches in 16-byte vectors of the input (head_dim is a multiple of 8
// elements, so rows are whole vectors). A token with a negative slot writes nothing. A cache of
// the key's type C == T takes the vectors as they are; a float8 cache takes each element as
// sat(float(x) / scale) (opforge::kernel::store_float8: CUDA's saturating conversion, as vLLM's
// scaled_convert), 16 / sizeof(T) bytes per store. Stores wait for the device value check of
// slot_mapping (opforge::kernel::wait_for_value_checks; the ops declare
// .waits_for_value_checks()): the kernel may start while the check runs, and loads its rows
// meanwhile. A thread issues the loads of its tokens' slots and rows (and the scales) before it
// uses any of them: one memory latency per block, not a slot's and then the rows', nor one per
// token.
#include <opforge/kernel.cuh>

/// The most tokens one block writes (the registers of a thread's loads in flight).
constexpr int kMaxTokensPerBlock = 4;

/// The 16 bytes at `p` (global memory this kernel does not write), loaded where the call stands:
/// asm volatile, so the compiler neither drops the load of a token that writes nothing nor
/// moves the slot's test ahead of it.
__device__ __forceinline__ uint4 load_row_vector(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

/// Vector `i` (of the row's 16-byte vectors) of a token's key or value rows, stored at its slot:
/// as loaded where C == T, else each element divided by the scale and saturated to C.
template <class T, class C>
__device__ __forceinline__ void store_vector(C* __restrict__ cache, int64_t slot, int64_t row_elements, int64_t i,
                                             uint4 x, float scale) {
  constexpr int kWidth = 16 / sizeof(T);
  if constexpr (opforge::kernel::is_same<T, C>::value) {
    reinterpret_cast<uint4*>(cache + slot * row_elements)[i] = x;
  } else {
    float f[kWidth];
    opforge::kernel::unpack<T>(x, f);
#pragma unroll
    for (int j = 0; j < kWidth; ++j) f[j] = f[j] / scale;
    opforge::kernel::store_float8<C, kWidth>(cache + slot * row_elements + i * kWidth, f);
  }
}

template <class T, class C>
__device__ __forceinline__ void write_tokens(const T* __restrict__ key, const T* __restrict__ value,
                                             C* __restrict__ key_cache, C* __restrict__ value_cache,
                                             const int64_t* __restrict__ slot_mapping,
                                             const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                                             int64_t tokens, int64_t heads, int64_t head_dim, int64_t key_token_stride,
                                             int64_t key_head_stride, int64_t value_token_stride,
                                             int64_t value_head_stride, int64_t tokens_per_block) {
  constexpr int kWidth = 16 / sizeof(T);
  const int64_t first = blockIdx.x * tokens_per_block;
  const int count = static_cast<int>(tokens - first < tokens_per_block ? tokens - first : tokens_per_block);
  int64_t slot[kMaxTokensPerBlock];  // used only after the rows' loads are issued
#pragma unroll
  for (int j = 0; j < kMaxTokensPerBlock; ++j) slot[j] = j < count ? slot_mapping[first + j] : -1;
  float ks = 1.0f, vs = 1.0f;
  if constexpr (!opforge::kernel::is_same<T, C>::value) ks = *k_scale, vs = *v_scale;
  const int64_t per_head = head_dim / kWidth, vectors = heads * per_head;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const int64_t h = i / per_head, e = (i % per_head) * kWidth;
    uint4 kv[kMaxTokensPerBlock], vv[kMaxTokensPerBlock];
#pragma unroll
    for (int j = 0; j < kMaxTokensPerBlock; ++j) {
      if (j < count) {
        kv[j] = load_row_vector(key + (first + j) * key_token_stride + h * key_head_stride + e);
        vv[j] = load_row_vector(value + (first + j) * value_token_stride + h * value_head_stride + e);
      }
    }
    opforge::kernel::wait_for_value_checks();
#pragma unroll
    for (int j = 0; j < kMaxTokensPerBlock; ++j) {
      if (j < count && slot[j] >= 0) {
        store_vector<T, C>(key_cache, slot[j], heads * head_dim, i, kv[j], ks);
        store_vector<T, C>(value_cache, slot[j], heads * head_dim, i, vv[j], vs);
      }
    }
  }
}

template <class T>
__global__ void kv_cache_write(const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ key_cache,
                               T* __restrict__ value_cache, const int64_t* __restrict__ slot_mapping, int64_t tokens,
                               int64_t heads, int64_t head_dim, int64_t key_token_stride, int64_t key_head_stride,
                               int64_t value_token_stride, int64_t value_head_stride, int64_t tokens_per_block) {
  write_tokens<T, T>(key, value, key_cache, value_cache, slot_mapping, nullptr, nullptr, tokens, heads, head_dim,
                     key_token_stride, key_head_stride, value_token_stride, value_head_stride, tokens_per_block);
}

// vLLM's signature: the per-tensor scales after the slots (read only for a float8 cache).
template <class T, class C>
__global__ void reshape_and_cache_flash(const T* __restrict__ key, const T* __restrict__ value,
                                        C* __restrict__ key_cache, C* __restrict__ value_cache,
                                        const int64_t* __restrict__ slot_mapping, const float* __restrict__ k_scale,
                                        const float* __restrict__ v_scale, int64_t tokens, int64_t heads,
                                        int64_t head_dim, int64_t key_token_stride, int64_t key_head_stride,
                                        int64_t value_token_stride, int64_t value_head_stride,
                                        int64_t tokens_per_block) {
  write_tokens<T, C>(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, tokens, heads, head_dim,
                     key_token_stride, key_head_stride, value_token_stride, value_head_stride, tokens_per_block);
}
