// opforge/dtype.h -- element types, dtype sets, host half-precision types, dtype dispatch.
//
//   opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
//     const T* in = x.data<T>();   // T is float, double, opforge::Half or opforge::BFloat16
//   });
//
// CUDA code uses opforge/cuda.h, whose visit_dtype hands out __half and __nv_bfloat16 instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "opforge/c_api.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define OPFORGE_HOST_DEVICE __host__ __device__
#else
#define OPFORGE_HOST_DEVICE
#endif

namespace opforge {

/// Element type of a tensor. Values equal the C ABI's OpforgeDtype.
enum class Dtype : int32_t {
  kFloat32 = OPFORGE_DTYPE_FLOAT32,
  kFloat64 = OPFORGE_DTYPE_FLOAT64,
  kFloat16 = OPFORGE_DTYPE_FLOAT16,
  kBFloat16 = OPFORGE_DTYPE_BFLOAT16,
  kInt8 = OPFORGE_DTYPE_INT8,
  kInt16 = OPFORGE_DTYPE_INT16,
  kInt32 = OPFORGE_DTYPE_INT32,
  kInt64 = OPFORGE_DTYPE_INT64,
  kUInt8 = OPFORGE_DTYPE_UINT8,
  kBool = OPFORGE_DTYPE_BOOL,
};

inline constexpr Dtype kFloat32 = Dtype::kFloat32;
inline constexpr Dtype kFloat64 = Dtype::kFloat64;
inline constexpr Dtype kFloat16 = Dtype::kFloat16;
inline constexpr Dtype kBFloat16 = Dtype::kBFloat16;
inline constexpr Dtype kInt8 = Dtype::kInt8;
inline constexpr Dtype kInt16 = Dtype::kInt16;
inline constexpr Dtype kInt32 = Dtype::kInt32;
inline constexpr Dtype kInt64 = Dtype::kInt64;
inline constexpr Dtype kUInt8 = Dtype::kUInt8;
inline constexpr Dtype kBool = Dtype::kBool;

inline const char* dtype_name(Dtype d) { return dtype_name(static_cast<int32_t>(d)); }

/// Size of one element in bytes.
inline constexpr size_t dtype_size(Dtype d) { return dtype_size(static_cast<int32_t>(d)); }

/// A set of dtypes, used as an input constraint: `.input("x", opforge::floating)`.
struct DtypeSet {
  uint32_t bits = 0;
  constexpr DtypeSet() = default;
  constexpr explicit DtypeSet(uint32_t b) : bits(b) {}
  constexpr DtypeSet(Dtype d) : bits(1u << static_cast<int32_t>(d)) {}  // NOLINT: implicit by design
  constexpr DtypeSet operator|(DtypeSet o) const { return DtypeSet(bits | o.bits); }
  constexpr bool contains(Dtype d) const { return (bits >> static_cast<int32_t>(d)) & 1u; }
};
constexpr DtypeSet operator|(Dtype a, Dtype b) { return DtypeSet(a) | DtypeSet(b); }

/// float32, float64, float16, bfloat16.
inline constexpr DtypeSet floating = kFloat32 | kFloat64 | kFloat16 | kBFloat16;
/// float16 and bfloat16.
inline constexpr DtypeSet half_precision = kFloat16 | kBFloat16;
/// Signed and unsigned integers (not bool).
inline constexpr DtypeSet integral = kInt8 | kInt16 | kInt32 | kInt64 | DtypeSet(kUInt8);

/// Explicit dtype set: `opforge::dtypes(opforge::kFloat16, opforge::kBFloat16)`.
template <class... D>
constexpr DtypeSet dtypes(D... d) {
  return (DtypeSet() | ... | DtypeSet(d));
}

/// IEEE 754 binary16 stored as bits, for host code. Converts to and from float
/// with round-to-nearest-even, handling subnormals, infinities and NaN (IEEE 754-2008 §3.6).
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(from_float(f)) {}
  explicit Half(double d) : Half(static_cast<float>(d)) {}
  operator float() const { return to_float(bits); }  // NOLINT: implicit widening, as in c10::Half

  static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
    if (a < 0x38800000u) {  // below 2^-14: a subnormal half, i.e. a multiple of 2^-24
      float v;
      std::memcpy(&v, &a, 4);
      return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(v * 16777216.0f)));
    }
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);                // round to nearest even on 13 dropped bits
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));  // rebias 127 -> 15
  }
  static float to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
      float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
      std::memcpy(&x, &v, 4);
      x |= sign;
    } else if (exp == 31) {
      x = sign | 0x7f800000u | (mant << 13);
    } else {
      x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
};

/// bfloat16 (the upper half of a float32) stored as bits, for host code; from float
/// with round-to-nearest-even, NaN kept quiet.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(from_float(f)) {}
  explicit BFloat16(double d) : BFloat16(static_cast<float>(d)) {}
  operator float() const { return to_float(bits); }  // NOLINT: implicit widening

  static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t x = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
};

/// Carries a type through a generic lambda: `[&]<class T>(opforge::type_tag<T>) { ... }`.
template <class T>
struct type_tag {
  using type = T;
};

namespace detail {
template <DtypeSet Allowed, class HalfT, class BFloat16T, class F>
decltype(auto) visit_dtype_impl(Dtype d, F&& f) {
#define OPFORGE_VISIT_CASE(DT, T)         \
  if constexpr (Allowed.contains(DT)) {   \
    if (d == DT) return f(type_tag<T>{}); \
  }
  OPFORGE_VISIT_CASE(kFloat32, float)
  OPFORGE_VISIT_CASE(kFloat64, double)
  OPFORGE_VISIT_CASE(kFloat16, HalfT)
  OPFORGE_VISIT_CASE(kBFloat16, BFloat16T)
  OPFORGE_VISIT_CASE(kInt8, int8_t)
  OPFORGE_VISIT_CASE(kInt16, int16_t)
  OPFORGE_VISIT_CASE(kInt32, int32_t)
  OPFORGE_VISIT_CASE(kInt64, int64_t)
  OPFORGE_VISIT_CASE(kUInt8, uint8_t)
  OPFORGE_VISIT_CASE(kBool, bool)
#undef OPFORGE_VISIT_CASE
  throw InvalidArgument(std::string("opforge::visit_dtype: dtype ") + dtype_name(d) +
                        " is not in the set this kernel was instantiated for");
}
}  // namespace detail

/// Calls `f(type_tag<T>{})` with the host C++ type of `d` (float, double, opforge::Half,
/// opforge::BFloat16, int8_t ... bool), instantiating `f` only for the dtypes in `Allowed`.
/// Throws InvalidArgument for a dtype outside `Allowed` (adapters have already checked the
/// declared dtypes, so this only fires when a kernel handles fewer dtypes than it declared).
template <DtypeSet Allowed, class F>
decltype(auto) visit_dtype(Dtype d, F&& f) {
  return detail::visit_dtype_impl<Allowed, Half, BFloat16>(d, std::forward<F>(f));
}

}  // namespace opforge
