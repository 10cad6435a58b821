// Liger-Kernel's RMSNorm, SwiGLU and softmax: its Triton kernels (kernels/*.py, as they came from
// linkedin/Liger-Kernel 0.8.5, PROVENANCE.md) as opforge ops. The grid functions pass what
// upstream's Python launchers pass; the CPU references are plain loops in double.
#include <opforge/op.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

using opforge::MutableTensor;
using opforge::Tensor;

// The dtypes Liger's kernels take (the references also take float64, for gradcheck).
constexpr opforge::DtypeSet kLigerDtypes = opforge::kFloat32 | opforge::kFloat16 | opforge::kBFloat16;

// Upstream's calculate_settings (liger_kernel/ops/utils.py): a block of the row's width rounded up
// to a power of two, one program per row, and warps by block size.
static opforge::TritonLaunch liger_rows(int64_t rows, int64_t cols) {
  opforge::TritonLaunch cfg;
  int64_t block = 1;
  while (block < cols) block *= 2;
  cfg.grid[0] = rows;
  cfg.num_warps = block >= 32768 ? 32 : block >= 8192 ? 16 : block >= 2048 ? 8 : 4;
  cfg.constant("BLOCK_SIZE", block);
  return cfg;
}

static int64_t rows_of(const Tensor& t) {
  const int64_t cols = t.ndim() ? t.size(-1) : 1;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.ndim(); ++d) rows *= t.size(d);
  return cols ? t.numel() / cols : rows;
}

// upstream's casting modes: "llama" (only rstd in float32) and "gemma" (everything in float32).
static int casting_mode_value(std::string_view mode) { return mode == "gemma" ? 1 : 0; }

// y = x * rstd * (offset + weight), rstd = 1 / sqrt(mean(x^2 over the last dim) + eps) per row.
static void rms_norm_cpu(Tensor x, Tensor weight, double eps, double offset, std::string_view, MutableTensor y,
                         MutableTensor rstd) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    opforge::visit_dtype<opforge::floating>(weight.dtype(), [&]<class W>(opforge::type_tag<W>) {
      const int64_t cols = x.size(-1);
      for (int64_t r = 0; r < rstd.numel(); ++r) {
        const T* in = x.data<T>() + r * cols;
        double sumsq = 0;
        for (int64_t c = 0; c < cols; ++c) sumsq += double(in[c]) * double(in[c]);
        const double s = 1.0 / std::sqrt(sumsq / double(cols) + eps);
        rstd.data<float>()[r] = float(s);
        for (int64_t c = 0; c < cols; ++c)
          y.data<T>()[r * cols + c] = T(double(in[c]) * s * (offset + double(weight.data<W>()[c])));
      }
    });
  });
}

static opforge::TritonLaunch rms_norm_grid(Tensor x, Tensor weight, double, double, std::string_view casting_mode,
                                           MutableTensor y, MutableTensor rstd) {
  const int64_t cols = x.size(-1);
  opforge::TritonLaunch cfg = liger_rows(rstd.numel(), cols);
  cfg.tensor("W_ptr", weight).set("Y_row_stride", cols).set("X_row_stride", cols).set("W_row_stride", 1);
  cfg.set("RSTD_row_stride", 1).set("n_cols", cols).constant("elementwise_affine", true);
  cfg.constant("casting_mode", casting_mode_value(casting_mode));
  return cfg;
}

OPFORGE_OP(examples, liger_rms_norm)
    .doc("Liger-Kernel's RMSNorm: x * rstd * (offset + weight) and rstd = 1 / sqrt(mean(x^2, -1) + eps)")
    .input("x", opforge::floating, opforge::shape({opforge::leading_dims, opforge::any}))
    .input("weight", opforge::same_dtype("x") | opforge::kFloat32, opforge::shape({opforge::dim("x", -1)}))
    .param<double>("eps", 1e-6, opforge::at_least(0.0))
    .param<double>("offset", 0.0)
    .param<std::string>("casting_mode", "llama", opforge::one_of({"llama", "gemma"}), opforge::compile_time)
    .output("y", opforge::like("x"))
    .output("rstd", opforge::like("x").with_dim(-1, 1).with_dtype(opforge::kFloat32))
    .require(opforge::dim("x", -1) <= 65536)
    .equivalent(
        "(lambda r: (x * r * (offset + weight), r.float()))(torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))")
    .backward("liger_rms_norm_backward")
    .reference(rms_norm_cpu)
    .triton_source("rms_norm.py", "_rms_norm_forward_kernel")
    .launch_grid(rms_norm_grid)
    .kernel_dtypes("x", kLigerDtypes);

// rstd holds one value per row of x (the forward's output), checked before anything reads it.
static int64_t rstd_rows(const Tensor& x, const Tensor& rstd) {
  OPFORGE_CHECK(rstd.numel() == rows_of(x), "rstd: expected ", rows_of(x), " values (one per row of x), got ",
                rstd.numel());
  return rstd.numel();
}

// With m = grad_y * (offset + weight) per row: grad_x = rstd * (m - x * rstd^2 * mean(m * x)), and
// grad_weight = the sum over rows of grad_y * x * rstd (the derivative of y = x * rstd * (offset + weight)).
static void rms_norm_backward_cpu(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd, double offset, std::string_view,
                                  MutableTensor grad_x, MutableTensor grad_weight) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    opforge::visit_dtype<opforge::floating>(weight.dtype(), [&]<class W>(opforge::type_tag<W>) {
      const int64_t cols = x.size(-1), rows = rstd_rows(x, rstd);
      std::vector<double> gw(static_cast<size_t>(cols), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const T* in = x.data<T>() + r * cols;
        const T* g = grad_y.data<T>() + r * cols;
        const double s = rstd.data<float>()[r];
        double dot = 0;
        for (int64_t c = 0; c < cols; ++c) dot += double(g[c]) * (offset + double(weight.data<W>()[c])) * double(in[c]);
        for (int64_t c = 0; c < cols; ++c) {
          const double m = double(g[c]) * (offset + double(weight.data<W>()[c]));
          grad_x.data<T>()[r * cols + c] = T(s * (m - double(in[c]) * s * s * dot / double(cols)));
          gw[c] += double(g[c]) * double(in[c]) * s;
        }
      }
      for (int64_t c = 0; c < cols; ++c) grad_weight.data<W>()[c] = W(gw[c]);
    });
  });
}

// Programs take runs of rows, each writing one float32 row of dW partials that opforge sums into
// grad_weight. Upstream launches one per multiprocessor; a grid function sees no device, so at
// most 264 (two per multiprocessor of an H100 or H200), and at least one (it writes zeros).
static opforge::TritonLaunch rms_norm_backward_grid(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd, double,
                                                    std::string_view casting_mode, MutableTensor grad_x,
                                                    MutableTensor grad_weight) {
  const int64_t cols = x.size(-1), rows = rstd_rows(x, rstd);
  const int64_t programs = std::clamp<int64_t>(rows, 1, 264), per_program = (rows + programs - 1) / programs;
  opforge::TritonLaunch cfg = liger_rows(programs, cols);
  cfg.tensor("dY_ptr", grad_y).tensor("dX_ptr", grad_x).tensor("W_ptr", weight);
  cfg.sum_into("dW_ptr", grad_weight, programs);
  cfg.set("dY_row_stride", cols).set("dX_row_stride", cols).set("X_row_stride", cols).set("W_row_stride", 1);
  cfg.set("RSTD_row_stride", 1).set("dW_row_stride", cols).set("n_rows", rows).set("n_cols", cols);
  cfg.set("rows_per_program", per_program).constant("X_dtype", x.dtype()).constant("elementwise_affine", true);
  cfg.constant("casting_mode", casting_mode_value(casting_mode));
  return cfg;
}

OPFORGE_OP(examples, liger_rms_norm_backward)
    .doc("liger_rms_norm's gradients from its saved rstd: grad_x, and grad_weight summed over rows in float32")
    .input("grad_y", opforge::floating, opforge::shape({opforge::leading_dims, opforge::any}))
    .input("x", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .input("weight", opforge::same_dtype("grad_y") | opforge::kFloat32, opforge::shape({opforge::dim("x", -1)}))
    .input("rstd", opforge::kFloat32, opforge::shape({opforge::leading_dims_of("grad_y"), 1}))
    .param<double>("offset", 0.0)
    .param<std::string>("casting_mode", "llama", opforge::one_of({"llama", "gemma"}), opforge::compile_time)
    .output("grad_x", opforge::like("x"))
    .output("grad_weight", opforge::like("weight"))
    .require(opforge::dim("x", -1) <= 65536)
    .equivalent(
        "(lambda m: ((rstd * (m - x * rstd ** 2 * (m * x).mean(-1, keepdim=True))).to(x.dtype), (grad_y * x * rstd)"
        ".reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)))(grad_y * (offset + weight))")
    .reference(rms_norm_backward_cpu)
    .triton_source("rms_norm.py", "_rms_norm_backward_kernel")
    .launch_grid(rms_norm_backward_grid)
    .kernel_dtypes("grad_y", kLigerDtypes)
    // Under the llama casting mode Liger's kernel rounds x * rstd to the input dtype before each
    // product of grad_weight's sum over rows, where the equivalent rounds grad_y * x instead: one
    // rounding per term in each, at different places, in a sum that can cancel below the dtype's
    // tolerance. Held to 8 x the equivalent's error (the largest of two such errors over a case's
    // elements differ by several times).
    .tolerance_vs_equivalent(8.0);

// c = silu(a * gate_multiplier) * b, silu(v) = v / (1 + e^-v).
static void swiglu_cpu(Tensor a, Tensor b, double gate_multiplier, MutableTensor c) {
  opforge::visit_dtype<opforge::floating>(a.dtype(), [&]<class T>(opforge::type_tag<T>) {
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double g = double(a.data<T>()[i]) * gate_multiplier;
      c.data<T>()[i] = T(g / (1.0 + std::exp(-g)) * double(b.data<T>()[i]));
    }
  });
}

// n_cols is a tl.constexpr of upstream's kernels: each row width compiles its own kernel.
static opforge::TritonLaunch swiglu_grid(Tensor a, Tensor, double, MutableTensor) {
  opforge::TritonLaunch cfg = liger_rows(rows_of(a), a.size(-1));
  cfg.set("stride", a.size(-1)).constant("n_cols", a.size(-1));
  return cfg;
}

OPFORGE_OP(examples, liger_swiglu)
    .doc("Liger-Kernel's SwiGLU activation: silu(a * gate_multiplier) * b, silu in float32")
    .input("a", opforge::floating, opforge::min_rank(1))
    .input("b", opforge::same_dtype("a"), opforge::same_shape("a"))
    .param<double>("gate_multiplier", 1.0)
    .output("c", opforge::like("a"))
    .require(opforge::dim("a", -1) <= 65536)
    .equivalent("torch.nn.functional.silu(a * gate_multiplier) * b")
    .backward("liger_swiglu_backward")
    .reference(swiglu_cpu)
    .triton_source("swiglu.py", "_swiglu_forward_kernel")
    .launch_grid(swiglu_grid)
    .kernel_dtypes("a", kLigerDtypes);

// With v = a * gate_multiplier and s = sigmoid(v): grad_b = grad_c * v * s, and
// grad_a = grad_c * (v * s * (1 - s) + s) * b * gate_multiplier.
static void swiglu_backward_cpu(Tensor grad_c, Tensor a, Tensor b, double gate_multiplier, MutableTensor grad_a,
                                MutableTensor grad_b) {
  opforge::visit_dtype<opforge::floating>(a.dtype(), [&]<class T>(opforge::type_tag<T>) {
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double v = double(a.data<T>()[i]) * gate_multiplier, s = 1.0 / (1.0 + std::exp(-v));
      const double g = double(grad_c.data<T>()[i]), up = double(b.data<T>()[i]);
      grad_b.data<T>()[i] = T(g * v * s);
      grad_a.data<T>()[i] = T(g * (v * s * (1.0 - s) + s) * up * gate_multiplier);
    }
  });
}

// Upstream's backward kernel reads a and b and writes their gradients over them: it gets grad_a
// and grad_b, holding copies of a and b, as a_ptr and b_ptr, so the op writes none of its inputs.
static opforge::TritonLaunch swiglu_backward_grid(Tensor grad_c, Tensor a, Tensor b, double, MutableTensor grad_a,
                                                  MutableTensor grad_b) {
  opforge::TritonLaunch cfg = liger_rows(rows_of(a), a.size(-1));
  cfg.copy(a, grad_a).copy(b, grad_b).tensor("a_ptr", grad_a).tensor("b_ptr", grad_b).tensor("dc_ptr", grad_c);
  cfg.set("stride", a.size(-1)).constant("n_cols", a.size(-1));
  return cfg;
}

OPFORGE_OP(examples, liger_swiglu_backward)
    .doc("liger_swiglu's gradients grad_a and grad_b")
    .input("grad_c", opforge::floating, opforge::min_rank(1))
    .input("a", opforge::same_dtype("grad_c"), opforge::same_shape("grad_c"))
    .input("b", opforge::same_dtype("grad_c"), opforge::same_shape("grad_c"))
    .param<double>("gate_multiplier", 1.0)
    .output("grad_a", opforge::like("a"))
    .output("grad_b", opforge::like("b"))
    .require(opforge::dim("a", -1) <= 65536)
    .equivalent("torch.func.vjp(lambda a, b: torch.nn.functional.silu(a * gate_multiplier) * b, a, b)[1](grad_c)")
    .reference(swiglu_backward_cpu)
    .triton_source("swiglu.py", "_swiglu_backward_kernel")
    .launch_grid(swiglu_backward_grid)
    .kernel_dtypes("grad_c", kLigerDtypes);

// y = e^(x - max) / sum(e^(x - max)) over the last dim.
static void softmax_cpu(Tensor x, MutableTensor y) {
  opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t cols = x.size(-1);
    for (int64_t r = 0; r < rows_of(x) && cols > 0; ++r) {
      const T* in = x.data<T>() + r * cols;
      double top = -INFINITY, total = 0;
      for (int64_t c = 0; c < cols; ++c) top = std::fmax(top, double(in[c]));
      for (int64_t c = 0; c < cols; ++c) total += std::exp(double(in[c]) - top);
      for (int64_t c = 0; c < cols; ++c) y.data<T>()[r * cols + c] = T(std::exp(double(in[c]) - top) / total);
    }
  });
}

static opforge::TritonLaunch softmax_grid(Tensor x, MutableTensor) {
  opforge::TritonLaunch cfg = liger_rows(rows_of(x), x.size(-1));
  cfg.set("Y_row_stride", x.size(-1)).set("X_row_stride", x.size(-1)).set("n_cols", x.size(-1));
  return cfg;
}

OPFORGE_OP(examples, liger_softmax)
    .doc("Liger-Kernel's softmax over the last dim, in float32")
    .input("x", opforge::floating, opforge::min_rank(1))
    .output("y", opforge::like("x"))
    .require(opforge::dim("x", -1) <= 65536)
    .equivalent("torch.softmax(x, -1)")
    .autocast(opforge::Autocast::kFloat32)
    .backward("liger_softmax_backward")
    .reference(softmax_cpu)
    .triton_source("softmax.py", "_softmax_single_block_forward_kernel")
    .launch_grid(softmax_grid)
    .kernel_dtypes("x", kLigerDtypes);

// grad_x = y * (grad_y - sum(grad_y * y over the last dim)).
static void softmax_backward_cpu(Tensor grad_y, Tensor y, MutableTensor grad_x) {
  opforge::visit_dtype<opforge::floating>(y.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t cols = y.size(-1);
    for (int64_t r = 0; r < rows_of(y) && cols > 0; ++r) {
      const T* g = grad_y.data<T>() + r * cols;
      const T* out = y.data<T>() + r * cols;
      double dot = 0;
      for (int64_t c = 0; c < cols; ++c) dot += double(g[c]) * double(out[c]);
      for (int64_t c = 0; c < cols; ++c) grad_x.data<T>()[r * cols + c] = T(double(out[c]) * (double(g[c]) - dot));
    }
  });
}

static opforge::TritonLaunch softmax_backward_grid(Tensor grad_y, Tensor y, MutableTensor grad_x) {
  const int64_t cols = y.size(-1);
  opforge::TritonLaunch cfg = liger_rows(rows_of(y), cols);
  cfg.tensor("dy_ptr", grad_y).tensor("dx_ptr", grad_x).set("dy_stride", cols).set("y_stride", cols);
  cfg.set("dx_stride", cols).set("n_cols", cols);
  return cfg;
}

OPFORGE_OP(examples, liger_softmax_backward)
    .doc("liger_softmax's gradient: y * (grad_y - sum(grad_y * y, -1))")
    .input("grad_y", opforge::floating, opforge::min_rank(1))
    .input("y", opforge::same_dtype("grad_y"), opforge::same_shape("grad_y"))
    .output("grad_x", opforge::like("y"))
    .require(opforge::dim("y", -1) <= 65536)
    .equivalent("y * (grad_y - (grad_y * y).sum(-1, keepdim=True))")
    .reference(softmax_backward_cpu)
    .triton_source("softmax.py", "_softmax_single_block_backward_kernel")
    .launch_grid(softmax_backward_grid)
    .kernel_dtypes("grad_y", kLigerDtypes)
    // Liger's kernel sums grad_y * y in the input dtype (Triton's tl.sum keeps a float's dtype), so
    // in 16-bit its dot carries a rounding per level of the reduction tree, up to log2(65536) = 16,
    // where the equivalent in torch rounds once (it sums in float32); grad_x = y * (grad_y - dot)
    // cancels, so that error can exceed the dtype's tolerance: held to 16 x the equivalent's error.
    .tolerance_vs_equivalent(16.0);
