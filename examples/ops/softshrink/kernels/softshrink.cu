// softshrink, compiled at run time by opforge (NVRTC) for the GPU in use. Edit and run again
// (or call opforge.reload()) to redeploy. Launched by opforge::elementwise("y") with 16 bytes
// per thread: thread t handles elements [t * N, t * N + N), N = 16 / sizeof(T).
#include <opforge/kernel.cuh>

namespace {

template <class T>
__device__ __forceinline__ T shrink(T x, opforge::kernel::acc_t<T> lambd) {
  const auto v = opforge::kernel::to_acc(x);
  const auto r = v != v ? v : v > lambd ? v - lambd : v < -lambd ? v + lambd : decltype(v)(0);
  return opforge::kernel::from_acc<T>(r);
}

}  // namespace

template <class T>
__global__ void softshrink(const T* __restrict__ x, T* __restrict__ y, int64_t n, double lambd) {
  constexpr int N = 16 / sizeof(T);
  using V = opforge::kernel::Vec<T, N>;
  const auto l = static_cast<opforge::kernel::acc_t<T>>(lambd);
  const int64_t first = opforge::kernel::global_index() * N;
  if (first + N <= n && opforge::kernel::aligned(x + first, 16) && opforge::kernel::aligned(y + first, 16)) {
    V v = *reinterpret_cast<const V*>(x + first);
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = shrink(v.v[k], l);
    *reinterpret_cast<V*>(y + first) = v;
  } else {
    for (int64_t i = first; i < first + N && i < n; ++i) y[i] = shrink(x[i], l);
  }
}
