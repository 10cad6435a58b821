// Sums rows of float32 partial results into an output of any floating dtype: the second step of
// TritonLaunch::sum_into (Note [Triton kernels] in opforge/op_launch.h). Compiled to PTX at build
// time (nvcc -ptx) and embedded in the op-library runtime, which loads it with the CUDA driver.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

template <class T>
__device__ T from_float(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// out[c] = sum over r of partials[r * cols + c], one column per thread.
template <class T>
__device__ void sum_rows(const float* partials, int64_t rows, int64_t cols, T* out) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += int64_t(gridDim.x) * blockDim.x) {
    float total = 0.0f;
    for (int64_t r = 0; r < rows; ++r) total += partials[r * cols + c];
    out[c] = from_float<T>(total);
  }
}

}  // namespace

extern "C" __global__ void opforge_sum_partials_fp32(const float* p, int64_t rows, int64_t cols, float* out) {
  sum_rows(p, rows, cols, out);
}
extern "C" __global__ void opforge_sum_partials_fp64(const float* p, int64_t rows, int64_t cols, double* out) {
  sum_rows(p, rows, cols, out);
}
extern "C" __global__ void opforge_sum_partials_fp16(const float* p, int64_t rows, int64_t cols, __half* out) {
  sum_rows(p, rows, cols, out);
}
extern "C" __global__ void opforge_sum_partials_bf16(const float* p, int64_t rows, int64_t cols, __nv_bfloat16* out) {
  sum_rows(p, rows, cols, out);
}
