// The CUDA kernel of the hand-written softshrink (softshrink.cpp): one thread per element, on the
// current stream of x's device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

__global__ void softshrink_kernel(const float* x, float* y, float l, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    y[i] = v > l ? v - l : (v < -l ? v + l : 0.0f);
  }
}

}  // namespace

at::Tensor softshrink_cuda(const at::Tensor& x, double lambd) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "handwritten::softshrink: x: expected float32, got ", x.scalar_type());
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous();
  at::Tensor y = at::empty_like(in);
  const int64_t n = in.numel();
  if (n > 0) {
    softshrink_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        in.const_data_ptr<float>(), y.mutable_data_ptr<float>(), static_cast<float>(lambd), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return y;
}
