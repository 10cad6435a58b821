// The Autograd kernel of ops that name a backward op (Note [Autograd kernel]).
#pragma once

#include <torch/library.h>

#include "../core/backward.h"
#include "opforge/c_api.h"

namespace opforge::torch {

/// The boxed Autograd kernel of `op`, whose backward op is matched by `plan`.
::torch::CppFunction make_autograd_kernel(const OpforgeOpSpec& op, core::BackwardPlan plan);

}  // namespace opforge::torch
