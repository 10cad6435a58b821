// demo::mish, made by `opforge new demo::mish --dtypes float32,float16,bfloat16 --shape 4096,1024`
// (the command opforge doctor printed for the demo model's NumPy activation), then given its
// math: y = x * tanh(softplus(x)) (Misra, "Mish: A Self Regularized Non-Monotonic Activation
// Function", 2019; torch.nn.functional.mish), and its gradient as a backward op, so that the model
// still trains through it. `pytest examples/models/doctor_demo/mish` checks both.
#include <opforge/op.h>

#include <cmath>

// CPU reference, in double: the ground truth opforge verify compares every device kernel with.
static void mish_cpu(opforge::Tensor x, opforge::MutableTensor y) {
  opforge::visit_dtype<opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16>(
      x.dtype(), [&]<class T>(opforge::type_tag<T>) {
        const T* in = x.data<T>();
        T* out = y.data<T>();
        for (int64_t i = 0, n = x.numel(); i < n; ++i) {
          const double v = static_cast<double>(in[i]);
          out[i] = T(v * std::tanh(std::log1p(std::exp(v))));
        }
      });
}

OPFORGE_OP(demo, mish)
    .doc("y = x * tanh(softplus(x)), in float32 for 16-bit x")
    .input("x", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16)
    .output("y", opforge::like("x"))
    .equivalent("torch.nn.functional.mish(x)")  // the torch expression verify checks the reference against
    .backward("mish_backward")                  // autograd runs it for x's gradient
    .reference(mish_cpu)
    .cuda_source("mish.cu", "mish<{T}>")  // kernels/mish.cu, compiled at run time
    .launch(opforge::elementwise("y").bytes_per_thread(16));

// CPU reference of the gradient, in double: grad_x = grad_y * mish'(x), mish'(x) = tanh(sp) +
// x * sigmoid(x) * (1 - tanh(sp)^2) with sp = softplus(x) (softplus' = sigmoid), as torch's
// mish_backward computes it.
static void mish_backward_cpu(opforge::Tensor grad_y, opforge::Tensor x, opforge::MutableTensor grad_x) {
  opforge::visit_dtype<opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16>(
      x.dtype(), [&]<class T>(opforge::type_tag<T>) {
        const T* g = grad_y.data<T>();
        const T* in = x.data<T>();
        T* out = grad_x.data<T>();
        for (int64_t i = 0, n = x.numel(); i < n; ++i) {
          const double v = static_cast<double>(in[i]);
          const double t = std::tanh(std::log1p(std::exp(v))), sigmoid = 1.0 / (1.0 + std::exp(-v));
          out[i] = T(static_cast<double>(g[i]) * (t + v * sigmoid * (1.0 - t * t)));
        }
      });
}

OPFORGE_OP(demo, mish_backward)
    .doc("mish's gradient: grad_x = grad_y * mish'(x), in float32 for 16-bit inputs")
    .input("grad_y", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16)
    .input("x", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .output("grad_x", opforge::like("x"))
    .equivalent("torch.ops.aten.mish_backward(grad_y, x)")
    .reference(mish_backward_cpu)
    .cuda_source("mish.cu", "mish_backward<{T}>")
    .launch(opforge::elementwise("grad_x").bytes_per_thread(16));
