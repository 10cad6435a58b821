// fp8_quant: activations to float8 with float32 scales, as vLLM's static_scaled_fp8_quant and
// dynamic_per_token_scaled_fp8_quant (csrc/quantization/fp8/common.cu) do, with their signatures:
// the result first, written in place.
//   static:    result = sat(input * (1 / scale)), one scale for the whole tensor;
//   per token: scale[t] = max(min(absmax(input[t]), scale_ub) / fp8_max, 1 / (fp8_max * 512)),
//              result[t] = sat(input[t] / scale[t]);
// sat(v) is the float8 conversion that saturates to the largest finite value (448 in e4m3fn,
// 57344 in e5m2) and keeps NaN (CUDA's __NV_SATFINITE, opforge::Float8_*::saturated); absmax
// skips NaN, as fmaxf does.
#include <opforge/op.h>

#include <algorithm>
#include <cmath>

namespace {

constexpr opforge::DtypeSet kActivations = opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16;

// Visits the result's float8 host type F and the input's type T.
template <class Fn>
void visit_quant(opforge::Tensor result, opforge::Tensor input, Fn&& fn) {
  opforge::visit_dtype<opforge::float8>(result.dtype(), [&]<class F>(opforge::type_tag<F>) {
    opforge::visit_dtype<kActivations>(
        input.dtype(), [&]<class T>(opforge::type_tag<T>) { fn(opforge::type_tag<F>{}, opforge::type_tag<T>{}); });
  });
}

// CPU reference: input * (1 / scale) in float, saturated to float8.
void static_quant_cpu(opforge::MutableTensor result, opforge::Tensor input, opforge::Tensor scale) {
  visit_quant(result, input, [&]<class F, class T>(opforge::type_tag<F>, opforge::type_tag<T>) {
    const float inverted = 1.0f / scale.data<float>()[0];
    for (int64_t i = 0; i < input.numel(); ++i)
      result.data<F>()[i] = F::saturated(float(input.data<T>()[i]) * inverted);
  });
}

// CPU reference: each row's scale from its absolute maximum (capped by scale_ub when given), then
// the row divided by it in float, saturated to float8.
void per_token_quant_cpu(opforge::MutableTensor result, opforge::Tensor input, opforge::MutableTensor scale,
                         opforge::Tensor scale_ub) {
  visit_quant(result, input, [&]<class F, class T>(opforge::type_tag<F>, opforge::type_tag<T>) {
    const int64_t cols = input.size(-1), rows = input.size(0);
    const float smallest = 1.0f / (F::kMax * 512.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const T* in = input.data<T>() + r * cols;
      float absmax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) absmax = std::fmax(absmax, std::fabs(float(in[c])));
      if (scale_ub.defined()) absmax = std::fmin(absmax, scale_ub.data<float>()[0]);
      const float s = std::fmax(absmax / F::kMax, smallest);
      scale.data<float>()[r] = s;
      for (int64_t c = 0; c < cols; ++c) result.data<F>()[r * cols + c] = F::saturated(float(in[c]) / s);
    }
  });
}

}  // namespace

OPFORGE_OP(examples, static_scaled_fp8_quant)
    .doc("result = input * (1 / scale) saturated to result's float8 dtype, in place")
    .input("result", opforge::float8, opforge::min_rank(1), opforge::mutated)
    .input("input", kActivations, opforge::same_shape("result"))
    .input("scale", opforge::kFloat32, opforge::shape({1}))
    .equivalent(
        "(input.float() * scale.reciprocal()).clamp(-torch.finfo(result.dtype).max, "
        "torch.finfo(result.dtype).max).to(result.dtype)")
    .reference(static_quant_cpu)
    .cuda_source("fp8_quant.cu", "static_scaled_fp8_quant<{T}, {T_input}>")
    .launch(opforge::elementwise("input").bytes_per_thread(16));

OPFORGE_OP(examples, dynamic_per_token_scaled_fp8_quant)
    .doc(
        "scale[t] = max(min(absmax(input[t]), scale_ub) / fp8_max, 1 / (fp8_max * 512)), "
        "result[t] = input[t] / scale[t] saturated to result's float8 dtype, in place")
    .input("result", opforge::float8, opforge::rank(2), opforge::mutated)
    .input("input", kActivations, opforge::same_shape("result"))
    .input("scale", opforge::kFloat32, opforge::shape({opforge::dim("result", 0), 1}), opforge::mutated)
    .input("scale_ub", opforge::kFloat32, opforge::shape({1}), opforge::optional)
    .reference(per_token_quant_cpu)
    .cuda_source("fp8_quant.cu", "dynamic_per_token_scaled_fp8_quant<{T}, {T_input}>")
    .launch(opforge::rows("input"));
