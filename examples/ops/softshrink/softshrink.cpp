// softshrink: the seed example, with a run-time compiled CUDA kernel. Matches
// torch.nn.functional.softshrink.
#include <opforge/op.h>

#include <cmath>

// CPU reference, in double: y = x - lambd where x > lambd, x + lambd where x < -lambd, else 0;
// NaN stays NaN (as torch.nn.functional.softshrink).
static void softshrink_cpu(opforge::Tensor x, double lambd, opforge::MutableTensor y) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const double v = static_cast<double>(in[i]);
      out[i] = T(std::isnan(v) ? v : v > lambd ? v - lambd : v < -lambd ? v + lambd : 0.0);
    }
  });
}

OPFORGE_OP(examples, softshrink)
    .doc("x - lambd where x > lambd, x + lambd where x < -lambd, else 0")
    .input("x", opforge::floating)
    .param<double>("lambd", 0.5, opforge::at_least(0.0))
    .output("y", opforge::like("x"))
    .equivalent("torch.nn.functional.softshrink(x, lambd)")
    .reference(softshrink_cpu)
    .cuda_source("softshrink.cu", "softshrink<{T}>")  // kernels/softshrink.cu, compiled at run time
    .launch(opforge::elementwise("y").bytes_per_thread(16));
