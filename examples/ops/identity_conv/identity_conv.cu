// identity_conv CUDA kernel: y = x for any layout. Elements are copied as unsigned integers of
// their size (1, 2, 4 or 8 bytes), so every dtype copies bit for bit. The input's dims are
// first merged where they walk memory in order; a dense input is then a flat copy (16-byte
// vectors when both pointers are aligned), anything else a grid-stride gather that turns each
// output index into the input's offset from the sizes and strides.
#include <opforge/cuda.h>

namespace {

constexpr int kMaxDims = 16;  // the rank the op declares (rank_between(0, 16))
constexpr int kThreads = 256;

/// The input's sizes and strides (in elements) after merging, passed to the gather by value.
struct Layout {
  int32_t ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
};

/// x's layout with size-1 dims dropped and each dim merged into the one before it where that
/// one's stride is size * stride (the same row-major walk over fewer dims).
Layout merged_layout(const opforge::Tensor& x) {
  Layout l;
  for (int32_t d = 0; d < x.ndim(); ++d) {
    if (x.size(d) == 1) continue;
    if (l.ndim > 0 && l.strides[l.ndim - 1] == x.size(d) * x.stride(d)) {
      l.sizes[l.ndim - 1] *= x.size(d);
      l.strides[l.ndim - 1] = x.stride(d);
    } else {
      OPFORGE_ICHECK(l.ndim < kMaxDims, "identity_conv: more than ", kMaxDims, " dims");
      l.sizes[l.ndim] = x.size(d);
      l.strides[l.ndim] = x.stride(d);
      ++l.ndim;
    }
  }
  return l;
}

/// Dense copy of n elements, N at a time (N = 16 / sizeof(T) when both pointers are 16-byte
/// aligned, else 1); the n % N elements past the last vector one at a time.
template <class T, int N>
__global__ void dense_copy_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using V = opforge::cuda::Vec<T, N>;
  const int64_t step = int64_t{gridDim.x} * blockDim.x, first = opforge::kernel::global_index();
  const int64_t vectors = n / N;
  for (int64_t i = first; i < vectors; i += step) reinterpret_cast<V*>(y)[i] = reinterpret_cast<const V*>(x)[i];
  for (int64_t i = vectors * N + first; i < n; i += step) y[i] = x[i];
}

/// y[i] = x[offset(i)] for the n elements of y. Index is uint32_t when n and every offset are
/// below 2^31 (so i + step cannot wrap; 32-bit division is several times cheaper), else uint64_t.
template <class T, class Index>
__global__ void gather_kernel(const T* __restrict__ x, T* __restrict__ y, Layout layout, Index n) {
  const Index step = Index{gridDim.x} * blockDim.x;
  for (Index i = Index{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += step) {
    Index rest = i, offset = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d > 0; --d) {  // unrolled with constant indices: layout stays in parameter space
      if (d >= layout.ndim) continue;
      const Index size = static_cast<Index>(layout.sizes[d]);
      offset += (rest % size) * static_cast<Index>(layout.strides[d]);
      rest /= size;
    }
    y[i] = x[offset + rest * static_cast<Index>(layout.strides[0])];
  }
}

/// Calls f(type_tag<U>) with the unsigned integer type of `bytes` bytes.
template <class F>
void visit_element_size(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f(opforge::type_tag<uint8_t>{});
    case 2:
      return f(opforge::type_tag<uint16_t>{});
    case 4:
      return f(opforge::type_tag<uint32_t>{});
    case 8:
      return f(opforge::type_tag<uint64_t>{});
  }
  OPFORGE_ICHECK(false, "identity_conv: no copy for elements of ", bytes, " bytes");
}

}  // namespace

void identity_conv_cuda(const opforge::Context& ctx, opforge::Tensor x, opforge::MutableTensor y) {
  const Layout layout = merged_layout(x);
  const int64_t n = y.numel();
  int64_t last = 0;  // the largest offset read
  for (int32_t d = 0; d < layout.ndim; ++d) last += (layout.sizes[d] - 1) * layout.strides[d];
  const cudaStream_t stream = opforge::cuda::stream(ctx);
  visit_element_size(opforge::dtype_size(x.dtype()), [&]<class T>(opforge::type_tag<T>) {
    const T* in = static_cast<const T*>(x.raw_data());
    T* out = static_cast<T*>(y.raw_data());
    if (layout.ndim == 0 || (layout.ndim == 1 && layout.strides[0] == 1)) {
      constexpr int N = 16 / sizeof(T);
      if (opforge::cuda::aligned(16, in, out)) {
        dense_copy_kernel<T, N><<<opforge::cuda::grid_for(n / N, kThreads), kThreads, 0, stream>>>(in, out, n);
      } else {
        dense_copy_kernel<T, 1><<<opforge::cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(in, out, n);
      }
    } else if (n <= INT32_MAX && last <= INT32_MAX) {
      gather_kernel<T, uint32_t>
          <<<opforge::cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(in, out, layout, static_cast<uint32_t>(n));
    } else {
      gather_kernel<T, uint64_t>
          <<<opforge::cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(in, out, layout, static_cast<uint64_t>(n));
    }
  });
  opforge::cuda::check_launch("identity_conv");
}
