// The softshrink op of examples/ops/softshrink as a hand-written torch extension, for
// bench/bench_build.py: the same CPU reference and its registration with TORCH_LIBRARY (schema,
// CPU kernel, Meta kernel), the least a torch.utils.cpp_extension user writes for one op.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

namespace {

at::Tensor softshrink_cpu(const at::Tensor& x, double lambd) {
  TORCH_CHECK(x.is_floating_point(), "softshrink: expected a floating-point x, got ", x.scalar_type());
  TORCH_CHECK(lambd >= 0, "softshrink: expected lambd >= 0, got ", lambd);
  at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "softshrink", [&] {
    const scalar_t* in = xc.data_ptr<scalar_t>();
    scalar_t* out = y.data_ptr<scalar_t>();
    for (int64_t i = 0, n = xc.numel(); i < n; ++i) {
      const double v = static_cast<double>(in[i]);
      out[i] = scalar_t(std::isnan(v) ? v : v > lambd ? v - lambd : v < -lambd ? v + lambd : 0.0);
    }
  });
  return y;
}

at::Tensor softshrink_meta(const at::Tensor& x, double lambd) { return at::empty_like(x); }

}  // namespace

TORCH_LIBRARY(baseline, m) { m.def("softshrink(Tensor x, float lambd=0.5) -> Tensor"); }
TORCH_LIBRARY_IMPL(baseline, CPU, m) { m.impl("softshrink", &softshrink_cpu); }
TORCH_LIBRARY_IMPL(baseline, Meta, m) { m.impl("softshrink", &softshrink_meta); }
