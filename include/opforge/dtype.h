// opforge/dtype.h -- element types, dtype sets, host half-precision and float8 types, dtype dispatch.
//
//   opforge::visit_dtype<opforge::floating>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {
//     const T* in = x.data<T>();   // T is float, double, opforge::Half or opforge::BFloat16
//   });
//
// CUDA code uses opforge/cuda.h, whose visit_dtype hands out __half, __nv_bfloat16 and CUDA's
// __nv_fp8_e4m3 / __nv_fp8_e5m2 / __nv_fp8_e8m0 instead.
//
// Note [Float8 dtypes]
// --------------------
// opforge::kFloat8_e4m3fn, kFloat8_e5m2 and kFloat8_e8m0fnu are torch's float8_e4m3fn,
// float8_e5m2 and float8_e8m0fnu, one byte each: e4m3fn (max 448, no infinities, NaN 0x7f and
// 0xff) and e5m2 (max 57344, infinities, NaNs) hold data (opforge::float8 is the two), e8m0fnu a
// power of two with no sign (an MX block scale, 2^-127 .. 2^127, NaN 0xff). They are not
// opforge::floating: no op takes them unless it says so, autocast never casts to or from them, and
// opforge verify draws their inputs over the finite range (with NaN where the format has one) and
// compares their results bit for bit (any NaN equal to any NaN) unless the op declares a
// .tolerance() for the dtype.
//
// The host types opforge::Float8_e4m3fn, Float8_e5m2 and Float8_e8m0fnu convert from float exactly
// as torch's c10::Float8_* do (round to nearest even; e4m3fn gives NaN past 464, e5m2 infinity
// from 61440, e8m0fnu rounds the exponent and ignores the sign), so a CPU reference that converts
// with them produces torch's bytes. `saturated(f)` is the conversion CUDA's kernels make with
// __NV_SATFINITE (cuda_fp8.h's __nv_fp8_e4m3(float) and friends): a value past the largest finite
// one (infinities too) becomes that value, NaN stays NaN.
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
  kFloat8_e4m3fn = OPFORGE_DTYPE_FLOAT8_E4M3FN,
  kFloat8_e5m2 = OPFORGE_DTYPE_FLOAT8_E5M2,
  kFloat8_e8m0fnu = OPFORGE_DTYPE_FLOAT8_E8M0FNU,
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
inline constexpr Dtype kFloat8_e4m3fn = Dtype::kFloat8_e4m3fn;
inline constexpr Dtype kFloat8_e5m2 = Dtype::kFloat8_e5m2;
inline constexpr Dtype kFloat8_e8m0fnu = Dtype::kFloat8_e8m0fnu;

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
/// The float8 data formats, float8_e4m3fn and float8_e5m2 (Note [Float8 dtypes]; the block-scale
/// format kFloat8_e8m0fnu is named on its own).
inline constexpr DtypeSet float8 = kFloat8_e4m3fn | kFloat8_e5m2;

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

namespace detail {
inline uint32_t float_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float bits_float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
/// |f| rounded to nearest even on a grid of 1 / units_per_one (a power of two): the mantissa of a
/// float8 subnormal, in units of its smallest one.
inline uint32_t subnormal_units(float magnitude, float units_per_one) {
  return static_cast<uint32_t>(std::nearbyint(magnitude * units_per_one));
}

/// float8_e4m3fn's bits (Note [Float8 dtypes]): 1 sign, 4 exponent (bias 7) and 3 mantissa bits, max
/// 448, no infinities, NaN 0x7f / 0xff. From float as torch's c10::Float8_e4m3fn: round to nearest
/// even, |f| >= 464 (infinities too) and NaN to NaN.
struct E4m3fnBits {
  static constexpr float kMax = 448.0f;
  static uint8_t from_float(float f) {
    const uint32_t x = float_bits(f), sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
    if (a >= 0x43f00000u) return static_cast<uint8_t>(sign | 0x7fu);  // 480, infinities, NaN
    if (a < 0x3c800000u)                                              // below 2^-6: a subnormal, a multiple of 2^-9
      return static_cast<uint8_t>(sign | subnormal_units(bits_float(a), 512.0f));
    const uint32_t rounded = a + 0x7ffffu + ((a >> 20) & 1u);              // nearest even on 20 dropped bits
    return static_cast<uint8_t>(sign | ((rounded - (120u << 23)) >> 20));  // rebias 127 -> 7
  }
  static float to_float(uint8_t b) {
    const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 0x7u;
    if ((b & 0x7fu) == 0x7fu) return bits_float(sign | 0x7ff00000u);
    if (exp == 0) return bits_float(sign | float_bits(static_cast<float>(mant) / 512.0f));
    return bits_float(sign | ((exp + 120u) << 23) | (mant << 20));
  }
};

/// float8_e5m2's bits (Note [Float8 dtypes]): 1 sign, 5 exponent (bias 15) and 2 mantissa bits (the
/// upper byte of a float16), max 57344, infinities and NaNs. From float as torch's c10::Float8_e5m2:
/// round to nearest even, |f| >= 61440 to infinity, NaN to 0x7f.
struct E5m2Bits {
  static constexpr float kMax = 57344.0f;
  static uint8_t from_float(float f) {
    const uint32_t x = float_bits(f), sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
    if (a >= 0x47800000u) return static_cast<uint8_t>(sign | (a > 0x7f800000u ? 0x7fu : 0x7cu));  // 65536, inf, NaN
    if (a < 0x38800000u)  // below 2^-14: a subnormal, a multiple of 2^-16
      return static_cast<uint8_t>(sign | subnormal_units(bits_float(a), 65536.0f));
    const uint32_t rounded = a + 0xfffffu + ((a >> 21) & 1u);              // nearest even on 21 dropped bits
    return static_cast<uint8_t>(sign | ((rounded - (112u << 23)) >> 21));  // rebias 127 -> 15
  }
  static float to_float(uint8_t b) { return Half::to_float(static_cast<uint16_t>(b << 8)); }
};

/// float8_e8m0fnu's bits (Note [Float8 dtypes]): an 8-bit exponent (bias 127) and nothing else,
/// 2^(bits - 127), so 2^-127 .. 2^127, NaN 0xff. From float as torch's c10::Float8_e8m0fnu: the
/// exponent of |f| rounded by the mantissa's guard, round and sticky bits, infinities and NaN to NaN.
struct E8m0fnuBits {
  static constexpr float kMax = 0.0f;  // no saturation: every float has an exponent
  static uint8_t from_float(float f) {
    const uint32_t x = float_bits(f), exp = (x >> 23) & 0xffu;
    if (exp == 0xffu) return 0xffu;
    const bool guard = x & 0x400000u, round = x & 0x200000u, sticky = x & 0x1fffffu;
    return static_cast<uint8_t>(exp + (guard && (round || sticky || exp > 0) ? 1u : 0u));
  }
  static float to_float(uint8_t b) {
    if (b == 0) return bits_float(0x00400000u);  // 2^-127, a float32 subnormal
    if (b == 0xffu) return bits_float(0x7f800001u);
    return bits_float(static_cast<uint32_t>(b) << 23);
  }
};
}  // namespace detail

/// A float8 value stored as bits, for host code (Note [Float8 dtypes]), in the format `Bits`
/// describes: constructed from float (or double, through float) with torch's rounding, widened to
/// float exactly. Use the aliases opforge::Float8_e4m3fn, Float8_e5m2, Float8_e8m0fnu.
template <class Bits>
struct Float8 {
  uint8_t bits = 0;
  /// The largest finite value (0 for float8_e8m0fnu, which has no saturating conversion).
  static constexpr float kMax = Bits::kMax;
  Float8() = default;
  explicit Float8(float f) : bits(Bits::from_float(f)) {}
  explicit Float8(double d) : Float8(static_cast<float>(d)) {}
  operator float() const { return Bits::to_float(bits); }  // NOLINT: implicit widening, as in c10
  static Float8 from_bits(uint8_t b) {
    Float8 v;
    v.bits = b;
    return v;
  }
  /// CUDA's __NV_SATFINITE conversion: f clamped to [-kMax, kMax] (NaN kept), then rounded.
  static Float8 saturated(float f) {
    static_assert(Bits::kMax > 0, "opforge::Float8_e8m0fnu has no saturating conversion");
    return Float8(f != f ? f : f > kMax ? kMax : f < -kMax ? -kMax : f);
  }
};
/// torch's float8_e4m3fn on the host: max 448, no infinities, NaN 0x7f / 0xff.
using Float8_e4m3fn = Float8<detail::E4m3fnBits>;
/// torch's float8_e5m2 on the host: max 57344, infinities and NaNs.
using Float8_e5m2 = Float8<detail::E5m2Bits>;
/// torch's float8_e8m0fnu on the host: a power of two 2^-127 .. 2^127, NaN 0xff.
using Float8_e8m0fnu = Float8<detail::E8m0fnuBits>;

/// Carries a type through a generic lambda: `[&]<class T>(opforge::type_tag<T>) { ... }`.
template <class T>
struct type_tag {
  using type = T;
};

namespace detail {
/// The C++ types visit_dtype hands out for the dtypes that have no builtin type.
struct HostTypes {
  using Half = ::opforge::Half;
  using BFloat16 = ::opforge::BFloat16;
  using Float8_e4m3fn = ::opforge::Float8_e4m3fn;
  using Float8_e5m2 = ::opforge::Float8_e5m2;
  using Float8_e8m0fnu = ::opforge::Float8_e8m0fnu;
};

template <DtypeSet Allowed, class Types, class F>
decltype(auto) visit_dtype_impl(Dtype d, F&& f) {
#define OPFORGE_VISIT_CASE(DT, T)         \
  if constexpr (Allowed.contains(DT)) {   \
    if (d == DT) return f(type_tag<T>{}); \
  }
  OPFORGE_VISIT_CASE(kFloat32, float)
  OPFORGE_VISIT_CASE(kFloat64, double)
  OPFORGE_VISIT_CASE(kFloat16, typename Types::Half)
  OPFORGE_VISIT_CASE(kBFloat16, typename Types::BFloat16)
  OPFORGE_VISIT_CASE(kInt8, int8_t)
  OPFORGE_VISIT_CASE(kInt16, int16_t)
  OPFORGE_VISIT_CASE(kInt32, int32_t)
  OPFORGE_VISIT_CASE(kInt64, int64_t)
  OPFORGE_VISIT_CASE(kUInt8, uint8_t)
  OPFORGE_VISIT_CASE(kBool, bool)
  OPFORGE_VISIT_CASE(kFloat8_e4m3fn, typename Types::Float8_e4m3fn)
  OPFORGE_VISIT_CASE(kFloat8_e5m2, typename Types::Float8_e5m2)
  OPFORGE_VISIT_CASE(kFloat8_e8m0fnu, typename Types::Float8_e8m0fnu)
#undef OPFORGE_VISIT_CASE
  throw InvalidArgument(std::string("opforge::visit_dtype: dtype ") + dtype_name(d) +
                        " is not in the set this kernel was instantiated for");
}
}  // namespace detail

/// Calls `f(type_tag<T>{})` with the host C++ type of `d` (float, double, opforge::Half,
/// opforge::BFloat16, int8_t ... bool, opforge::Float8_e4m3fn, opforge::Float8_e5m2,
/// opforge::Float8_e8m0fnu), instantiating `f` only for the dtypes in `Allowed`.
/// Throws InvalidArgument for a dtype outside `Allowed` (adapters have already checked the
/// declared dtypes, so this only fires when a kernel handles fewer dtypes than it declared).
template <DtypeSet Allowed, class F>
decltype(auto) visit_dtype(Dtype d, F&& f) {
  return detail::visit_dtype_impl<Allowed, detail::HostTypes>(d, std::forward<F>(f));
}

}  // namespace opforge
