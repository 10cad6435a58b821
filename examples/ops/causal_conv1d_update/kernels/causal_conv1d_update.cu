// causal_conv1d_update, compiled at run time: thread i updates channel i % dim of batch entry
// i / dim: the dot product of its weight row with [state, x] in float (+ bias, SiLU), then the
// state's shift by one. The state row is conv_state_indices[b] when given (non-null), else b.
#include <opforge/kernel.cuh>

template <class T, bool kSilu>
__global__ void causal_conv1d_update(const T* __restrict__ x, T* __restrict__ conv_state, const T* __restrict__ weight,
                                     const T* __restrict__ bias, const int32_t* __restrict__ conv_state_indices,
                                     T* __restrict__ y, int64_t batch, int64_t dim, int64_t width) {
  const int64_t i = opforge::kernel::global_index();
  if (i >= batch * dim) return;
  const int64_t b = i / dim, c = i % dim;
  const int64_t row = conv_state_indices != nullptr ? conv_state_indices[b] : b;
  T* state = conv_state + (row * dim + c) * (width - 1);
  const T* w = weight + c * width;
  const float in = opforge::kernel::to_acc(x[i]);
  float acc = (bias != nullptr ? opforge::kernel::to_acc(bias[c]) : 0.0f) + opforge::kernel::to_acc(w[width - 1]) * in;
  for (int64_t k = 0; k + 1 < width; ++k) acc += opforge::kernel::to_acc(w[k]) * opforge::kernel::to_acc(state[k]);
  for (int64_t k = 0; k + 2 < width; ++k) state[k] = state[k + 1];
  if (width > 1) state[width - 2] = x[i];
  if (kSilu) acc = acc / (1.0f + __expf(-acc));
  y[i] = opforge::kernel::from_acc<T>(acc);
}
