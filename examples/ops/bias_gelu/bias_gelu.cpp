// bias_gelu: gelu(x + bias) over the last dim, the fused elementwise chain of a BERT
// feed-forward layer (the dense layer's bias add and its activation in one pass).
#include <opforge/op.h>

#include <cmath>
#include <vector>

// CPU reference, in double. Exact GELU: gelu(v) = v / 2 * (1 + erf(v / sqrt(2)))
// (Hendrycks & Gimpel, "Gaussian Error Linear Units", 2016; torch.nn.functional.gelu default).
static void bias_gelu_cpu(opforge::Tensor x, opforge::Tensor bias, opforge::MutableTensor y) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const T* in = x.data<T>();
    const T* b = bias.data<T>();
    T* out = y.data<T>();
    const int64_t cols = bias.numel();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const double v = static_cast<double>(in[i]) + static_cast<double>(b[i % cols]);
      out[i] = T(0.5 * v * (1.0 + std::erf(v * M_SQRT1_2)));
    }
  });
}

// bias_gelu.cu
void bias_gelu_cuda(const opforge::Context& ctx, opforge::Tensor x, opforge::Tensor bias, opforge::MutableTensor y);

OPFORGE_OP(examples, bias_gelu)
    .doc(
        "gelu(x + bias), GELU's erf form (float32 with erff; float16/bfloat16 with an erfc approximation "
        "within 2.2e-7 absolute, see bias_gelu.cu); bias is added along the last dim")
    .input("x", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16, opforge::min_rank(1))
    .input("bias", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
    .output("y", opforge::like("x"))
    .equivalent("torch.nn.functional.gelu(x + bias)")
    .autocast(opforge::Autocast::kPromote)  // a 16-bit activation with its float32 bias: both in float32
    .sharding(opforge::Sharding::kPointwise)
    .backward("bias_gelu_backward")
    .reference(bias_gelu_cpu)
    .cuda(bias_gelu_cuda);

// CPU reference of the gradients, in double: with v = x + bias,
// grad_x = grad_y * gelu'(v), gelu'(v) = Phi(v) + v * phi(v) (phi the standard normal density),
// and grad_bias = the sum of grad_x over every dim but the last.
static void bias_gelu_backward_cpu(opforge::Tensor grad_y, opforge::Tensor x, opforge::Tensor bias,
                                   opforge::MutableTensor grad_x, opforge::MutableTensor grad_bias) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const T* in = x.data<T>();
    const T* g = grad_y.data<T>();
    const T* b = bias.data<T>();
    const int64_t cols = bias.numel();
    std::vector<double> gb(static_cast<size_t>(cols), 0.0);
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      const double v = static_cast<double>(in[i]) + static_cast<double>(b[i % cols]);
      const double d =
          0.5 * (1.0 + std::erf(v * M_SQRT1_2)) + v * std::exp(-0.5 * v * v) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
      const double gx = static_cast<double>(g[i]) * d;
      gb[i % cols] += gx;
      grad_x.data<T>()[i] = T(gx);
    }
    for (int64_t c = 0; c < cols; ++c) grad_bias.data<T>()[c] = T(gb[c]);
  });
}

// bias_gelu_backward.cu
void bias_gelu_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_y, opforge::Tensor x,
                             opforge::Tensor bias, opforge::MutableTensor grad_x, opforge::MutableTensor grad_bias);

// The gradients of bias_gelu (Note [Backward ops] in opforge/op_builder.h): grad_y, and x and bias saved
// from the forward call.
OPFORGE_OP(examples, bias_gelu_backward)
    .doc("bias_gelu's gradients: grad_x = grad_y * gelu'(x + bias), grad_bias its sum over rows (float32 sums)")
    .input("grad_y", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16, opforge::min_rank(1))
    .input("x", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .input("bias", opforge::same_dtype("grad_y"), opforge::shape({opforge::dim("x", -1)}))
    .output("grad_x", opforge::like("x"))
    .output("grad_bias", opforge::like("bias"))
    .equivalent("torch.func.vjp(lambda x, bias: torch.nn.functional.gelu(x + bias), x, bias)[1](grad_y)")
    .reference(bias_gelu_backward_cpu)
    .cuda(bias_gelu_backward_cuda);
