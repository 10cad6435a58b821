// The call protocol: what every adapter does between checking a call (check.h) and returning
// its outputs, so that each rule is written once.
//
// For one call an adapter: checks the arguments and evaluates the output rules (check_call);
// allocates the outputs with its framework's allocator; builds the output views and returns
// early if skip_launch() says so; fills the outputs with poison if poison_outputs() is on;
// turns each input into a view, making the dense copy that admit() asks for; and calls
// call_kernel(), which raises the kernel's failure as an error naming the op.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/c_api.h"
#include "span.h"

namespace opforge::core {

/// How an input tensor reaches the kernel.
enum class Admission {
  kAsIs,       ///< its view as it is
  kDenseCopy,  ///< a dense, row-major copy whose data pointer is a multiple of 16 bytes
  kRefuse,     ///< not at all: a mutated input that would need a copy, or whose elements overlap
};

/// The layout rule of an input declared with `spec` (OpforgeLayout) applied to one call's view:
/// OPFORGE_LAYOUT_STRIDED passes any view as it is; OPFORGE_LAYOUT_CONTIGUOUS passes a dense,
/// row-major view whose data pointer is a multiple of 16 bytes as it is and copies any other;
/// OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM passes a view whose last dim has stride 1 and whose data
/// pointer and other strides are multiples of 16 bytes as it is (strides of size-1 dims never
/// move a pointer and are not looked at) and copies any other. `item_size` is the element's
/// size in bytes. A mutated input (Note [Mutated inputs] in opforge/op.h) is never copied: where
/// its layout would need a copy, or its elements overlap (a dim of size > 1 with stride 0), it
/// is refused.
Admission admit(const OpforgeTensorSpec& spec, const OpforgeTensor& view, int64_t item_size);

/// For a refused input (admit() == kRefuse), the line of the call's error: "name: expected
/// <the layout it needs> (it is written in place, so it cannot be copied), got shape [...]
/// with strides [...]" (and the data pointer's offset from 16 bytes where that is the fault).
std::string refusal(const OpforgeArgSpec& a, const OpforgeTensor& view, int64_t item_size);

/// One line per mutated input whose memory overlaps another tensor argument's ("residual:
/// shares memory with x; ..."), as ATen's assert_no_overlap: both views dense and their byte
/// ranges intersecting (two views that interleave without sharing an element are not dense and
/// pass; an in-place write into memory another argument reads would give a result that depends
/// on the kernel's order). `views[i]` is argument i's view (ignored for non-tensors; data null
/// or no elements: left out).
std::vector<std::string> overlap_refusals(const OpforgeOpSpec& op, Span<const OpforgeTensor> views);

/// The elements of integer inputs with a declared domain (Note [Value domains] in opforge/op.h)
/// that lie outside it, one line per input: "positions: expected values in [0,
/// cos_sin_cache.size(0)) = [0, 64), got 70 at [3]" (", or -1" for a marker; "distinct values"
/// for .unique_values(): "got 5 at [1] and [4]"). Reads the data, so only for host tensors.
std::vector<std::string> value_problems(const OpforgeOpSpec& op, Span<const OpforgeArg> args);

/// The view of an optional input the caller left out (see OpforgeTensor): on the call's device.
OpforgeTensor absent_tensor(int32_t device_type, int32_t device_index);

/// True if the launch is skipped: the op has outputs and every one is empty. An op whose
/// outputs are not all empty always runs its kernel, even if an input is empty (a sum over an
/// empty dim still writes its zeros).
bool skip_launch(Span<const OpforgeTensor> outputs);

/// Whether outputs are filled with poison before each kernel runs (NaN for floating types, 123
/// for integers, true for bool), so that an element a kernel never writes shows up as a
/// mismatch. opforge verify turns it on; adapters do the filling.
bool poison_outputs();
void set_poison_outputs(bool enabled);

/// The poison an output of `dtype` (OpforgeDtype) is filled with: NaN for floating types, 123
/// for integers, 1 (true) for bool.
double poison_value(int32_t dtype);

/// Fills each dense host tensor of `outputs` with its poison_value (absent ones are skipped):
/// for adapters whose framework has no fill of its own on the host.
void poison_host(Span<const OpforgeTensor> outputs);

/// The value of parameter `arg` when a framework passes none for it. AOTInductor's proxy
/// executor delivers an omitted empty list default (`int[] pads=[]`) as None; the declared
/// default applies. Throws opforge::InvalidArgument (invalid_arguments_message, "pads: expected
/// a value of type int[], got None") for a parameter without a default.
const OpforgeValue& default_value(const OpforgeOpSpec& op, int32_t arg);

/// Runs `kernel` of `op` on one call frame. Throws opforge::InvalidArgument for the kernel's
/// OPFORGE_CHECK ("ns::op: <message>") and opforge::InternalError for any other failure
/// ("ns::op (cuda kernel): <message>"): the op's name is added here and nowhere else.
void call_kernel(const OpforgeOpSpec& op, const OpforgeKernel& kernel, const OpforgeContext& ctx,
                 Span<const OpforgeArg> args, Span<const OpforgeTensor> outputs);

}  // namespace opforge::core
