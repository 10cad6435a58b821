// rms_norm: y = x / sqrt(mean(x^2 over the last dim) + eps) * weight (Zhang & Sennrich,
// "Root Mean Square Layer Normalization", 2019; torch.nn.functional.rms_norm).
#include <opforge/op.h>

#include <cmath>

// CPU reference, in double, one row (the last dim) at a time; weight in x's dtype or float32.
static void rms_norm_cpu(opforge::Tensor x, opforge::Tensor weight, double eps, opforge::MutableTensor y) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    opforge::visit_dtype<opforge::floating>(weight.dtype(), [&]<class W>(opforge::type_tag<W>) {
      const int64_t cols = weight.numel(), rows = cols ? x.numel() / cols : 0;
      for (int64_t r = 0; r < rows; ++r) {
        const T* in = x.data<T>() + r * cols;
        double sumsq = 0;
        for (int64_t c = 0; c < cols; ++c) sumsq += double(in[c]) * double(in[c]);
        const double scale = 1.0 / std::sqrt(sumsq / double(cols) + eps);
        for (int64_t c = 0; c < cols; ++c)
          y.data<T>()[r * cols + c] = T(double(in[c]) * scale * double(weight.data<W>()[c]));
      }
    });
  });
}

OPFORGE_OP(examples, rms_norm)
    .doc("x / sqrt(mean(x^2, last dim) + eps) * weight, accumulated in float32; weight in x's dtype or float32")
    .input("x", opforge::floating, opforge::shape({opforge::leading_dims, opforge::any}))
    .input("weight", opforge::same_dtype("x") | opforge::kFloat32, opforge::shape({opforge::dim("x", -1)}))
    .param<double>("eps", 1e-6, opforge::at_least(0.0))
    .output("y", opforge::like("x"))
    .equivalent("torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)")
    .reference(rms_norm_cpu)
    .cuda_source("rms_norm.cu", "rms_norm<{T}, {T_weight}>")
    .launch(opforge::rows("x"));
