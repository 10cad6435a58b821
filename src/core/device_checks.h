// Value domains checked on the device (step 7 of Note [The call protocol] in call.h).
//
// Note [Device value checks]
// --------------------------
// An integer input with a declared value domain (Note [Value domains] in opforge/op.h) indexes
// another tensor; on a host call the core reads it before the reference runs. On a device, the
// values are in device memory, and reading them on the host would cost a synchronisation on every
// call and break CUDA graph capture. So the core launches one small check kernel on the call's
// stream, before the op's kernel, over every such input of the call:
//   - an element outside [low, high) (and not the declared marker) makes the check kernel print
//     "ns::op: name: expected values in [rule) = [low, high), got v at flat index i" and fail a
//     device-side assertion, as torch's index kernels do (CUDA_KERNEL_ASSERT). The context is
//     then in error: the op's kernel, queued behind the check, never runs, so a bad index is
//     never dereferenced, and the caller's next synchronisation raises "device-side assert
//     triggered". An error flag read at the next synchronisation (torch._assert_async) was the
//     alternative, but it lets the op's kernel run with the bad index first: it would read or
//     write outside its tensor.
//   - the check needs no host synchronisation and no allocation (its parameters travel by value
//     with the launch), so it is safe inside CUDA graphs, where it runs on every replay.
//   - distinct values (.unique_values()) are checked on host calls only: a duplicate does not
//     reach outside a tensor.
//   - its cost is one extra launch per call (bench/RESULTS.md has it for the serving ops). A
//     kernel declared .waits_for_value_checks() (opforge/op_builder.h) calls
//     opforge::kernel::wait_for_value_checks() before it touches memory through a checked
//     index; on sm_90 or newer the core then launches it as the check's programmatic dependent
//     (OpforgeContext::after_value_check): it starts while the check runs and loads what it
//     needs, and its wait returns only after the whole check grid has completed (or never, if
//     the check asserts), so the guarantee above holds and most of the check's time is hidden.
//   - a kernel declared .checks_values_in_kernel() checks every element itself before it uses
//     it (opforge::kernel::check_value, as torch's index kernels use CUDA_KERNEL_ASSERT): the
//     core launches no check and hands the kernel the domains (kernel_value_domains, through
//     OpforgeContext::value_domains) with the same bounds and message. One launch instead of
//     two; other threads may have stored through good indices before the assertion stops the
//     context, which no later work on it can observe.
// It is on by default; set_device_value_checks(false), or OPFORGE_DEVICE_VALUE_CHECKS=0 in the
// environment, turns it off for a process that trusts its indices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/c_api.h"
#include "span.h"

namespace opforge::core {

/// Whether device calls check value domains (on unless OPFORGE_DEVICE_VALUE_CHECKS=0).
bool device_value_checks();
void set_device_value_checks(bool enabled);

/// One input's domain for one call: argument `arg`'s elements in [low, high) or == sentinel.
struct ValueDomain {
  int32_t arg;
  int64_t low, high;
  bool has_sentinel;
  int64_t sentinel;
  std::string message;  ///< "ns::op: name: expected values in [rule) = [low, high)"
};

/// The domains of `op`'s integer inputs for a call with these arguments (views and values):
/// their bounds evaluated from the call's sizes and parameters. Empty for an op that declares
/// none (the usual op: no allocation then).
std::vector<ValueDomain> value_domains(const OpforgeOpSpec& op, Span<const OpforgeArg> args);

/// Launches the check kernel over `domains` on `stream` (a cudaStream_t) of the current CUDA
/// context, in groups of OPFORGE_VALUE_CHECK_MAX_INPUTS inputs. Returns whether it queued a
/// launch (none where every checked input is empty). Throws InternalError naming the op where
/// the CUDA driver cannot load or launch it (no driver, an input of more than
/// OPFORGE_VALUE_CHECK_MAX_DIMS dims).
bool launch_value_checks(const OpforgeOpSpec& op, Span<const OpforgeArg> args, const std::vector<ValueDomain>& domains,
                         void* stream);

/// What a kernel that checks its own values (OpforgeKernel::checks_values) takes instead of the
/// check kernel's launch: one domain per input of `op` that declares one, in argument order,
/// with the bounds and the message ("ns::op: name: expected values in ...") the check kernel
/// would have used; a domain that admits every value where the input is absent, its bounds
/// cannot be evaluated, or `checked` is false (device value checks off).
std::vector<OpforgeValueDomain> kernel_value_domains(const OpforgeOpSpec& op, Span<const OpforgeArg> args,
                                                     bool checked);

}  // namespace opforge::core
