// The kernel of one ONNX node of an opforge op in ONNX Runtime: created once per node, run once
// per session run, through the core's call protocol (src/core/call.h).
#pragma once

#include <cstdint>
#include <string>

#include "opforge/c_api.h"
#include "ort_abi.h"
#include "params.h"

namespace opforge::ort {

/// An op registered with ONNX Runtime for one execution provider: the OrtCustomOp ONNX Runtime
/// reads (the first member, so the pointer it passes back is this entry's) and what the
/// callbacks need.
struct OpEntry {
  CustomOp custom_op{};
  const OpforgeOpSpec* op = nullptr;
  int32_t device_type = OPFORGE_DEVICE_CPU;  ///< CPU: CPUExecutionProvider, CUDA: CUDAExecutionProvider
  std::string name;                          ///< the op's name in its namespace (the node's op_type)
};

/// One node's kernel: the op, its parameter values from the node's attributes, ONNX Runtime's API.
class Kernel {
 public:
  /// Reads the node's attributes (Params); throws InvalidArgument as Params does.
  Kernel(const OpEntry& entry, Api api, const KernelInfo* info);
  /// Runs the node once (Note [The ONNX node of an op] in registration.cpp): its inputs and
  /// attributes as the op's arguments, the written inputs' new values copied from the inputs
  /// and written in place, every rule of the call checked by the core. Throws InvalidArgument
  /// for the caller's faults (the call's message), InternalError for any other failure.
  void compute(KernelContext* context);

 private:
  const OpEntry& entry_;
  Api api_;
  Params params_;
};

}  // namespace opforge::ort
