// softshrink written by hand against torch's C++ API, as a kernel author registers an op without
// opforge (TORCH_LIBRARY, one kernel per dispatch key): bench_call_cost.py's custom-op baseline.
// y = x - lambd where x > lambd, x + lambd where x < -lambd, else 0; x float32, any shape.
#include <ATen/ATen.h>
#include <torch/library.h>

#ifdef WITH_CUDA
at::Tensor softshrink_cuda(const at::Tensor& x, double lambd);  // softshrink.cu
#endif

namespace {

at::Tensor softshrink_cpu(const at::Tensor& x, double lambd) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "handwritten::softshrink: x: expected float32, got ", x.scalar_type());
  const at::Tensor in = x.contiguous();
  at::Tensor y = at::empty_like(in);
  const float* src = in.const_data_ptr<float>();
  float* dst = y.mutable_data_ptr<float>();
  const float l = static_cast<float>(lambd);
  for (int64_t i = 0; i < in.numel(); ++i) {
    const float v = src[i];
    dst[i] = v > l ? v - l : (v < -l ? v + l : 0.0f);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(handwritten, m) { m.def("softshrink(Tensor x, float lambd=0.5) -> Tensor"); }
TORCH_LIBRARY_IMPL(handwritten, CPU, m) { m.impl("softshrink", softshrink_cpu); }
#ifdef WITH_CUDA
TORCH_LIBRARY_IMPL(handwritten, CUDA, m) { m.impl("softshrink", softshrink_cuda); }
#endif
