// fused_add_rms_norm's backward on CUDA: rms_norm's backward kernel over the residual stream,
// with the gradient that reached the residual added (residual = x + residual feeds both).
#include "../rms_norm/rms_norm_backward.cuh"

void fused_add_rms_norm_backward_cuda(const opforge::Context& ctx, opforge::Tensor grad_x_out,
                                      opforge::Tensor grad_residual_out, opforge::Tensor residual_out,
                                      opforge::Tensor weight, double eps, opforge::MutableTensor grad_x_and_residual,
                                      opforge::MutableTensor grad_weight) {
  opforge::cuda::visit_dtype<opforge::floating>(residual_out.dtype(), [&]<class T>(opforge::type_tag<T>) {
    rms_norm_backward::launch<T, T>(ctx, grad_x_out, residual_out, weight, eps, grad_x_and_residual, grad_weight,
                                    grad_residual_out.data<T>());
  });
}
