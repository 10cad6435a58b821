// The run-time softshrink kernel (examples/ops/softshrink/kernels/softshrink.cu) built ahead of
// time with nvcc, to compare its bandwidth with the NVRTC build of the same source.
#include <opforge/op.h>

static void softshrink_aot_cpu(opforge::Tensor x, double lambd, opforge::MutableTensor y) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = static_cast<double>(x.data<T>()[i]);
      y.data<T>()[i] = T(v > lambd ? v - lambd : v < -lambd ? v + lambd : 0.0);
    }
  });
}

void softshrink_aot_cuda(const opforge::Context& ctx, opforge::Tensor x, double lambd, opforge::MutableTensor y);

OPFORGE_OP(bench, softshrink_aot)
    .input("x", opforge::floating)
    .param<double>("lambd", 0.5)
    .output("y", opforge::like("x"))
    .reference(softshrink_aot_cpu)
    .cuda(softshrink_aot_cuda);
