// fused_add_rms_norm: residual = x + residual, then x = rms_norm(residual) * weight, both in
// place -- the residual-stream step of a pre-norm transformer block as serving engines fuse it
// (vLLM's fused_add_rms_norm). RMSNorm: Zhang & Sennrich, "Root Mean Square Layer
// Normalization" (2019). The norm reads the residual as stored (rounded to the dtype), as the
// next block will.
#include <opforge/op.h>

#include <cmath>
#include <vector>

// CPU reference, in double, one row (the last dim) at a time.
static void fused_add_rms_norm_cpu(opforge::MutableTensor x, opforge::MutableTensor residual, opforge::Tensor weight,
                                   double eps) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t cols = weight.numel(), rows = cols ? x.numel() / cols : 0;
    for (int64_t r = 0; r < rows; ++r) {
      T* in = x.data<T>() + r * cols;
      T* res = residual.data<T>() + r * cols;
      double sumsq = 0;
      for (int64_t c = 0; c < cols; ++c) {
        res[c] = T(double(in[c]) + double(res[c]));
        sumsq += double(res[c]) * double(res[c]);
      }
      const double scale = 1.0 / std::sqrt(sumsq / double(cols) + eps);
      for (int64_t c = 0; c < cols; ++c) in[c] = T(double(res[c]) * scale * double(weight.data<T>()[c]));
    }
  });
}

OPFORGE_OP(examples, fused_add_rms_norm)
    .doc("residual = x + residual; x = rms_norm(residual) * weight; both in place, accumulated in float32")
    .input("x", opforge::floating, opforge::min_rank(1), opforge::mutated)
    .input("residual", opforge::same_dtype("x"), opforge::same_shape("x"), opforge::mutated)
    .input("weight", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
    .param<double>("eps", 1e-6, opforge::at_least(0.0))
    .equivalent("(torch.nn.functional.rms_norm(x + residual, (x.shape[-1],), weight, eps), x + residual)")
    .backward("fused_add_rms_norm_backward")
    .reference(fused_add_rms_norm_cpu)
    .cuda_source("fused_add_rms_norm.cu", "fused_add_rms_norm<{T}>")
    .launch(opforge::rows("x"));

// CPU reference of the gradients, in double. With h = residual_out (x + residual, as stored),
// r = 1 / sqrt(mean(h^2) + eps) per row and g = grad_x_out: rms_norm's gradient of h,
// r * (g * weight - h * r^2 * mean(g * weight * h)), plus grad_residual_out, is the gradient
// of both x and residual as given (one tensor); grad_weight = the sum over rows of g * h * r.
static void fused_add_rms_norm_backward_cpu(opforge::Tensor grad_x_out, opforge::Tensor grad_residual_out,
                                            opforge::Tensor residual_out, opforge::Tensor weight, double eps,
                                            opforge::MutableTensor grad_x_and_residual,
                                            opforge::MutableTensor grad_weight) {
  opforge::visit_dtype<opforge::floating>(residual_out.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t cols = weight.numel(), rows = cols ? residual_out.numel() / cols : 0;
    const T* w = weight.data<T>();
    std::vector<double> gw(static_cast<size_t>(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* h = residual_out.data<T>() + r * cols;
      const T* g = grad_x_out.data<T>() + r * cols;
      const T* gr = grad_residual_out.data<T>() + r * cols;
      double sumsq = 0, dot = 0;
      for (int64_t c = 0; c < cols; ++c) {
        sumsq += double(h[c]) * double(h[c]);
        dot += double(g[c]) * double(w[c]) * double(h[c]);
      }
      const double scale = 1.0 / std::sqrt(sumsq / double(cols) + eps);
      const double k = dot / double(cols) * scale * scale;
      for (int64_t c = 0; c < cols; ++c) {
        gw[c] += double(g[c]) * double(h[c]) * scale;
        grad_x_and_residual.data<T>()[r * cols + c] =
            T(scale * (double(g[c]) * double(w[c]) - double(h[c]) * k) + double(gr[c]));
      }
    }
    for (int64_t c = 0; c < cols; ++c) grad_weight.data<T>()[c] = T(gw[c]);
  });
}

// fused_add_rms_norm_backward.cu
void fused_add_rms_norm_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_x_out,
                                      opforge::Tensor grad_residual_out, opforge::Tensor residual_out,
                                      opforge::Tensor weight, double eps, opforge::MutableTensor grad_x_and_residual,
                                      opforge::MutableTensor grad_weight);

// The gradients of fused_add_rms_norm (Note [Mutated inputs] in opforge/op_constraints.h): of x and residual
// after the op (grad_x_out, grad_residual_out), with residual's value after the op saved; x and
// residual as given share one gradient (both feed x + residual): grad_x_and_residual.
OPFORGE_OP(examples, fused_add_rms_norm_backward)
    .doc("fused_add_rms_norm's gradients: of x and residual as given (one tensor), and of weight summed over rows")
    .input("grad_x_out", opforge::floating, opforge::min_rank(1))
    .input("grad_residual_out", opforge::same_dtype("grad_x_out"), opforge::same_shape("grad_x_out"))
    .input("residual_out", opforge::same_dtype("grad_x_out"), opforge::same_shape("grad_x_out"))
    .input("weight", opforge::same_dtype("grad_x_out"), opforge::shape({opforge::dim("grad_x_out", -1)}))
    .param<double>("eps", 1e-6, opforge::at_least(0.0))
    .output("grad_x_and_residual", opforge::like("residual_out"))
    .output("grad_weight", opforge::like("weight"))
    .equivalent(
        "(lambda g: (g[0] + grad_residual_out, g[1]))(torch.func.vjp(lambda h, w: "
        "torch.nn.functional.rms_norm(h, (h.shape[-1],), w, eps), residual_out, weight)[1](grad_x_out))")
    .reference(fused_add_rms_norm_backward_cpu)
    .cuda(fused_add_rms_norm_backward_cuda);
