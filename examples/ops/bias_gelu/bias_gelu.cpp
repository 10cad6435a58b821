// bias_gelu: gelu(x + bias) over the last dim, the fused elementwise chain of a BERT
// feed-forward layer (the dense layer's bias add and its activation in one pass).
#include <opforge/op.h>

#include <cmath>

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
    .reference(bias_gelu_cpu)
    .cuda(bias_gelu_cuda);
