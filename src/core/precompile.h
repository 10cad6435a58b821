// Compiling an op's run-time kernels ahead of their first use (packaging, verify on a machine
// without a GPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// Compiles (or finds cached) every run-time kernel of `op` for one instantiation, for GPU
/// architecture `arch` ("sm_90"; "compute_90" for PTX). `dtypes[i]` is tensor argument i's
/// OpforgeDtype (-1: an optional input left out, or a required one whose dtype the description
/// fixes: same_dtype's, or the one dtype its set allows); `values[i]` parameter i's value (only
/// compile-time parameters select the instantiation). A fresh binary goes to `cache_dir` (the
/// user cache if empty). Returns true if every binary was already cached. Needs no GPU.
///
/// The request is checked as a call would be first, so that nothing a call would refuse gets
/// compiled: every required tensor has a dtype the description allows (same_dtype included)
/// and the CUDA kernel takes (Note [Kernel dtypes]), and every compile-time parameter is in
/// its range and choices. A dtype rule that follows a compile-time parameter is the one its value
/// selects; one that follows another parameter admits what any of its rules admits. Throws opforge::InvalidArgument
/// with every problem on its own line (invalid_arguments_message), opforge::InternalError for a
/// kernel that fails to compile or whose source cannot be read ("ns::op: " and the kernel's
/// message, NVRTC's log with the source file and line).
/// `shapes`, if not empty: per argument, the sizes of one call's tensors (empty for parameters and
/// for optional inputs left out), checked as a call's and given with its outputs' to kernels whose
/// variants depend on sizes (Triton kernels' grid functions).
bool precompile(const OpforgeOpSpec& op, const std::vector<int32_t>& dtypes, const std::vector<OpforgeValue>& values,
                const std::string& arch, const std::string& cache_dir,
                const std::vector<std::vector<int64_t>>& shapes = {});

}  // namespace opforge::core
