// The launch of run-time kernels through the CUDA driver, shared by the backends whose kernels
// take opforge's argument order (Note [Run-time kernels] in opforge/op_launch.h): NVRTC sources
// (rtc_cuda.cpp) and prebuilt binaries (binary_cuda.cpp). A backend supplies how an
// instantiation's function is loaded; this file owns the rest of a launch: the launch rule's
// geometry, the device's primary context, a per-thread cache of loaded functions, the
// arguments and cuLaunchKernel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "opforge/detail/driver.h"
#include "runtime_kernel.h"

namespace opforge::detail::cu {

/// The driver functions run-time kernels use (opforge/detail/driver.h: reached through the CUDA
/// runtime, so a library loads without a GPU driver). Throws InternalError where the driver
/// lacks the basic ones (no GPU driver); func_param_info is null before CUDA 12.4.
struct Driver {
  decltype(&::cuModuleLoadData) module_load = driver_entry_point<decltype(&::cuModuleLoadData)>("cuModuleLoadData");
  decltype(&::cuModuleLoadDataEx) module_load_ex =
      driver_entry_point<decltype(&::cuModuleLoadDataEx)>("cuModuleLoadDataEx");
  decltype(&::cuModuleGetFunction) get_function =
      driver_entry_point<decltype(&::cuModuleGetFunction)>("cuModuleGetFunction");
  decltype(&::cuLaunchKernel) launch = driver_entry_point<decltype(&::cuLaunchKernel)>("cuLaunchKernel");
  decltype(&::cuFuncSetAttribute) set_attribute =
      driver_entry_point<decltype(&::cuFuncSetAttribute)>("cuFuncSetAttribute");
  decltype(&::cuCtxGetCurrent) get_current_context =
      driver_entry_point<decltype(&::cuCtxGetCurrent)>("cuCtxGetCurrent");
  decltype(&::cuFuncGetParamInfo) func_param_info =
      driver_entry_point<decltype(&::cuFuncGetParamInfo)>("cuFuncGetParamInfo", 12040);
};
const Driver& driver();

/// Throws InternalError "<what> failed: <the driver's description>" unless `r` is CUDA_SUCCESS.
void check_cu(CUresult r, const std::string& what);

/// check_cu for the CUDA runtime; the error is cleared, not left for an unrelated launch check.
void check_cuda(cudaError_t e, const std::string& what);

/// The CUDA C++ type of an OpforgeDtype ("float", "__half", "__nv_bfloat16"; "void" for -1).
const char* cuda_type(int32_t dtype);

/// The compute capability of CUDA device `device` as major * 10 + minor (90).
int compute_capability(int device);

/// How a backend loads the function of one instantiation: the kernel, its instantiation name
/// (rtc::instantiate), the device, the call's tensor dtypes (arguments, -1 for an absent
/// optional input, and outputs) and how many int64 launch values and tensor maps the launch
/// passes. Called once per instantiation, device and thread, then again after reload(); it
/// checks the kernel's parameters against what the launch passes and throws naming them.
using Loader = CUfunction (*)(const RuntimeKernel& rk, const std::string& name, int device,
                              const std::vector<int32_t>& arg_dtypes, const std::vector<int32_t>& out_dtypes,
                              int32_t launch_values, int32_t tensor_maps);

/// Launches `rk` for the call `f` on its stream: the launch rule's grid (nothing when nothing is
/// to be launched), the function `load` gives for the instantiation named with `type_name`
/// (cached per thread: a known instantiation's launch takes no lock and allocates nothing),
/// and the arguments in opforge's order. Throws InternalError naming the kernel if the driver
/// refuses the launch.
void launch(const RuntimeKernel& rk, const OpforgeCallFrame* f, const char* (*type_name)(int32_t dtype), Loader load);

/// Forgets every thread's cached functions (a backend's reload: the next launch loads anew).
void forget_launches();

}  // namespace opforge::detail::cu
