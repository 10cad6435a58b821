// The boxed kernel every op gets at the CPU, CUDA and Meta dispatch keys.
#pragma once

#include <torch/library.h>

#include <functional>

#include "opforge/c_api.h"

namespace opforge::torch {

/// Which dispatch key a kernel serves: CPU runs the reference, CUDA a device kernel, Meta only
/// the shape rules (symbolically, over c10::SymInt). kFake is the Meta kernel of an op's fake
/// companion (core::fake_companion_schema): the shape rules with the data-dependent sizes the
/// caller gives as its last argument.
enum class Mode { kCpu, kCuda, kMeta, kFake };

/// The kernel of `op` that `mode` runs: the reference (the first kernel) for kCpu, the first
/// CUDA kernel after it for kCuda; null for kMeta and kFake, and where the op has none.
const OpforgeKernel* kernel_for(const OpforgeOpSpec& op, Mode mode);

/// A boxed kernel for `op` at one dispatch key (`kernel` is null for kMeta), or with `out` for
/// its out= overload (core::out_schema: the outputs are the caller's tensors, checked, resized by
/// torch's resize_output rules, written and returned). Calls from Python and from AOTInductor's
/// proxy executor arrive boxed, so one boxed functor serves every op.
::torch::CppFunction make_kernel(const OpforgeOpSpec& op, Mode mode, const OpforgeKernel* kernel, bool out = false);

/// make_kernel's kernel (not an out= overload) as a plain callable on a boxed stack, for callers
/// that go around the dispatcher: AOTInductor's C shims (aoti_shims.cpp).
std::function<void(::torch::jit::Stack*)> make_boxed_run(const OpforgeOpSpec& op, Mode mode,
                                                         const OpforgeKernel* kernel);

}  // namespace opforge::torch
