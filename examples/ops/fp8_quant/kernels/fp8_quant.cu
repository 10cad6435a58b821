// fp8_quant, compiled at run time (the rules in fp8_quant.cpp). F is the result's float8 type
// (__nv_fp8_e4m3 or __nv_fp8_e5m2), T the input's. Conversions saturate to F's largest finite
// value and keep NaN (opforge::kernel::store_float8, from_acc).
#include <opforge/kernel.cuh>

// One thread per 16-byte vector of the input (opforge::elementwise(...).bytes_per_thread(16)): it
// writes 16 / sizeof(T) bytes of the result as one store; a tail shorter than a vector, or a
// misaligned tensor, goes element by element.
template <class F, class T>
__global__ void static_scaled_fp8_quant(F* __restrict__ result, const T* __restrict__ input,
                                        const float* __restrict__ scale, int64_t n) {
  constexpr int kWidth = 16 / sizeof(T);
  const int64_t first = opforge::kernel::global_index() * kWidth;
  if (first >= n) return;
  const float inverted = 1.0f / *scale;
  if (first + kWidth <= n && opforge::kernel::aligned(input + first, 16) &&
      opforge::kernel::aligned(result + first, kWidth)) {
    float v[kWidth];
    opforge::kernel::unpack<T>(*reinterpret_cast<const uint4*>(input + first), v);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) v[k] *= inverted;
    opforge::kernel::store_float8<F, kWidth>(result + first, v);
    return;
  }
  for (int64_t i = first; i < first + kWidth && i < n; ++i)
    result[i] = opforge::kernel::from_acc<F>(opforge::kernel::to_acc(input[i]) * inverted);
}

// One block per row (opforge::rows("input")): the row's absolute maximum by a block reduction,
// then the row divided by its scale. A row that fits the block's registers is read once; others
// are read twice.
template <class F, class T>
__global__ void dynamic_per_token_scaled_fp8_quant(F* __restrict__ result, const T* __restrict__ input,
                                                   float* __restrict__ scale, const float* __restrict__ scale_ub,
                                                   int64_t rows, int64_t cols) {
  using Row = opforge::kernel::RowRegisters<T>;
  constexpr float kMax = opforge::kernel::float8_max<F>();
  const int64_t row = blockIdx.x;
  const T* in = input + row * cols;
  F* out = result + row * cols;
  const bool fits = Row::fits(cols) && opforge::kernel::aligned(in, 16) && opforge::kernel::aligned(out, Row::kWidth);
  uint4 words[Row::kVectors];
  float absmax = 0.0f;
  if (fits) {
    Row::load_words(in, cols, words);  // vectors past the row read as zeros
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      float v[Row::kWidth];
      opforge::kernel::unpack<T>(words[k], v);
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) absmax = fmaxf(absmax, fabsf(v[i]));
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      absmax = fmaxf(absmax, fabsf(opforge::kernel::to_acc(in[c])));
  }
  absmax = opforge::kernel::block_max(absmax);
  if (scale_ub != nullptr) absmax = fminf(absmax, *scale_ub);
  const float s = fmaxf(absmax / kMax, 1.0f / (kMax * 512.0f));
  if (threadIdx.x == 0) scale[row] = s;
  if (fits) {
#pragma unroll
    for (int k = 0; k < Row::kVectors; ++k) {
      if (!Row::has(k, cols)) continue;
      float v[Row::kWidth];
      opforge::kernel::unpack<T>(words[k], v);
#pragma unroll
      for (int i = 0; i < Row::kWidth; ++i) v[i] /= s;
      opforge::kernel::store_float8<F, Row::kWidth>(out + Row::offset(k), v);
    }
    return;
  }
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[c] = opforge::kernel::from_acc<F>(opforge::kernel::to_acc(in[c]) / s);
}

// scaled_fp8_quant (vLLM's functional form): T is the input's type; the output is float8_e4m3fn.
// One block per output row (a padding row is zero with scale 1), each with the row's scale: given
// (per tensor, or per token), or from the row's absolute maximum under kPerToken. Where a
// per-tensor scale is computed, the grid is one block, which reduces the whole tensor first.
template <class T, bool kPerToken>
__global__ void scaled_fp8_quant(const T* __restrict__ input, const float* __restrict__ scale,
                                 const float* __restrict__ scale_ub, __nv_fp8_e4m3* __restrict__ output,
                                 float* __restrict__ output_scale, int64_t rows, int64_t cols, int64_t out_rows,
                                 int64_t num_token_padding) {
  using F = __nv_fp8_e4m3;
  constexpr float kMax = opforge::kernel::float8_max<F>();
  constexpr float kSmallest = 1.0f / (kMax * 512.0f);
  const bool whole = !kPerToken && scale == nullptr;
  float tensor_scale = 0.0f;
  if (!kPerToken) {
    if (whole) {
      float absmax = 0.0f;
      for (int64_t i = threadIdx.x; i < rows * cols; i += blockDim.x)
        absmax = fmaxf(absmax, fabsf(opforge::kernel::to_acc(input[i])));
      absmax = opforge::kernel::block_max(absmax);
      tensor_scale = fmaxf(absmax / kMax, kSmallest);
    } else {
      tensor_scale = *scale;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *output_scale = tensor_scale;
  }
  for (int64_t row = blockIdx.x; row < out_rows; row += gridDim.x) {
    F* out = output + row * cols;
    if (row >= rows) {  // a padding row
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = opforge::kernel::from_acc<F>(0.0f);
      if (kPerToken && threadIdx.x == 0) output_scale[row] = 1.0f;
      continue;
    }
    const T* in = input + row * cols;
    float s = tensor_scale;
    if (kPerToken) {
      if (scale != nullptr) {
        s = scale[row];
      } else {
        float absmax = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
          absmax = fmaxf(absmax, fabsf(opforge::kernel::to_acc(in[c])));
        absmax = opforge::kernel::block_max(absmax);
        if (scale_ub != nullptr) absmax = fminf(absmax, *scale_ub);
        s = fmaxf(absmax / kMax, kSmallest);
      }
      if (threadIdx.x == 0) output_scale[row] = s;
    }
    const float inverted = 1.0f / s;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = opforge::kernel::to_acc(in[c]);
      out[c] = opforge::kernel::from_acc<F>(kPerToken ? v / s : v * inverted);
    }
  }
}
