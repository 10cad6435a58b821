// kv_cache_write and reshape_and_cache_flash, compiled at run time: one block per token; its
// threads copy the token's [heads, head_dim] key and value rows to the slot's rows of the caches
// in 16-byte vectors of the input (head_dim is a multiple of 8 elements, so rows are whole
// vectors). A token with a negative slot writes nothing. A cache of the key's type C == T takes
// the vectors as they are; a float8 cache takes each element as sat(float(x) / scale)
// (opforge::kernel::pack_float8: CUDA's saturating conversion, as vLLM's scaled_convert; the
// quotient by opforge::kernel::Divider, bit for bit IEEE division), 16 / sizeof(T) bytes per
// store. Two ways to keep a bad slot from being written through (Note [Device value checks]):
// reshape_and_cache_flash checks its token's slot itself (opforge::kernel::check_value against
// the domain of slot_mapping; declared .checks_values_in_kernel()) before it skips a padding
// token or stores, one launch per call; kv_cache_write starts beside the separate check and
// waits for its verdict before it stores (opforge::kernel::wait_for_value_checks; declared
// .waits_for_value_checks()), converting its rows meanwhile. A block issues the loads of its
// slot, its rows (and the scales) before it uses any of them: one memory latency per block, not
// a slot's and then the rows'.
#include <opforge/kernel.cuh>

/// The 16 bytes at `p` (global memory this kernel does not write), loaded where the call stands:
/// asm volatile, so the compiler neither drops the load of a token that writes nothing nor
/// moves the slot's test ahead of it.
__device__ __forceinline__ uint4 load_row_vector(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

/// One 16-byte vector of a token's key or value rows, as the cache of C takes it: the vector
/// itself where C == T, else its elements divided by the scale and saturated to C, packed.
template <class T, class C>
struct CacheVector {
  static constexpr int kWidth = 16 / sizeof(T);
  static constexpr bool kSame = opforge::kernel::is_same<T, C>::value;
  typename opforge::kernel::conditional<kSame, uint4, opforge::kernel::Float8Pack<kWidth>>::type bits;

  __device__ __forceinline__ void convert(uint4 x, float scale) {
    if constexpr (kSame) {
      bits = x;
    } else {
      float f[kWidth];
      opforge::kernel::unpack<T>(x, f);
      opforge::kernel::Divider{scale}(f);  // its reciprocal computed here, after the row's loads
      bits = opforge::kernel::pack_float8<C, kWidth>(f);
    }
  }
  /// Stores it as vector `i` of the cache's row at `slot` (`row_elements` elements a row).
  __device__ __forceinline__ void store(C* cache, int64_t slot, int64_t row_elements, int64_t i) const {
    if constexpr (kSame) {
      reinterpret_cast<uint4*>(cache + slot * row_elements)[i] = bits;
    } else {
      opforge::kernel::store_float8<C, kWidth>(cache + slot * row_elements + i * kWidth, bits);
    }
  }
};

template <class T, class C>
__device__ __forceinline__ void write_token(const T* __restrict__ key, const T* __restrict__ value,
                                            C* __restrict__ key_cache, C* __restrict__ value_cache,
                                            const int64_t* __restrict__ slot_mapping, const float* __restrict__ k_scale,
                                            const float* __restrict__ v_scale, int64_t heads, int64_t head_dim,
                                            int64_t key_token_stride, int64_t key_head_stride,
                                            int64_t value_token_stride, int64_t value_head_stride,
                                            const opforge::kernel::ValueDomain* slots) {
  constexpr int kWidth = 16 / sizeof(T);
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];  // tested only after the rows' loads are issued
  const bool same = CacheVector<T, C>::kSame;
  const float ks = same ? 1.0f : *k_scale, vs = same ? 1.0f : *v_scale;
  const int64_t per_head = head_dim / kWidth, vectors = heads * per_head;
  const T* k = key + t * key_token_stride;
  const T* v = value + t * value_token_stride;
  if (slots != nullptr && vectors == 0 && threadIdx.x == 0) opforge::kernel::check_value(*slots, slot, t);
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const int64_t h = i / per_head, e = (i % per_head) * kWidth;
    const uint4 kv = load_row_vector(k + h * key_head_stride + e);
    const uint4 vv = load_row_vector(v + h * value_head_stride + e);
    if (slots != nullptr) opforge::kernel::check_value(*slots, slot, t);  // -1 (padding) is in the domain
    if (slot < 0) return;
    CacheVector<T, C> kc, vc;  // converted while a separate check may still run
    kc.convert(kv, ks);
    vc.convert(vv, vs);
    if (slots == nullptr) opforge::kernel::wait_for_value_checks();
    kc.store(key_cache, slot, heads * head_dim, i);
    vc.store(value_cache, slot, heads * head_dim, i);
  }
}

template <class T>
__global__ void __launch_bounds__(1024)
    kv_cache_write(const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ key_cache,
                   T* __restrict__ value_cache, const int64_t* __restrict__ slot_mapping, int64_t tokens, int64_t heads,
                   int64_t head_dim, int64_t key_token_stride, int64_t key_head_stride, int64_t value_token_stride,
                   int64_t value_head_stride) {
  write_token<T, T>(key, value, key_cache, value_cache, slot_mapping, nullptr, nullptr, heads, head_dim,
                    key_token_stride, key_head_stride, value_token_stride, value_head_stride, nullptr);
}

// vLLM's signature: the per-tensor scales after the slots (read only for a float8 cache).
template <class T, class C>
__global__ void __launch_bounds__(1024)
    reshape_and_cache_flash(const T* __restrict__ key, const T* __restrict__ value, C* __restrict__ key_cache,
                            C* __restrict__ value_cache, const int64_t* __restrict__ slot_mapping,
                            const float* __restrict__ k_scale, const float* __restrict__ v_scale, int64_t tokens,
                            int64_t heads, int64_t head_dim, int64_t key_token_stride, int64_t key_head_stride,
                            int64_t value_token_stride, int64_t value_head_stride,
                            const __grid_constant__ opforge::kernel::ValueDomain slots) {
  write_token<T, C>(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, heads, head_dim,
                    key_token_stride, key_head_stride, value_token_stride, value_head_stride, &slots);
}
