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
    .backward("softshrink_backward")
    .reference(softshrink_cpu)
    .cuda_source("softshrink.cu", "softshrink<{T}>")  // kernels/softshrink.cu, compiled at run time
    .launch(opforge::elementwise("y").bytes_per_thread(16));

// CPU reference of the gradient: grad_y where |x| > lambd, else 0 (also where x is NaN) -- the
// derivative of softshrink, as torch's softshrink_backward computes it on the CPU.
static void softshrink_backward_cpu(opforge::Tensor grad_y, opforge::Tensor x, double lambd,
                                    opforge::MutableTensor grad_x) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const T* g = grad_y.data<T>();
    const T* in = x.data<T>();
    T* out = grad_x.data<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const double v = static_cast<double>(in[i]);
      out[i] = std::abs(v) > lambd ? g[i] : T(0.0);
    }
  });
}

// The gradient of softshrink (Note [Backward ops] in opforge/op_builder.h): inputs grad_y (the
// gradient of the output y), x and lambd (saved from the forward call); output grad_x.
OPFORGE_OP(examples, softshrink_backward)
    .doc("softshrink's gradient: grad_y where |x| > lambd, else 0")
    .input("grad_y", opforge::floating)
    .input("x", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .param<double>("lambd", 0.5, opforge::at_least(0.0))
    .output("grad_x", opforge::like("grad_y"))
    .equivalent("torch.where(x.abs() > lambd, grad_y, torch.zeros_like(grad_y))")
    .reference(softshrink_backward_cpu)
    .cuda_source("softshrink_backward.cu", "softshrink_backward<{T}>")
    .launch(opforge::elementwise("grad_x").bytes_per_thread(16));
