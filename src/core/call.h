// The call protocol: the one driver every adapter runs a call of an op through, so that each
// per-call rule is written once and holds in every adapter.
//
// Note [The call protocol]
// ------------------------
// run_call() owns the order of a call's steps; an adapter supplies only what its framework
// owns (CallHooks: memory for outputs, dense copies of inputs, a fill, the kernel's context):
//   1. check    the arguments against the declaration and evaluate the output rules (check.h);
//               any problem is the call's error, before anything is allocated;
//   2. plan     each output's memory: CallHooks::output (fresh memory, or the caller's out=
//               tensor resized by the framework's rules), and for an out= tensor the kernel
//               cannot write as it is (not dense, or misaligned) a dense temporary;
//   3. refuse   written arguments (mutated inputs and out= tensors) that a kernel cannot write
//               safely: a mutated input whose layout would need a copy, a written view whose
//               own elements overlap, and one that shares memory with any other argument
//               (Note [Memory overlap]); every refusal of the call in one message;
//   4. skip     the launch when every output is empty (an op without outputs always runs);
//   5. poison   the outputs when poisoning is on (poison_mode(): opforge verify, or
//               OPFORGE_POISON_OUTPUTS=1 for eager debugging), so an element no kernel writes
//               shows up as NaN (or a marker value) instead of stale memory;
//   6. admit    each input by its layout rule: as it is, or as a dense copy (CallHooks::dense_copy);
//   7. domains  value domains (Note [Value domains] in opforge/op.h): read on the host for a
//               host call, checked on the device by a check kernel launched before the op's
//               kernel for a device call (Note [Device value checks] in device_checks.h);
//   8. launch   the kernel on CallHooks::context (device, stream, scratch allocator);
//   9. finish   copy each out= temporary into the caller's tensor (CallHooks::copy_back).
// A new per-call rule is a step (or a part of one) here, never an adapter's own code; a test
// runs the same call through every adapter and expects the same words
// (tests/python/test_adapter_parity.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
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

/// Which poison outputs get before a kernel runs (step 5 of Note [The call protocol]): 0 none,
/// 1 the primary pattern, 2 the alternate one. A byte repeated over the output's memory:
///   primary:   0xff for floating types (NaN in float16, bfloat16, float32 and float64), 0x7f
///              for float8_e4m3fn and float8_e5m2 and 0xff for float8_e8m0fnu (NaN in each), 0x7b
///              for integers (123 in 8 bits), 0x01 for bool (true);
///   alternate: 0x5a for floating, float8 and integer types (finite: 1.5e16 in float32, 203.25 in
///              float16, 20 in float8_e4m3fn, 192 in float8_e5m2), 0x00 for bool (false).
/// Two runs with different patterns catch an unwritten element whose correct value happens to
/// equal one pattern. The mode starts from the environment variable OPFORGE_POISON_OUTPUTS
/// (unset or 0: off).
int32_t poison_mode();
void set_poison_mode(int32_t mode);

/// The byte that poisons an output of `dtype` (OpforgeDtype) in `mode` (1 or 2).
uint8_t poison_byte(int32_t dtype, int32_t mode);

/// What an adapter supplies to run_call: everything that needs its framework. Index `k` names
/// an output, `arg` an argument, in declaration order.
class CallHooks {
 public:
  /// Memory for output `k` (`dtype`: an OpforgeDtype, `sizes`: its shape) on the call's device:
  /// a fresh dense tensor, or for an out= call the caller's tensor resized by the framework's
  /// rules (its view as it then is). May throw the framework's error for an out= tensor it
  /// cannot resize.
  virtual OpforgeTensor output(int32_t k, int32_t dtype, Span<const int64_t> sizes) = 0;
  /// out= calls: a fresh dense tensor shaped as output k's, which the kernel writes instead of
  /// the caller's tensor (which it cannot write as it is); kept alive until the call returns.
  virtual OpforgeTensor temporary(int32_t k) = 0;
  /// out= calls: copies temporary `k` into the caller's tensor, after the kernel.
  virtual void copy_back(int32_t k) = 0;
  /// A dense, row-major copy of input `arg` whose data pointer is a multiple of 16 bytes, kept
  /// alive until the call returns (the adapter may refuse: InternalError where its framework
  /// never passes such a view).
  virtual OpforgeTensor dense_copy(int32_t arg) = 0;
  /// Sets every byte of `t` (a dense output or temporary the hooks made) to `byte`, ordered
  /// before the kernel (on the call's stream for a device).
  virtual void fill(const OpforgeTensor& t, uint8_t byte) = 0;
  /// The kernel's context: device, stream (the framework's current one), scratch allocator.
  virtual OpforgeContext context() = 0;

 protected:
  ~CallHooks() = default;
};

/// One call as the adapter translated it.
struct Call {
  const OpforgeOpSpec& op;
  /// The kernel of the call's device (device_kernel()); null where the op has none.
  const OpforgeKernel* kernel;
  /// Per argument, for the checks (check.h).
  Span<const ArgInfo<int64_t>> info;
  /// Per argument: the tensor's view (absent_tensor() for an optional input left out) and the
  /// parameter's value. Views replaced by dense copies are updated in place.
  Span<OpforgeArg> args;
  /// An out= call: the caller's out tensors, one per output (for the checks); empty otherwise.
  Span<const ArgInfo<int64_t>> given_outputs;
  bool out_overload = false;
  /// The call's device (OpforgeDeviceType and index, -1 for none): the device of its tensors.
  int32_t device_type = OPFORGE_DEVICE_CPU;
  int32_t device_index = -1;
};

/// Runs `call` (Note [The call protocol]) and leaves in `outputs` (one slot per output of the
/// op) the view each output has after the call: what CallHooks::output gave (absent_tensor()
/// for an output that exists only with an optional input the call left out). Returns false
/// where the launch was skipped (every output empty). Throws InvalidArgument with the call's
/// message (the op's schema, one line per problem) for the caller's faults, InternalError
/// (naming the op and device) for a kernel's failure or an op without a kernel for the device.
bool run_call(const Call& call, CallHooks& hooks, Span<OpforgeTensor> outputs);

}  // namespace opforge::core
