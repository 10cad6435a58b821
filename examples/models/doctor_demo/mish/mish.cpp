// demo::mish, made by `opforge new demo::mish --dtypes float32,float16,bfloat16 --shape 4096,1024`
// (the command opforge doctor printed for the demo model's NumPy activation), then given its
// math: y = x * tanh(softplus(x)) (Misra, "Mish: A Self Regularized Non-Monotonic Activation
// Function", 2019; torch.nn.functional.mish). `pytest examples/models/doctor_demo/mish` checks it.
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
    .reference(mish_cpu)
    .cuda_source("mish.cu", "mish<{T}>")  // kernels/mish.cu, compiled at run time
    .launch(opforge::elementwise("y").bytes_per_thread(16));
