// opforge/detail/names.h -- printable names of C ABI enums (C++17; shared with adapters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "opforge/c_api.h"

namespace opforge {

/// Name of an OpforgeDtype as torch prints it ("float32", "bfloat16", ...), or "unknown".
inline const char* dtype_name(int32_t d) {
  static const char* const kNames[] = {"float32", "float64", "float16", "bfloat16", "int8",
                                       "int16",   "int32",   "int64",   "uint8",    "bool"};
  return (d >= 0 && d < OPFORGE_NUM_DTYPES) ? kNames[d] : "unknown";
}

/// Size in bytes of one element of an OpforgeDtype (1 for codes opforge does not know).
inline constexpr size_t dtype_size(int32_t d) {
  switch (d) {
    case OPFORGE_DTYPE_FLOAT64:
    case OPFORGE_DTYPE_INT64:
      return 8;
    case OPFORGE_DTYPE_FLOAT32:
    case OPFORGE_DTYPE_INT32:
      return 4;
    case OPFORGE_DTYPE_FLOAT16:
    case OPFORGE_DTYPE_BFLOAT16:
    case OPFORGE_DTYPE_INT16:
      return 2;
    default:
      return 1;
  }
}

/// Name of an OpforgeKernelBackend as the description JSON gives it ("native", "nvrtc", "triton",
/// "binary"), or "unknown".
inline const char* backend_name(int32_t backend) {
  static const char* const kNames[] = {"native", "nvrtc", "triton", "binary"};
  return (backend >= 0 && backend <= OPFORGE_BACKEND_BINARY) ? kNames[backend] : "unknown";
}

/// The builder step that declares a run-time kernel of OpforgeKernelBackend `backend`
/// ("cuda_source", "triton_source", "cuda_binary"), for messages about it.
inline const char* backend_step(int32_t backend) {
  return backend == OPFORGE_BACKEND_TRITON   ? "triton_source"
         : backend == OPFORGE_BACKEND_BINARY ? "cuda_binary"
                                             : "cuda_source";
}

namespace detail {

/// The prefix of every declaration error, "file:line: ns::op: " (the form editors and compilers
/// make clickable). Op libraries (OpDef::finalize) and the core (load checks) both build their
/// messages with it, so the shape is defined once.
inline std::string declared_at(const std::string& file, int32_t line, const std::string& qualified_name) {
  return file + ":" + std::to_string(line) + ": " + qualified_name + ": ";
}

}  // namespace detail

}  // namespace opforge
