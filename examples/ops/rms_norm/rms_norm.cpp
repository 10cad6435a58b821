// rms_norm: y = x / sqrt(mean(x^2 over the last dim) + eps) * weight (Zhang & Sennrich,
// "Root Mean Square Layer Normalization", 2019; torch.nn.functional.rms_norm).
#include <opforge/op.h>

#include <cmath>
#include <vector>

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
    .backward("rms_norm_backward")
    .reference(rms_norm_cpu)
    .cuda_source("rms_norm.cu", "rms_norm<{T}, {T_weight}>")
    .launch(opforge::rows("x"));

// CPU reference of the gradients, in double, with r = 1 / sqrt(mean(x^2) + eps) per row:
// grad_x = r * (grad_y * weight - x * r^2 * mean(grad_y * weight * x)), and
// grad_weight = the sum over rows of grad_y * x * r (the derivative of y = x * r * weight).
static void rms_norm_backward_cpu(opforge::Tensor grad_y, opforge::Tensor x, opforge::Tensor weight, double eps,
                                  opforge::MutableTensor grad_x, opforge::MutableTensor grad_weight) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    opforge::visit_dtype<opforge::floating>(weight.dtype(), [&]<class W>(opforge::type_tag<W>) {
      const int64_t cols = weight.numel(), rows = cols ? x.numel() / cols : 0;
      std::vector<double> gw(static_cast<size_t>(cols), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const T* in = x.data<T>() + r * cols;
        const T* g = grad_y.data<T>() + r * cols;
        double sumsq = 0, dot = 0;
        for (int64_t c = 0; c < cols; ++c) {
          sumsq += double(in[c]) * double(in[c]);
          dot += double(g[c]) * double(weight.data<W>()[c]) * double(in[c]);
        }
        const double scale = 1.0 / std::sqrt(sumsq / double(cols) + eps);
        const double k = dot / double(cols) * scale * scale;
        for (int64_t c = 0; c < cols; ++c) {
          gw[c] += double(g[c]) * double(in[c]) * scale;
          grad_x.data<T>()[r * cols + c] = T(scale * (double(g[c]) * double(weight.data<W>()[c]) - double(in[c]) * k));
        }
      }
      for (int64_t c = 0; c < cols; ++c) grad_weight.data<W>()[c] = W(gw[c]);
    });
  });
}

// rms_norm_backward.cu
void rms_norm_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_y, opforge::Tensor x,
                            opforge::Tensor weight, double eps, opforge::MutableTensor grad_x,
                            opforge::MutableTensor grad_weight);

// The gradients of rms_norm (Note [Backward ops] in opforge/op_builder.h): grad_y, and x, weight and eps
// saved from the forward call; grad_weight in weight's dtype (float32 beside a 16-bit x).
OPFORGE_OP(examples, rms_norm_backward)
    .doc("rms_norm's gradients: grad_x, and grad_weight summed over rows in float32")
    .input("grad_y", opforge::floating, opforge::shape({opforge::leading_dims, opforge::any}))
    .input("x", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .input("weight", opforge::same_dtype("grad_y") | opforge::kFloat32, opforge::shape({opforge::dim("x", -1)}))
    .param<double>("eps", 1e-6, opforge::at_least(0.0))
    .output("grad_x", opforge::like("x"))
    .output("grad_weight", opforge::like("weight"))
    .equivalent(
        "torch.func.vjp(lambda x, weight: torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps), "
        "x, weight)[1](grad_y)")
    .reference(rms_norm_backward_cpu)
    .cuda(rms_norm_backward_cuda);
