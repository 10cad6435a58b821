// int8_linear: y = x W^T + b with W stored as int8 per output channel (weight-only quantisation,
// symmetric, as torchao's int8_weight_only): W[n] ~ qweight[n] * scales[n], scales[n] =
// max|W[n]| / 127. The weights move a quarter of float32's bytes and half of float16's, and the
// kernels dequantise them in registers.
//
// Int8Linear is the custom class that holds them (Note [Custom classes] in opforge/op.h): built
// from a float weight [N, K] and bias [N] by int8_linear_pack, which quantises and packs
// (int8_linear.h); `forward(x)` runs int8_linear.
#include <opforge/op.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "int8_linear.h"

// Quantises in float32, as the CUDA kernel does (so both give the same bytes): scale = amax / 127
// (NaN weights ignored), q = int8_linear::quantise(w, scale).
static void int8_linear_pack_cpu(opforge::Tensor weight, opforge::Tensor bias, opforge::MutableTensor qweight,
                                 opforge::MutableTensor scales, opforge::MutableTensor bias_fp32) {
  const int64_t N = weight.size(0), K = weight.size(1);
  opforge::visit_dtype<opforge::floating>(weight.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const T* w = weight.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      float amax = 0;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(static_cast<float>(w[n * K + k])));
      const float scale = amax / 127.0f;
      scales.data<float>()[n] = scale;
      for (int64_t k = 0; k < K; ++k)
        qweight.data<int8_t>()[int8_linear::packed_offset(n, k, N, K)] =
            int8_linear::quantise(static_cast<float>(w[n * K + k]), scale);
    }
  });
  if (bias.defined()) {
    opforge::visit_dtype<opforge::floating>(bias.dtype(), [&]<class B>(opforge::type_tag<B>) {
      for (int64_t n = 0; n < N; ++n) bias_fp32.data<float>()[n] = static_cast<float>(bias.data<B>()[n]);
    });
  }
}

// int8_linear.cu
void int8_linear_pack_cuda(const opforge::Context& ctx, opforge::Tensor weight, opforge::Tensor bias,
                           opforge::MutableTensor qweight, opforge::MutableTensor scales,
                           opforge::MutableTensor bias_fp32);

OPFORGE_OP(examples, int8_linear_pack)
    .doc(
        "Int8Linear's constructor: weight [N, K] as int8 per output channel (qweight, packed for the kernels; "
        "scales [N] float32) and bias [N] as float32")
    .input("weight", opforge::floating, opforge::rank(2))
    .input("bias", opforge::floating, opforge::shape({opforge::dim("weight", 0)}), opforge::optional)
    .output("qweight", opforge::like("weight").with_dtype(opforge::kInt8))
    .output("scales", opforge::shape({opforge::dim("weight", 0)}), opforge::kFloat32)
    .output("bias_fp32", opforge::like("bias").with_dtype(opforge::kFloat32))
    .reference(int8_linear_pack_cpu)
    .cuda(int8_linear_pack_cuda);

// CPU reference, accumulated in double: y[m, n] = sum_k x[m, k] * w[n, k] + bias[n], where
// w = T(int8_linear::dequantise(q, scale)): the weight dequantised in float32 and rounded to x's
// dtype once, as the cuBLAS path multiplies it (the small-batch kernel: int8_linear.h). Each weight
// row is dequantised once, then used for every row of x.
static void int8_linear_cpu(opforge::Tensor x, opforge::Tensor qweight, opforge::Tensor scales,
                            opforge::Tensor bias_fp32, opforge::MutableTensor y) {
  const int64_t N = qweight.size(0), K = qweight.size(1), M = N ? y.numel() / N : 0;  // K == 0: y = bias
  const int8_t* q = qweight.data<int8_t>();
  std::vector<double> row_w(K);
  constexpr auto kActivations = opforge::kFloat16 | opforge::kBFloat16 | opforge::kFloat32;
  opforge::visit_dtype<kActivations>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    for (int64_t n = 0; n < N; ++n) {
      const float scale = scales.data<float>()[n];
      for (int64_t k = 0; k < K; ++k)
        row_w[k] = double(T(int8_linear::dequantise(q[int8_linear::packed_offset(n, k, N, K)], scale)));
      const double bias = bias_fp32.defined() ? bias_fp32.data<float>()[n] : 0.0;
      for (int64_t m = 0; m < M; ++m) {
        const T* row = x.data<T>() + m * K;
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += double(row[k]) * row_w[k];
        y.data<T>()[m * N + n] = T(acc + bias);
      }
    }
  });
}

// int8_linear.cu
void int8_linear_cuda(const opforge::Context& ctx, opforge::Tensor x, opforge::Tensor qweight, opforge::Tensor scales,
                      opforge::Tensor bias_fp32, opforge::MutableTensor y);

OPFORGE_OP(examples, int8_linear)
    .doc("Int8Linear.forward: x [*, K] @ (qweight * scales)^T + bias_fp32, accumulated in float32, in x's dtype")
    .input("x", opforge::kFloat16 | opforge::kBFloat16 | opforge::kFloat32,
           opforge::shape({opforge::leading_dims, opforge::dim("qweight", 1)}))  // a wrong K names x
    .input("qweight", opforge::kInt8, opforge::rank(2))
    .input("scales", opforge::kFloat32, opforge::shape({opforge::dim("qweight", 0)}))
    .input("bias_fp32", opforge::kFloat32, opforge::shape({opforge::dim("qweight", 0)}), opforge::optional)
    .output("y", opforge::like("x").with_dim(-1, opforge::dim("qweight", 0)))
    .reference(int8_linear_cpu)
    .cuda(int8_linear_cuda);

OPFORGE_CLASS(examples, Int8Linear)
    .doc(
        "A linear layer with int8 weights per output channel, built from a float weight [N, K] and bias [N]: "
        "forward(x [*, K]) -> [*, N] in x's dtype")
    .constructor("int8_linear_pack")
    .method("forward", "int8_linear");
