// What the ONNX Runtime adapter's files share: element types between ONNX and opforge, and
// ONNX Runtime's statuses as C++ exceptions and back.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "../core/schema.h"
#include "opforge/c_api.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "ort_abi.h"

namespace opforge::ort {

/// One element type in both numberings, and the name messages give it.
struct TypeMap {
  ElementType onnx;
  int32_t opforge;    ///< OpforgeDtype, -1 where opforge has none
  const char* label;  ///< opforge's name where it has the type, ONNX's otherwise
};

/// Every ONNX element type ONNX Runtime passes custom ops: a new opforge dtype (float8) is one
/// more row here and in python/opforge/onnx/_types.py.
inline constexpr TypeMap kTypes[] = {
    {kFloat, OPFORGE_DTYPE_FLOAT32, "float32"},
    {kDouble, OPFORGE_DTYPE_FLOAT64, "float64"},
    {kFloat16, OPFORGE_DTYPE_FLOAT16, "float16"},
    {kBFloat16, OPFORGE_DTYPE_BFLOAT16, "bfloat16"},
    {kInt8, OPFORGE_DTYPE_INT8, "int8"},
    {kInt16, OPFORGE_DTYPE_INT16, "int16"},
    {kInt32, OPFORGE_DTYPE_INT32, "int32"},
    {kInt64, OPFORGE_DTYPE_INT64, "int64"},
    {kUint8, OPFORGE_DTYPE_UINT8, "uint8"},
    {kBool, OPFORGE_DTYPE_BOOL, "bool"},
    {kUint16, -1, "uint16"},
    {kUint32, -1, "uint32"},
    {kUint64, -1, "uint64"},
    {kString, -1, "string"},
    {kComplex64, -1, "complex64"},
    {kComplex128, -1, "complex128"},
    {kFloat8E4M3FN, -1, "float8e4m3fn"},
    {kFloat8E4M3FNUZ, -1, "float8e4m3fnuz"},
    {kFloat8E5M2, -1, "float8e5m2"},
    {kFloat8E5M2FNUZ, -1, "float8e5m2fnuz"},
};

/// The row of ONNX element type `t` (an unknown one: {t, -1, "unknown"}).
inline TypeMap type_of(int32_t t) {
  for (const TypeMap& m : kTypes)
    if (m.onnx == t) return m;
  return {static_cast<ElementType>(t), -1, "unknown"};
}

/// The ONNX element type of OpforgeDtype `d` (kUndefined for none).
inline ElementType element_type(int32_t d) {
  for (const TypeMap& m : kTypes)
    if (m.opforge == d && d >= 0) return m.onnx;
  return kUndefined;
}

/// Throws InternalError with the message of a failed ONNX Runtime call (`what`: the call), and
/// releases the status; a null status (success) passes.
inline void check(const Api& api, Status* status, const char* what) {
  if (status == nullptr) return;
  std::string message = std::string("opforge.ort: ") + what + ": " +
                        api.call<const char*>(Slot::GetErrorMessage, static_cast<const Status*>(status));
  api.call<void>(Slot::ReleaseStatus, status);
  throw InternalError(message);
}

/// The status that reports the exception being handled (call in a catch block): the caller's
/// fault (opforge::InvalidArgument) as ORT_INVALID_ARGUMENT, anything else as ORT_FAIL.
inline Status* status_of_current_exception(const Api& api) {
  try {
    throw;
  } catch (const InvalidArgument& e) {
    return api.call<Status*>(Slot::CreateStatus, kInvalidArgument, e.what());
  } catch (const std::exception& e) {
    return api.call<Status*>(Slot::CreateStatus, kFail, e.what());
  } catch (...) {
    return api.call<Status*>(Slot::CreateStatus, kFail, "opforge.ort: unknown C++ exception");
  }
}

}  // namespace opforge::ort
