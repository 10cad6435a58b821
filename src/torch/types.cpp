// Translation between torch and opforge's C ABI (see types.h).
#include "types.h"

#include <array>

#include "opforge/detail/names.h"

namespace opforge::torch {

int32_t to_opforge(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return OPFORGE_DTYPE_FLOAT32;
    case at::kDouble:
      return OPFORGE_DTYPE_FLOAT64;
    case at::kHalf:
      return OPFORGE_DTYPE_FLOAT16;
    case at::kBFloat16:
      return OPFORGE_DTYPE_BFLOAT16;
    case at::kChar:
      return OPFORGE_DTYPE_INT8;
    case at::kShort:
      return OPFORGE_DTYPE_INT16;
    case at::kInt:
      return OPFORGE_DTYPE_INT32;
    case at::kLong:
      return OPFORGE_DTYPE_INT64;
    case at::kByte:
      return OPFORGE_DTYPE_UINT8;
    case at::kBool:
      return OPFORGE_DTYPE_BOOL;
    case at::kFloat8_e4m3fn:
      return OPFORGE_DTYPE_FLOAT8_E4M3FN;
    case at::kFloat8_e5m2:
      return OPFORGE_DTYPE_FLOAT8_E5M2;
    case at::kFloat8_e8m0fnu:
      return OPFORGE_DTYPE_FLOAT8_E8M0FNU;
    default:
      return -1;
  }
}

at::ScalarType to_torch(int32_t d) {
  static const at::ScalarType kTypes[] = {
      at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,      at::kChar,        at::kShort,         at::kInt,
      at::kLong,  at::kByte,   at::kBool, at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kFloat8_e8m0fnu};
  static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == OPFORGE_NUM_DTYPES, "a torch dtype per OpforgeDtype");
  TORCH_INTERNAL_ASSERT(d >= 0 && d < OPFORGE_NUM_DTYPES, "opforge: bad dtype code ", d);
  return kTypes[d];
}

const char* torch_dtype_name(at::ScalarType t) {
  const int32_t d = to_opforge(t);
  if (d >= 0) return dtype_name(d);
  switch (t) {
    case at::kComplexHalf:
      return "complex32";
    case at::kComplexFloat:
      return "complex64";
    case at::kComplexDouble:
      return "complex128";
    case at::kFloat8_e4m3fnuz:
      return "float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz:
      return "float8_e5m2fnuz";
    case at::kUInt16:
      return "uint16";
    case at::kUInt32:
      return "uint32";
    case at::kUInt64:
      return "uint64";
    case at::kQInt8:
      return "qint8";
    case at::kQUInt8:
      return "quint8";
    case at::kQInt32:
      return "qint32";
    default:
      return c10::toString(t);
  }
}

const char* device_type_name(c10::DeviceType type) {
  static const auto names = [] {
    std::array<std::string, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)> n;
    for (size_t i = 0; i < n.size(); ++i) {
      try {
        n[i] = c10::DeviceTypeName(static_cast<c10::DeviceType>(i), /*lower_case=*/true);
      } catch (...) {
        n[i] = "device" + std::to_string(i);
      }
    }
    return n;
  }();
  return names[static_cast<size_t>(type)].c_str();
}

OpforgeTensor view(const at::Tensor& t) {
  OpforgeTensor v{};
  v.data = t.data_ptr();
  v.dtype = to_opforge(t.scalar_type());
  v.device_type = t.is_cuda() ? OPFORGE_DEVICE_CUDA : OPFORGE_DEVICE_CPU;
  v.device_index = t.device().has_index() ? t.device().index() : -1;
  v.ndim = static_cast<int32_t>(t.dim());
  v.sizes = t.sizes().data();
  v.strides = t.strides().data();
  return v;
}

}  // namespace opforge::torch
