// Dtypes as kernels see them (opforge/dtype.h): visiting a dtype outside the kernel's set, the
// float8 host types.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Dtype, VisitingADtypeOutsideTheSetSaysSo) {
  EXPECT_EQ(message_of<opforge::InvalidArgument>(
                [] { opforge::visit_dtype<opforge::floating>(opforge::kInt32, []<class T>(opforge::type_tag<T>) {}); }),
            "opforge::visit_dtype: dtype int32 is not in the set this kernel was instantiated for");
}

}  // namespace

namespace float8_tests {

uint8_t e4m3(float f) { return opforge::Float8_e4m3fn(f).bits; }
uint8_t e5m2(float f) { return opforge::Float8_e5m2(f).bits; }
uint8_t e8m0(float f) { return opforge::Float8_e8m0fnu(f).bits; }

// Values of torch's conversions (c10::Float8_*), pinned here; tests/python/test_float8.py compares
// every byte and many floats with torch itself.
TEST(Float8, E4m3fnRoundsAsTorchDoes) {
  EXPECT_EQ(e4m3(1.0f), 0x38);
  EXPECT_EQ(e4m3(-1.0f), 0xb8);
  EXPECT_EQ(e4m3(448.0f), 0x7e);
  EXPECT_EQ(e4m3(463.99f), 0x7e);  // below the tie with 480 (0x7f, NaN)
  EXPECT_EQ(e4m3(464.0f), 0x7e);   // the tie goes to the even mantissa
  EXPECT_EQ(e4m3(470.0f), 0x7f);   // past it: NaN, as torch (no saturation)
  EXPECT_EQ(e4m3(std::numeric_limits<float>::infinity()), 0x7f);
  EXPECT_EQ(e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(e4m3(std::ldexp(1.0f, -9)), 0x01);   // the smallest subnormal
  EXPECT_EQ(e4m3(std::ldexp(1.0f, -10)), 0x00);  // half of it: the tie to even is 0
  EXPECT_EQ(e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal units: the tie to even is 2
  EXPECT_EQ(e4m3(1.0625f), 0x38);                // a tie between 1 and 1.125 goes to 1
  EXPECT_EQ(e4m3(1.1875f), 0x3a);                // a tie between 1.125 and 1.25 goes to 1.25
  EXPECT_EQ(e4m3(-0.0f), 0x80);
  EXPECT_EQ(float(opforge::Float8_e4m3fn::from_bits(0x01)), std::ldexp(1.0f, -9));
  EXPECT_EQ(float(opforge::Float8_e4m3fn::from_bits(0xfe)), -448.0f);
  EXPECT_TRUE(std::isnan(float(opforge::Float8_e4m3fn::from_bits(0x7f))));
}

TEST(Float8, E5m2RoundsAsTorchDoes) {
  EXPECT_EQ(e5m2(1.0f), 0x3c);
  EXPECT_EQ(e5m2(57344.0f), 0x7b);
  EXPECT_EQ(e5m2(61439.0f), 0x7b);
  EXPECT_EQ(e5m2(61440.0f), 0x7c);  // the tie with 65536 rounds to the even mantissa: infinity
  EXPECT_EQ(e5m2(-std::numeric_limits<float>::infinity()), 0xfc);
  EXPECT_EQ(e5m2(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(float(opforge::Float8_e5m2::from_bits(0x7c)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(float(opforge::Float8_e5m2::from_bits(0x03)), std::ldexp(3.0f, -16));
}

TEST(Float8, E8m0fnuRoundsTheExponentAsTorchDoes) {
  EXPECT_EQ(e8m0(1.0f), 127);
  EXPECT_EQ(e8m0(-4.0f), 129);  // no sign
  EXPECT_EQ(e8m0(1.5f), 128);   // guard and round bits set: up
  EXPECT_EQ(e8m0(1.25f), 127);  // guard clear: down
  EXPECT_EQ(e8m0(0.0f), 0);     // 2^-127
  EXPECT_EQ(e8m0(std::numeric_limits<float>::infinity()), 0xff);
  EXPECT_EQ(float(opforge::Float8_e8m0fnu::from_bits(0)), std::ldexp(1.0f, -127));
  EXPECT_EQ(float(opforge::Float8_e8m0fnu::from_bits(130)), 8.0f);
  EXPECT_TRUE(std::isnan(float(opforge::Float8_e8m0fnu::from_bits(0xff))));
}

TEST(Float8, SaturatedClampsToTheLargestFiniteValueAndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(opforge::Float8_e4m3fn::saturated(470.0f).bits, 0x7e);
  EXPECT_EQ(opforge::Float8_e4m3fn::saturated(-inf).bits, 0xfe);
  EXPECT_EQ(opforge::Float8_e4m3fn::saturated(1.0f).bits, 0x38);
  EXPECT_TRUE(std::isnan(float(opforge::Float8_e4m3fn::saturated(std::nanf("")))));
  EXPECT_EQ(opforge::Float8_e5m2::saturated(inf).bits, 0x7b);
  EXPECT_EQ(opforge::Float8_e5m2::saturated(-1e6f).bits, 0xfb);
}

TEST(Float8, VisitHandsOutTheHostTypes) {
  int seen = 0;
  for (opforge::Dtype d : {opforge::kFloat8_e4m3fn, opforge::kFloat8_e5m2, opforge::kFloat8_e8m0fnu})
    opforge::visit_dtype<opforge::float8 | opforge::kFloat8_e8m0fnu>(d, [&]<class T>(opforge::type_tag<T>) {
      static_assert(sizeof(T) == 1);
      seen += std::is_same_v<T, opforge::Float8_e4m3fn> + 2 * std::is_same_v<T, opforge::Float8_e5m2> +
              4 * std::is_same_v<T, opforge::Float8_e8m0fnu>;
    });
  EXPECT_EQ(seen, 7);
  EXPECT_FALSE(opforge::floating.contains(opforge::kFloat8_e4m3fn));
  EXPECT_TRUE(opforge::float8.contains(opforge::kFloat8_e5m2));
  EXPECT_FALSE(opforge::float8.contains(opforge::kFloat8_e8m0fnu));
  EXPECT_STREQ(opforge::dtype_name(opforge::kFloat8_e8m0fnu), "float8_e8m0fnu");
  EXPECT_EQ(opforge::dtype_size(opforge::kFloat8_e4m3fn), 1u);
}

}  // namespace float8_tests
