// fp8_quant: activations to float8 with float32 scales, as vLLM's static_scaled_fp8_quant and
// dynamic_per_token_scaled_fp8_quant (csrc/quantization/fp8/common.cu) do, with their signatures:
// the result first, written in place; and vLLM's functional scaled_fp8_quant (vllm/_custom_ops.py),
// which picks one of them, or a dynamic per-tensor scale, by its arguments and returns (output,
// scale).
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

// CPU reference of scaled_fp8_quant: the scale of each output row (one for the tensor, or one per
// token under use_per_token_if_dynamic), given or computed from the absolute maximum, then the
// rows quantised with it; padding rows (num_token_padding) are zero with scale 1.
void scaled_quant_cpu(opforge::Tensor input, opforge::Tensor scale, int64_t, opforge::Tensor scale_ub, bool per_token,
                      opforge::MutableTensor output, opforge::MutableTensor output_scale) {
  visit_quant(output, input, [&]<class F, class T>(opforge::type_tag<F>, opforge::type_tag<T>) {
    const int64_t rows = input.size(0), cols = input.size(1), out_rows = output.size(0);
    const float smallest = 1.0f / (F::kMax * 512.0f);
    auto row_absmax = [&](int64_t r) {
      float absmax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) absmax = std::fmax(absmax, std::fabs(float(input.data<T>()[r * cols + c])));
      return absmax;
    };
    float tensor_scale = 0.0f;  // per tensor: given, or from the whole tensor's absolute maximum
    if (!per_token) {
      float absmax = 0.0f;
      for (int64_t r = 0; r < rows && !scale.defined(); ++r) absmax = std::fmax(absmax, row_absmax(r));
      tensor_scale = scale.defined() ? scale.data<float>()[0] : std::fmax(absmax / F::kMax, smallest);
      output_scale.data<float>()[0] = tensor_scale;
    }
    for (int64_t r = 0; r < out_rows; ++r) {
      F* out = output.data<F>() + r * cols;
      if (r >= rows) {  // a padding row
        for (int64_t c = 0; c < cols; ++c) out[c] = F::saturated(0.0f);
        if (per_token) output_scale.data<float>()[r] = 1.0f;
        continue;
      }
      float s = tensor_scale;
      if (per_token) {
        float absmax = row_absmax(r);
        if (scale_ub.defined()) absmax = std::fmin(absmax, scale_ub.data<float>()[0]);
        s = scale.defined() ? scale.data<float>()[r] : std::fmax(absmax / F::kMax, smallest);
        output_scale.data<float>()[r] = s;
      }
      const float inverted = 1.0f / s;
      for (int64_t c = 0; c < cols; ++c)
        out[c] = per_token ? F::saturated(float(input.data<T>()[r * cols + c]) / s)
                           : F::saturated(float(input.data<T>()[r * cols + c]) * inverted);
    }
  });
}

// One block per output row, or one block for the whole tensor where a per-tensor scale is
// computed; after the pointers the kernel gets rows, cols and the output's rows.
opforge::LaunchConfig scaled_quant_grid(opforge::Tensor input, opforge::Tensor scale, int64_t, opforge::Tensor,
                                        bool per_token, opforge::MutableTensor output, opforge::MutableTensor) {
  opforge::LaunchConfig cfg;
  cfg.block[0] = 256;
  const bool whole = !per_token && !scale.defined();
  cfg.grid[0] = static_cast<unsigned>(whole ? 1 : std::max<int64_t>(1, output.size(0)));
  cfg.args = {input.size(0), input.size(1), output.size(0)};
  return cfg;
}

}  // namespace

// vLLM's scaled_fp8_quant(input, scale=None, num_token_padding=None, scale_ub=None,
// use_per_token_if_dynamic=False) -> (output, scale), functional: num_token_padding 0 stands for
// None. The scale, given or returned, is one per token under use_per_token_if_dynamic and one for
// the tensor otherwise (a given per-token scale quantises statically per token).
OPFORGE_OP(examples, scaled_fp8_quant)
    .doc(
        "output = input / scale saturated to float8_e4m3fn, scale given or max(absmax / 448, 1 / (448 * 512)) per "
        "token (use_per_token_if_dynamic, absmax capped by scale_ub) or per tensor; rows padded to num_token_padding")
    .input("input", kActivations, opforge::rank(2))
    .input("scale", opforge::kFloat32, opforge::optional,
           opforge::when("use_per_token_if_dynamic", true, opforge::shape({opforge::dim("input", 0), 1}))
               .otherwise(opforge::shape({1})))
    .param<int64_t>("num_token_padding", 0, opforge::at_least(0))
    .input("scale_ub", opforge::kFloat32, opforge::shape({1}), opforge::optional)
    .param<bool>("use_per_token_if_dynamic", false, opforge::compile_time)
    .output("output",
            opforge::shape({opforge::max(opforge::dim("input", 0), opforge::int_param("num_token_padding")),
                            opforge::dim("input", 1)}),
            opforge::kFloat8_e4m3fn)
    .output("output_scale",
            opforge::when(
                "use_per_token_if_dynamic", true,
                opforge::shape({opforge::max(opforge::dim("input", 0), opforge::int_param("num_token_padding")), 1}))
                .otherwise(opforge::shape({1})),
            opforge::kFloat32)
    .reference(scaled_quant_cpu)
    .cuda_source("fp8_quant.cu", "scaled_fp8_quant<{T}, {use_per_token_if_dynamic}>")
    .launch_grid(scaled_quant_grid);

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
