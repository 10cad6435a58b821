// The launch of run-time kernels through the CUDA driver, shared by every CUDA backend: NVRTC
// sources (rtc_cuda.cpp), prebuilt binaries (binary_cuda.cpp) and Triton kernels
// (triton_cuda.cpp). This file owns the driver functions they use, the text of a driver error,
// the device's primary context, loading a function from an image and cuLaunchKernelEx. For the
// backends whose kernels take opforge's argument order (Note [Run-time kernels] in
// opforge/op_launch.h) it owns the rest of a launch as well: the launch rule's geometry, a
// per-thread cache of loaded functions and the arguments; such a backend supplies only how an
// instantiation's function is loaded.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "opforge/detail/driver.h"
#include "runtime_kernel.h"

namespace opforge::detail::cu {

/// The driver functions run-time kernels use (opforge/detail/driver.h: reached through the CUDA
/// runtime, so a library loads without a GPU driver). driver() throws InternalError where the
/// driver lacks the basic ones (no GPU driver); func_param_info is null before CUDA 12.4.
struct Driver {
  template <class Fn>
  static Fn entry(const char* name, unsigned version = 12000) {
    return driver_entry_point<Fn>(name, version);
  }
  decltype(&::cuModuleLoadData) module_load = entry<decltype(&::cuModuleLoadData)>("cuModuleLoadData");
  decltype(&::cuModuleLoadDataEx) module_load_ex = entry<decltype(&::cuModuleLoadDataEx)>("cuModuleLoadDataEx");
  decltype(&::cuModuleGetFunction) get_function = entry<decltype(&::cuModuleGetFunction)>("cuModuleGetFunction");
  decltype(&::cuLaunchKernelEx) launch_ex = entry<decltype(&::cuLaunchKernelEx)>("cuLaunchKernelEx");
  decltype(&::cuFuncSetAttribute) set_attribute = entry<decltype(&::cuFuncSetAttribute)>("cuFuncSetAttribute");
  decltype(&::cuFuncGetAttribute) get_attribute = entry<decltype(&::cuFuncGetAttribute)>("cuFuncGetAttribute");
  decltype(&::cuCtxGetCurrent) get_current_context = entry<decltype(&::cuCtxGetCurrent)>("cuCtxGetCurrent");
  decltype(&::cuFuncGetParamInfo) func_param_info = entry<decltype(&::cuFuncGetParamInfo)>("cuFuncGetParamInfo", 12040);
  decltype(&::cuMemsetD8Async) memset_async = entry<decltype(&::cuMemsetD8Async)>("cuMemsetD8Async");
  decltype(&::cuMemcpyDtoDAsync) copy_async = entry<decltype(&::cuMemcpyDtoDAsync)>("cuMemcpyDtoDAsync");
  decltype(&::cuStreamIsCapturing) is_capturing = entry<decltype(&::cuStreamIsCapturing)>("cuStreamIsCapturing");
  decltype(&::cuEventCreate) event_create = entry<decltype(&::cuEventCreate)>("cuEventCreate");
  decltype(&::cuEventRecord) event_record = entry<decltype(&::cuEventRecord)>("cuEventRecord");
  decltype(&::cuEventSynchronize) event_sync = entry<decltype(&::cuEventSynchronize)>("cuEventSynchronize");
  decltype(&::cuEventElapsedTime) elapsed = entry<decltype(&::cuEventElapsedTime)>("cuEventElapsedTime");
  decltype(&::cuEventDestroy) event_destroy = entry<decltype(&::cuEventDestroy)>("cuEventDestroy");
};
const Driver& driver();

/// Throws InternalError "<what> failed: <the driver's description>" unless `r` is CUDA_SUCCESS.
void check_cu(CUresult r, const std::string& what);

/// check_cu for the CUDA runtime; the error is cleared, not left for an unrelated launch check.
void check_cuda(cudaError_t e, const std::string& what);

/// The CUDA C++ type of an OpforgeDtype ("float", "__half", "__nv_bfloat16"; "void" for -1).
const char* cuda_type(int32_t dtype);

/// The compute capability of CUDA device `device` as major * 10 + minor (90), asked once per
/// device. Throws InternalError where the runtime cannot tell.
int compute_capability(int device);

/// Makes `device`'s primary context current on this thread if no context is (the driver API
/// works in the current context; see cuda_launch.cpp for why a thread may have none).
void bind_primary_context(int device);

/// Dynamic shared memory a function may take without cuFuncSetAttribute, in bytes.
constexpr size_t kDefaultSharedBytes = 48 * 1024;

/// Allows `fn` `bytes` of dynamic shared memory (cuFuncSetAttribute), for a launch past
/// kDefaultSharedBytes. Throws InternalError where the driver refuses.
void allow_dynamic_shared(CUfunction fn, size_t bytes);

/// The function `symbol` of the module `image` (a cubin, fatbin, or NUL-terminated PTX) loaded
/// into the current context; the module is never unloaded (after a reload, work already queued
/// may still use it). Throws InternalError "cuModuleLoadData (<what>) failed: ..." or
/// "cuModuleGetFunction (<symbol>) failed: ...".
CUfunction load_function(const void* image, const std::string& symbol, const std::string& what);

/// A launch's shape as cuLaunchKernelEx takes it: the grid in blocks, the block in threads,
/// dynamic shared memory in bytes, and the launch attributes a compiled kernel may ask for.
struct Geometry {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_bytes = 0;
  unsigned cluster_x = 1;    ///< blocks per cluster along x (1: no cluster); clusters spread over the GPU
  bool pdl = false;          ///< programmatic dependent launch: may start before the previous kernel ends
  bool cooperative = false;  ///< a cooperative launch (grid-wide synchronisation)
};

/// The most threads a block of `fn` may have (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: fewer
/// than 1024 where its registers a thread do not fit 1024 threads on an SM); 1024 where the
/// driver cannot tell.
int max_threads_per_block(CUfunction fn);

/// Launches `fn` on `stream` with `params` (one pointer per kernel parameter, to its value)
/// through cuLaunchKernelEx. Throws InternalError "cuLaunchKernelEx(<name>) failed: <the
/// driver's description>" where the driver refuses the launch; a block larger than the kernel's
/// registers allow adds the block's threads, the kernel's most and its registers a thread, and
/// how to fit it (__launch_bounds__).
void launch_function(CUfunction fn, const Geometry& g, CUstream stream, void** params, const char* name);

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
