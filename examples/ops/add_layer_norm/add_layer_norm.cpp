// add_layer_norm: y = layer_norm(x + residual) over the last dim, with weight and bias (Ba,
// Kiros & Hinton, "Layer Normalization", 2016): the residual add and LayerNorm of a post-norm
// transformer block in one pass.
#include <opforge/op.h>

#include <cmath>

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
    .reference(add_layer_norm_cpu)
    .cuda_source("add_layer_norm.cu", "add_layer_norm<{T}>")
    .launch(opforge::rows("x"));
