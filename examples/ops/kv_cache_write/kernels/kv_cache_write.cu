// kv_cache_write and reshape_and_cache_flash, compiled at run time: one block per token; its
// threads copy the token's [heads, head_dim] key and value rows to the slot's rows of the caches
// in 16-byte vectors of the input (head_dim is a multiple of 8 elements, so rows are whole
// vectors). A token with a negative slot writes nothing. A cache of the key's type C == T takes
// the vectors as they are; a float8 cache takes each element as sat(float(x) / scale)
// (opforge::kernel::store_float8: CUDA's saturating conversion, as vLLM's scaled_convert),
// 16 / sizeof(T) bytes per store. Stores wait for the device value check of slot_mapping
// (opforge::kernel::wait_for_value_checks; the ops declare .waits_for_value_checks()): the
// kernel may start while the check runs, and loads its rows meanwhile. A block issues the loads
// of its slot, its rows (and the scales) before it uses any of them: one memory latency per
// block, not a slot's and then the rows'.
#include <opforge/kernel.cuh>

/// The 16 bytes at `p` (global memory this kernel does not write), loaded where the call stands:
/// asm volatile, so the compiler neither drops the load of a token that writes nothing nor
/// moves the slot's test ahead of it.
__device__ __forceinline__ uint4 load_row_vector(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <class T, class C>
__device__ __forceinline__ void write_token(const T* __restrict__ key, const T* __restrict__ value,
                                            C* __restrict__ key_cache, C* __restrict__ value_cache,
                                            const int64_t* __restrict__ slot_mapping, const float* __restrict__ k_scale,
                                            const float* __restrict__ v_scale, int64_t heads, int64_t head_dim,
                                            int64_t key_token_stride, int64_t key_head_stride,
                                            int64_t value_token_stride, int64_t value_head_stride) {
  constexpr int kWidth = 16 / sizeof(T);
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];  // used only after the rows' loads are issued
  const int64_t per_head = head_dim / kWidth, vectors = heads * per_head;
  const T* k = key + t * key_token_stride;
  const T* v = value + t * value_token_stride;
  if constexpr (opforge::kernel::is_same<T, C>::value) {
    for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
      const int64_t h = i / per_head, e = (i % per_head) * kWidth;
      const uint4 kv = load_row_vector(k + h * key_head_stride + e);
      const uint4 vv = load_row_vector(v + h * value_head_stride + e);
      if (slot < 0) return;
      opforge::kernel::wait_for_value_checks();
      reinterpret_cast<uint4*>(key_cache + slot * heads * head_dim)[i] = kv;
      reinterpret_cast<uint4*>(value_cache + slot * heads * head_dim)[i] = vv;
    }
  } else {
    const float ks = *k_scale, vs = *v_scale;
    for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
      const int64_t h = i / per_head, e = (i % per_head) * kWidth;
      const uint4 kv = load_row_vector(k + h * key_head_stride + e);
      const uint4 vv = load_row_vector(v + h * value_head_stride + e);
      if (slot < 0) return;
      float kf[kWidth], vf[kWidth];
      opforge::kernel::unpack<T>(kv, kf);
      opforge::kernel::unpack<T>(vv, vf);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        kf[j] = kf[j] / ks;
        vf[j] = vf[j] / vs;
      }
      opforge::kernel::wait_for_value_checks();
      opforge::kernel::store_float8<C, kWidth>(key_cache + slot * heads * head_dim + i * kWidth, kf);
      opforge::kernel::store_float8<C, kWidth>(value_cache + slot * heads * head_dim + i * kWidth, vf);
    }
  }
}

template <class T>
__global__ void kv_cache_write(const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ key_cache,
                               T* __restrict__ value_cache, const int64_t* __restrict__ slot_mapping, int64_t tokens,
                               int64_t heads, int64_t head_dim, int64_t key_token_stride, int64_t key_head_stride,
                               int64_t value_token_stride, int64_t value_head_stride) {
  write_token<T, T>(key, value, key_cache, value_cache, slot_mapping, nullptr, nullptr, heads, head_dim,
                    key_token_stride, key_head_stride, value_token_stride, value_head_stride);
}

// vLLM's signature: the per-tensor scales after the slots (read only for a float8 cache).
template <class T, class C>
__global__ void reshape_and_cache_flash(const T* __restrict__ key, const T* __restrict__ value,
                                        C* __restrict__ key_cache, C* __restrict__ value_cache,
                                        const int64_t* __restrict__ slot_mapping, const float* __restrict__ k_scale,
                                        const float* __restrict__ v_scale, int64_t tokens, int64_t heads,
                                        int64_t head_dim, int64_t key_token_stride, int64_t key_head_stride,
                                        int64_t value_token_stride, int64_t value_head_stride) {
  write_token<T, C>(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, heads, head_dim,
                    key_token_stride, key_head_stride, value_token_stride, value_head_stride);
}
