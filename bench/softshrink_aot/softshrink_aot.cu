// Launches the run-time softshrink kernel source, compiled here by nvcc, with the grid that
// opforge::elementwise("y").bytes_per_thread(16) computes for it.
#include <opforge/cuda.h>

#include "../../examples/ops/softshrink/kernels/softshrink.cu"

void softshrink_aot_cuda(const opforge::Context& ctx, opforge::Tensor x, double lambd, opforge::MutableTensor y) {
  opforge::cuda::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t n = x.numel(), per_block = 256 * (16 / sizeof(T));
    softshrink<T>
        <<<(n + per_block - 1) / per_block, 256, 0, opforge::cuda::stream(ctx)>>>(x.data<T>(), y.data<T>(), n, lambd);
  });
  opforge::cuda::check_launch("softshrink");
}
