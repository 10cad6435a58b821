// softshrink's gradient, compiled at run time: grad_x = grad_y where |x| > lambd, else 0
// (also where x is NaN). Launched by opforge::elementwise("grad_x") with 16 bytes per thread: thread t
// handles elements [t * N, t * N + N), N = 16 / sizeof(T).
#include <opforge/kernel.cuh>

namespace {

/// lambd (>= 0, as declared) as the largest value of A at most lambd: for any x exact in A,
/// |x| > below(lambd) if and only if |x| > lambd exactly, as the CPU reference compares in
/// double. (lambd rounded to nearest gave 0 for float32 x = 0.3f = 0.30000001 and lambd = 0.3,
/// where the reference passes grad_y on.)
template <class A>
__device__ __forceinline__ A below(double lambd) {
  const A l = static_cast<A>(lambd);
  if (static_cast<double>(l) <= lambd) return l;
  if constexpr (sizeof(A) == sizeof(float)) return nextafterf(l, 0.0f);
  else return nextafter(l, 0.0);
}

template <class T>
__device__ __forceinline__ T pass(T g, T x, opforge::kernel::acc_t<T> lambd) {
  const auto v = opforge::kernel::to_acc(x);
  return fabs(v) > lambd ? g : opforge::kernel::from_acc<T>(0);
}

}  // namespace

template <class T>
__global__ void softshrink_backward(const T* __restrict__ grad_y, const T* __restrict__ x, T* __restrict__ grad_x,
                                    int64_t n, double lambd) {
  constexpr int N = 16 / sizeof(T);
  using V = opforge::kernel::Vec<T, N>;
  const auto l = below<opforge::kernel::acc_t<T>>(lambd);
  const int64_t first = opforge::kernel::global_index() * N;
  if (first + N <= n && opforge::kernel::aligned(grad_y + first, 16) && opforge::kernel::aligned(x + first, 16) &&
      opforge::kernel::aligned(grad_x + first, 16)) {
    const V g = *reinterpret_cast<const V*>(grad_y + first);
    const V v = *reinterpret_cast<const V*>(x + first);
    V r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = pass(g.v[k], v.v[k], l);
    *reinterpret_cast<V*>(grad_x + first) = r;
  } else {
    for (int64_t i = first; i < first + N && i < n; ++i) grad_x[i] = pass(grad_y[i], x[i], l);
  }
}
