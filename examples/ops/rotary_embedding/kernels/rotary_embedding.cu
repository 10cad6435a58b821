// rotary_embedding, compiled at run time: one block per token, whose threads take the rotation
// pairs of all query and key heads in turn (through the tensors' strides); each pair reads its
// cos and sin from the token's cache row (the same row for every head, so it stays in L1) and
// is rotated in float.
#include <opforge/kernel.cuh>

template <class T, bool kNeox>
__global__ void rotary_embedding(const int64_t* __restrict__ positions, T* __restrict__ query,
                                 const T* __restrict__ cos_sin_cache, T* __restrict__ key, int64_t query_heads,
                                 int64_t key_heads, int64_t head_dim, int64_t rot_dim, int64_t query_token_stride,
                                 int64_t query_head_stride, int64_t query_dim_stride, int64_t key_token_stride,
                                 int64_t key_head_stride, int64_t key_dim_stride) {
  using opforge::kernel::from_acc;
  using opforge::kernel::to_acc;
  const int64_t t = blockIdx.x, half = rot_dim / 2;
  const T* cache = cos_sin_cache + positions[t] * rot_dim;
  const int64_t pairs = (query_heads + key_heads) * half;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t h = p / half, i = p % half;
    const bool q = h < query_heads;
    T* head = q ? query + t * query_token_stride + h * query_head_stride
                : key + t * key_token_stride + (h - query_heads) * key_head_stride;
    const int64_t step = q ? query_dim_stride : key_dim_stride;
    const int64_t a = (kNeox ? i : 2 * i) * step, b = (kNeox ? i + half : 2 * i + 1) * step;
    const float c = to_acc(cache[i]), s = to_acc(cache[half + i]), u = to_acc(head[a]), v = to_acc(head[b]);
    head[a] = from_acc<T>(u * c - v * s);
    head[b] = from_acc<T>(v * c + u * s);
  }
}
