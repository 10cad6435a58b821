// rms_norm_backward on CUDA: the kernel of rms_norm_backward.cuh.
#include "rms_norm_backward.cuh"

void rms_norm_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_y, opforge::Tensor x,
                            opforge::Tensor weight, double eps, opforge::MutableTensor grad_x,
                            opforge::MutableTensor grad_weight) {
  opforge::cuda::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
    if (weight.dtype() == x.dtype()) {
      rms_norm_backward::launch<T, T>(ctx, grad_y, x, weight, eps, grad_x, grad_weight);
    } else {  // the float32 weight beside a lower-precision x (the op's dtype rule allows no other)
      rms_norm_backward::launch<T, float>(ctx, grad_y, x, weight, eps, grad_x, grad_weight);
    }
  });
}
