// fused_add_rms_norm: residual = x + residual, then x = rms_norm(residual) * weight, both in
// place -- the residual-stream step of a pre-norm transformer block as serving engines fuse it
// (vLLM's fused_add_rms_norm). RMSNorm: Zhang & Sennrich, "Root Mean Square Layer
// Normalization" (2019). The norm reads the residual as stored (rounded to the dtype), as the
// next block will.
#include <opforge/op.h>

#include <cmath>

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
    .reference(fused_add_rms_norm_cpu)
    .cuda_source("fused_add_rms_norm.cu", "fused_add_rms_norm<{T}>")
    .launch(opforge::rows("x"));
