// causal_conv1d_update: one decoding step of a Mamba block's depthwise causal convolution (vLLM's
// and mamba_ssm's causal_conv1d_update): each channel's state holds its last width - 1 inputs;
// y = sum(weight * [state, x]) (+ bias, then SiLU when asked) and the state shifts left by one,
// taking x. The states are the rows conv_state_indices names when it is given (a serving engine's
// cache of N sequences), else row b for batch entry b.
#include <opforge/op.h>

#include <algorithm>
#include <cmath>

// CPU reference, in double.
static void causal_conv1d_update_cpu(opforge::Tensor x, opforge::MutableTensor conv_state, opforge::Tensor weight,
                                     opforge::Tensor bias, bool silu_activation, opforge::Tensor conv_state_indices,
                                     opforge::MutableTensor y) {
  const int64_t batch = x.size(0), dim = x.size(1), width = weight.size(1);
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t row = conv_state_indices.defined() ? conv_state_indices.data<int32_t>()[b] : b;
      for (int64_t c = 0; c < dim; ++c) {
        T* state = conv_state.data<T>() + (row * dim + c) * (width - 1);
        const T* w = weight.data<T>() + c * width;
        const double in = double(x.data<T>()[b * dim + c]);
        double acc = (bias.defined() ? double(bias.data<T>()[c]) : 0.0) + double(w[width - 1]) * in;
        for (int64_t k = 0; k + 1 < width; ++k) acc += double(w[k]) * double(state[k]);
        for (int64_t k = 0; k + 2 < width; ++k) state[k] = state[k + 1];
        if (width > 1) state[width - 2] = T(in);
        y.data<T>()[b * dim + c] = T(silu_activation ? acc / (1.0 + std::exp(-acc)) : acc);
      }
    }
  });
}

// One thread per (batch entry, channel); after the pointers the kernel gets batch, dim and width.
static opforge::LaunchConfig causal_conv1d_update_grid(opforge::Tensor x, opforge::MutableTensor,
                                                       opforge::Tensor weight, opforge::Tensor, bool, opforge::Tensor,
                                                       opforge::MutableTensor) {
  opforge::LaunchConfig cfg;
  cfg.block[0] = 128;
  cfg.grid[0] = static_cast<unsigned>(std::max<int64_t>(1, (x.size(0) * x.size(1) + 127) / 128));
  cfg.args = {x.size(0), x.size(1), weight.size(1)};
  return cfg;
}

OPFORGE_OP(examples, causal_conv1d_update)
    .doc("y = conv(state ++ x) (+ bias, SiLU); the state, row conv_state_indices[b] or b, shifts in x, in place")
    .input("x", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16, opforge::rank(2))
    .input("conv_state", opforge::same_dtype("x"), opforge::mutated,
           opforge::shape({opforge::any, opforge::dim("x", 1), opforge::dim("weight", 1) - 1}))
    .input("weight", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", 1), opforge::any}))
    .input("bias", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", 1)}), opforge::optional)
    .param<bool>("silu_activation", false, opforge::compile_time)
    .input("conv_state_indices", opforge::kInt32, opforge::shape({opforge::dim("x", 0)}), opforge::optional,
           opforge::values_in(0, opforge::dim("conv_state", 0)).unique_values())
    // causal-conv1d's widths (Dao-AILab/causal-conv1d: "causal_conv1d only supports width between 2
    // and 4"); the kernel sums width products in float, well within float32's tolerance at these.
    .require(opforge::dim("weight", 1) >= 2)
    .require(opforge::dim("weight", 1) <= 4)
    .require(opforge::when_given("conv_state_indices", opforge::dim("conv_state", 0) >= opforge::dim("x", 0))
                 .otherwise(opforge::dim("conv_state", 0) == opforge::dim("x", 0)))
    .output("y", opforge::like("x"))
    .equivalent(
        "(lambda i: (lambda s: ((lambda o: o * torch.sigmoid(o) if silu_activation else o)((s * weight).sum(-1) + "
        "(0 if bias is None else bias)), conv_state.index_put((i,), s[..., 1:])))(torch.cat([conv_state[i], "
        "x[..., None]], -1)))(torch.arange(x.shape[0], device=x.device) if conv_state_indices is None else "
        "conv_state_indices.long())")
    .reference(causal_conv1d_update_cpu)
    .cuda_source("causal_conv1d_update.cu", "causal_conv1d_update<{T}, {silu_activation}>")
    .launch_grid(causal_conv1d_update_grid);
