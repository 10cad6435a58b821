// The kernel an op with an autocast policy gets at the AutocastCPU and AutocastCUDA dispatch keys.
#pragma once

#include <c10/core/DeviceType.h>
#include <torch/library.h>

#include "opforge/c_api.h"

namespace opforge::torch {

/// A boxed kernel for `op` at the Autocast key of `device` (CPU or CUDA): casts the op's floating
/// tensor inputs on that device (not mutated ones) as its policy says (opforge::Autocast:
/// float32, the autocast dtype at::autocast::get_autocast_dtype(device), or the widest among
/// them, by at::promote_types), through at::autocast::cached_cast (so a float32 weight is cast
/// once per autocast region, as for torch's ops), then calls the op again with autocast
/// excluded, as torch's own autocast wrappers do (aten/src/ATen/autocast_mode.h).
::torch::CppFunction make_autocast_kernel(const OpforgeOpSpec& op, c10::DeviceType device);

}  // namespace opforge::torch
