// add_layer_norm: y = layer_norm(x + residual) over the last dim, with weight and bias (Ba,
// Kiros & Hinton, "Layer Normalization", 2016): the residual add and LayerNorm of a post-norm
// transformer block in one pass.
#include <opforge/op.h>

#include <cmath>
#include <vector>

// CPU reference, in double, one row at a time; variance without Bessel's correction.
static void add_layer_norm_cpu(opforge::Tensor x, opforge::Tensor residual, opforge::Tensor weight,
                               opforge::Tensor bias, double eps, opforge::MutableTensor y) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t cols = weight.numel(), rows = cols ? x.numel() / cols : 0;
    for (int64_t r = 0; r < rows; ++r) {
      auto h = [&](int64_t c) { return double(x.data<T>()[r * cols + c]) + double(residual.data<T>()[r * cols + c]); };
      double mean = 0, var = 0;
      for (int64_t c = 0; c < cols; ++c) mean += h(c) / double(cols);
      for (int64_t c = 0; c < cols; ++c) var += (h(c) - mean) * (h(c) - mean) / double(cols);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < cols; ++c)
        y.data<T>()[r * cols + c] = T((h(c) - mean) * inv * double(weight.data<T>()[c]) + double(bias.data<T>()[c]));
    }
  });
}

OPFORGE_OP(examples, add_layer_norm)
    .doc("layer_norm(x + residual) over the last dim, with weight and bias; float32 accumulation")
    .input("x", opforge::floating, opforge::min_rank(1))
    .input("residual", opforge::same_dtype("x"), opforge::same_shape("x"))
    .input("weight", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
    .input("bias", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
    .param<double>("eps", 1e-5, opforge::at_least(0.0))
    .output("y", opforge::like("x"))
    .equivalent("torch.nn.functional.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps)")
    .autocast(opforge::Autocast::kFloat32)  // as torch's layer_norm under autocast
    .backward("add_layer_norm_backward")
    .reference(add_layer_norm_cpu)
    .cuda_source("add_layer_norm.cu", "add_layer_norm<{T}>")
    .launch(opforge::rows("x"));

// CPU reference of the gradients, in double. With h = x + residual, per row mean m,
// inv = 1 / sqrt(var + eps), xhat = (h - m) * inv and dxhat = grad_y * weight:
// grad_x = grad_residual = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), one tensor,
// grad_weight = the sum over rows of grad_y * xhat, grad_bias = the sum over rows of grad_y.
static void add_layer_norm_backward_cpu(opforge::Tensor grad_y, opforge::Tensor x, opforge::Tensor residual,
                                        opforge::Tensor weight, double eps, opforge::MutableTensor grad_x_and_residual,
                                        opforge::MutableTensor grad_weight, opforge::MutableTensor grad_bias) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t cols = weight.numel(), rows = cols ? x.numel() / cols : 0;
    std::vector<double> gw(static_cast<size_t>(cols), 0.0), gb(static_cast<size_t>(cols), 0.0);
    std::vector<double> h(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      const T* g = grad_y.data<T>() + r * cols;
      const T* w = weight.data<T>();
      double mean = 0, var = 0, mean_dx = 0, mean_dx_xhat = 0;
      for (int64_t c = 0; c < cols; ++c) {
        h[c] = double(x.data<T>()[r * cols + c]) + double(residual.data<T>()[r * cols + c]);
        mean += h[c] / double(cols);
      }
      for (int64_t c = 0; c < cols; ++c) var += (h[c] - mean) * (h[c] - mean) / double(cols);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t c = 0; c < cols; ++c) {
        mean_dx += double(g[c]) * double(w[c]) / double(cols);
        mean_dx_xhat += double(g[c]) * double(w[c]) * (h[c] - mean) * inv / double(cols);
      }
      for (int64_t c = 0; c < cols; ++c) {
        const double xhat = (h[c] - mean) * inv;
        gw[c] += double(g[c]) * xhat;
        gb[c] += double(g[c]);
        grad_x_and_residual.data<T>()[r * cols + c] =
            T(inv * (double(g[c]) * double(w[c]) - mean_dx - xhat * mean_dx_xhat));
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      grad_weight.data<T>()[c] = T(gw[c]);
      grad_bias.data<T>()[c] = T(gb[c]);
    }
  });
}

// add_layer_norm_backward.cu
void add_layer_norm_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_y, opforge::Tensor x,
                                  opforge::Tensor residual, opforge::Tensor weight, double eps,
                                  opforge::MutableTensor grad_x_and_residual, opforge::MutableTensor grad_weight,
                                  opforge::MutableTensor grad_bias);

// The gradients of add_layer_norm (Note [Backward ops] in opforge/op_builder.h): grad_y, and x, residual,
// weight and eps saved from the forward call (bias does not enter them). x and residual enter the
// op as their sum, so they share one gradient (grad_x_and_residual), given to both.
OPFORGE_OP(examples, add_layer_norm_backward)
    .doc("add_layer_norm's gradients: of x and residual (one tensor), and grad_weight and grad_bias summed over rows")
    .input("grad_y", opforge::floating, opforge::min_rank(1))
    .input("x", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .input("residual", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .input("weight", opforge::same_dtype("grad_y"), opforge::shape({opforge::dim("x", -1)}))
    .param<double>("eps", 1e-5, opforge::at_least(0.0))
    .output("grad_x_and_residual", opforge::like("x"))
    .output("grad_weight", opforge::like("weight"))
    .output("grad_bias", opforge::like("weight"))
    .equivalent(
        "torch.func.vjp(lambda h, w, b: torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, eps), "
        "x + residual, weight, torch.zeros_like(weight))[1](grad_y)")
    .reference(add_layer_norm_backward_cpu)
    .cuda(add_layer_norm_backward_cuda);
