// opforge/detail/driver.h -- CUDA driver API functions reached through the CUDA runtime
// (cudaGetDriverEntryPointByVersion), so that nothing opforge builds links libcuda and a library
// loads on a machine without a GPU driver, needing one only when a driver function first runs.
// Used by the run-time kernels' launcher (src/oplib/cuda_launch.h), opforge::tensor_map
// (src/oplib/rtc_cuda.cpp) and opforge::cuda::tiled_tensor_map (opforge/cuda.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace opforge::detail {

/// The driver function `name` in the form of CUDA `version` (12000: 12.0; `Fn`: its pointer type,
/// e.g. decltype(&::cuLaunchKernel)), or nullptr where the driver has none.
template <class Fn>
Fn driver_entry_point(const char* name, unsigned int version = 12000) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &status) != cudaSuccess ||
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

/// cuTensorMapEncodeTiled into `map`: a tensor of `rank` dims at `base`, `dims` elements and
/// `strides` bytes (rank - 1 of them: dims 1 and up) innermost first, copied in boxes of `box`
/// elements, every element stride 1, elements past the ends filled with zeros. Returns the
/// driver's result, CUDA_ERROR_NOT_SUPPORTED where the driver has no cuTensorMapEncodeTiled
/// (before CUDA 12).
inline CUresult encode_tiled_tensor_map(CUtensorMap& map, CUtensorMapDataType type, uint32_t rank, const void* base,
                                        const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion) {
  static const auto encode = driver_entry_point<decltype(&::cuTensorMapEncodeTiled)>("cuTensorMapEncodeTiled");
  if (encode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return encode(&map, type, rank, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace opforge::detail
