// opforge/detail/driver.h -- CUDA driver API functions reached through the CUDA runtime
// (cudaGetDriverEntryPointByVersion), so that nothing opforge builds links libcuda and a library
// loads on a machine without a GPU driver, needing one only when a driver function first runs.
// Used by the run-time kernels' launcher (src/oplib/rtc_cuda.cpp) and by
// opforge::cuda::tiled_tensor_map (opforge/cuda.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace opforge::detail {

/// The driver function `name` in its CUDA 12.0 form (`Fn`: its pointer type, e.g.
/// decltype(&::cuLaunchKernel)), or nullptr where the driver has none.
template <class Fn>
Fn driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(fn);
}

/// "what failed: <the driver's description of r>" (cuGetErrorString), or the number where the
/// driver has no description.
inline std::string driver_error(CUresult r, const char* what) {
  static const auto error_string = driver_entry_point<decltype(&::cuGetErrorString)>("cuGetErrorString");
  const char* msg = nullptr;
  if (error_string != nullptr) error_string(r, &msg);
  return std::string(what) + " failed: " + (msg != nullptr ? msg : "CUresult " + std::to_string(static_cast<int>(r)));
}

}  // namespace opforge::detail
