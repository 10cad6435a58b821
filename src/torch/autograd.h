// The Autograd kernel of ops that name a backward op (Note [Autograd kernel]).
#pragma once

#include <torch/library.h>

#include "../core/backward.h"
#include "opforge/c_api.h"

namespace opforge::torch {

/// The boxed Autograd kernel of `op`, whose backward op is matched by `plan`.
::torch::CppFunction make_autograd_kernel(const OpforgeOpSpec& op, core::BackwardPlan plan);

/// The Autograd and ADInplaceOrView kernels of an overload that writes tensors it is given
/// (mutated inputs, out= tensors; the schema's write annotations say which): no derivative, as
/// torch's generated kernels for an op without a formula. See Note [Writers and autograd].
::torch::CppFunction make_writer_autograd_kernel();
::torch::CppFunction make_writer_inplace_kernel();

}  // namespace opforge::torch
