// silu_and_mul: y = silu(x[..., :d]) * x[..., d:] with d = x.size(-1) / 2, the activation of a
// gated MLP (SwiGLU: Shazeer, "GLU Variants Improve Transformer", 2020; vLLM's silu_and_mul),
// which reads the gate and up projections from one fused matmul's output; and vLLM's out-first form
// silu_and_mul(Tensor(a!) out, Tensor input) -> (), ported with its signature as
// examples::silu_and_mul_out beside the functional op its users call (the out-first op writes a
// buffer the caller passes, as vLLM's model code does).
#include <opforge/op.h>

#include <algorithm>
#include <cmath>

// CPU reference, in double: silu(v) = v / (1 + exp(-v)).
static void silu_and_mul_cpu(opforge::Tensor x, opforge::MutableTensor y) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t d = y.ndim() ? y.size(-1) : 1, rows = d ? y.numel() / d : 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < d; ++c) {
        const double g = double(x.data<T>()[r * 2 * d + c]), u = double(x.data<T>()[r * 2 * d + d + c]);
        y.data<T>()[r * d + c] = T(g / (1.0 + std::exp(-g)) * u);
      }
  });
}

// One thread per 16-byte vector of y (the kernel takes a scalar path where d is not a whole
// number of vectors); after the pointers the kernel gets y's element count and d.
static opforge::LaunchConfig silu_and_mul_grid(opforge::Tensor x, opforge::MutableTensor y) {
  opforge::LaunchConfig cfg;
  const int64_t width = 16 / static_cast<int64_t>(opforge::dtype_size(x.dtype()));
  const int64_t n = y.numel(), threads = (n + width - 1) / width;
  cfg.block[0] = 256;
  cfg.grid[0] = static_cast<unsigned>(std::max<int64_t>(1, (threads + 255) / 256));
  cfg.args = {n, y.size(-1)};
  return cfg;
}

// The out-first op's reference and grid are the functional op's, with the written buffer first.
static void silu_and_mul_out_cpu(opforge::MutableTensor out, opforge::Tensor input) { silu_and_mul_cpu(input, out); }

static opforge::LaunchConfig silu_and_mul_out_grid(opforge::MutableTensor out, opforge::Tensor input) {
  return silu_and_mul_grid(input, out);
}

OPFORGE_OP(examples, silu_and_mul)
    .doc("silu(x[..., :d]) * x[..., d:], d = x.size(-1) / 2")
    .input("x", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16, opforge::min_rank(1))
    .require(opforge::dim("x", -1) % 2 == 0)
    .output("y", opforge::like("x").with_dim(-1, opforge::dim("x", -1) / 2))
    .equivalent("torch.nn.functional.silu(x[..., : x.shape[-1] // 2]) * x[..., x.shape[-1] // 2 :]")
    .sharding(opforge::Sharding::kRowwise)
    .reference(silu_and_mul_cpu)
    .cuda_source("silu_and_mul.cu", "silu_and_mul<{T}>")
    .launch_grid(silu_and_mul_grid);

OPFORGE_OP(examples, silu_and_mul_out)
    .doc("out = silu(input[..., :d]) * input[..., d:], d = out.size(-1), in place (vLLM's silu_and_mul)")
    .input("out", opforge::same_dtype("input"), opforge::mutated,
           opforge::shape({opforge::leading_dims_of("input"), opforge::dim("input", -1) / 2}))
    .input("input", opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16,
           opforge::shape({opforge::leading_dims, opforge::multiple_of(2)}))
    .equivalent("torch.nn.functional.silu(input[..., : input.shape[-1] // 2]) * input[..., input.shape[-1] // 2 :]")
    .reference(silu_and_mul_out_cpu)
    .cuda_source("silu_and_mul.cu", "silu_and_mul_out<{T}>")
    .launch_grid(silu_and_mul_out_grid);
