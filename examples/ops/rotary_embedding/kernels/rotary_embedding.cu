// rotary_embedding, compiled at run time: one block per token, whose threads take the rotation
// pairs of all query and key heads. Where every head's rotated part is whole 16-byte vectors
// (the last dim contiguous, rows, heads and the cos/sin halves at 16-byte boundaries), a thread
// rotates one vector's worth of elements: NeoX reads x from the first half and y from the second
// half of the rotated part, GPT-J reads interleaved (x, y) pairs from one vector; cos and sin
// come from the token's cache row (the same for every head, so it stays in L1). Otherwise one
// pair a thread, through the strides. Indices within a token are 32-bit; the math is float.
#include <opforge/kernel.cuh>

namespace rotary_detail {

struct Heads {
  int64_t token_stride, head_stride, dim_stride;
};

/// Whether `p` and every head of `h` starts at a 16-byte boundary with elements adjacent.
template <class T>
__device__ bool vectors_fit(const T* p, const Heads& h) {
  constexpr int kWidth = 16 / sizeof(T);
  return opforge::kernel::aligned(p, 16) && h.dim_stride == 1 && h.token_stride % kWidth == 0 &&
         h.head_stride % kWidth == 0;
}

}  // namespace rotary_detail

template <class T, bool kNeox>
__global__ void rotary_embedding(const int64_t* __restrict__ positions, T* __restrict__ query,
                                 const T* __restrict__ cos_sin_cache, T* __restrict__ key, int64_t query_heads,
                                 int64_t key_heads, int64_t head_dim, int64_t rot_dim, int64_t query_token_stride,
                                 int64_t query_head_stride, int64_t query_dim_stride, int64_t key_token_stride,
                                 int64_t key_head_stride, int64_t key_dim_stride) {
  using opforge::kernel::from_acc;
  using opforge::kernel::to_acc;
  using A = opforge::kernel::acc_t<T>;
  constexpr int kWidth = 16 / sizeof(T);
  const rotary_detail::Heads q{query_token_stride, query_head_stride, query_dim_stride};
  const rotary_detail::Heads k{key_token_stride, key_head_stride, key_dim_stride};
  const int64_t t = blockIdx.x;
  const int half = static_cast<int>(rot_dim / 2), heads = static_cast<int>(query_heads + key_heads);
  const int qh = static_cast<int>(query_heads);
  const T* cache = cos_sin_cache + positions[t] * rot_dim;
  T* q_token = query + t * q.token_stride;
  T* k_token = key_heads ? key + t * k.token_stride : nullptr;
  const bool vectors = half % kWidth == 0 && opforge::kernel::aligned(cos_sin_cache, 16) &&
                       rotary_detail::vectors_fit(query, q) && (!key_heads || rotary_detail::vectors_fit(key, k));
  if (vectors) {
    const int chunks = kNeox ? half / kWidth : 2 * half / kWidth;  // vectors of one head's rotated part
    for (int j = threadIdx.x; j < heads * chunks; j += blockDim.x) {
      const int h = j / chunks, c = j % chunks;
      T* head = h < qh ? q_token + h * q.head_stride : k_token + (h - qh) * k.head_stride;
      A x[kWidth], y[kWidth];
      if (kNeox) {  // x: elements c * w .. of the first half, y: the same of the second
        A cs[kWidth], sn[kWidth];
        uint4* px = reinterpret_cast<uint4*>(head + c * kWidth);
        uint4* py = reinterpret_cast<uint4*>(head + half + c * kWidth);
        opforge::kernel::unpack<T>(*px, x);
        opforge::kernel::unpack<T>(*py, y);
        opforge::kernel::unpack<T>(*reinterpret_cast<const uint4*>(cache + c * kWidth), cs);
        opforge::kernel::unpack<T>(*reinterpret_cast<const uint4*>(cache + half + c * kWidth), sn);
        A xo[kWidth], yo[kWidth];
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          xo[e] = x[e] * cs[e] - y[e] * sn[e];
          yo[e] = y[e] * cs[e] + x[e] * sn[e];
        }
        *px = opforge::kernel::pack<T>(xo);
        *py = opforge::kernel::pack<T>(yo);
      } else {  // GPT-J: pairs (2 i, 2 i + 1) of elements c * w ..
        uint4* p = reinterpret_cast<uint4*>(head + c * kWidth);
        opforge::kernel::unpack<T>(*p, x);
        const int i0 = c * kWidth / 2;
#pragma unroll
        for (int e = 0; e < kWidth / 2; ++e) {
          const A cs = to_acc(cache[i0 + e]), sn = to_acc(cache[half + i0 + e]);
          y[2 * e] = x[2 * e] * cs - x[2 * e + 1] * sn;
          y[2 * e + 1] = x[2 * e + 1] * cs + x[2 * e] * sn;
        }
        *p = opforge::kernel::pack<T>(y);
      }
    }
    return;
  }
  for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
    const int h = p / half, i = p % half;
    const bool is_q = h < qh;
    T* head = is_q ? q_token + h * q.head_stride : k_token + (h - qh) * k.head_stride;
    const int64_t step = is_q ? q.dim_stride : k.dim_stride;
    const int64_t a = (kNeox ? i : 2 * i) * step, b = (kNeox ? i + half : 2 * i + 1) * step;
    const A c = to_acc(cache[i]), s = to_acc(cache[half + i]), u = to_acc(head[a]), v = to_acc(head[b]);
    head[a] = from_acc<T>(u * c - v * s);
    head[b] = from_acc<T>(v * c + u * s);
  }
}
