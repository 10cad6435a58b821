// Dtype facts (src/core/dtypes.cpp): the combinations the rules accept, per device, and the
// declaration checks of autocast policies and tolerances.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <limits>
#include <string>
#include <vector>

#include "../../src/core/dtypes.h"
#include "../../src/core/precompile.h"
#include "../../src/core/schema.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(MixedDtypes, EveryCombinationTheRulesAccept) {
  auto def = norm_op();
  using C = std::vector<int32_t>;
  constexpr int32_t f32 = OPFORGE_DTYPE_FLOAT32, f64 = OPFORGE_DTYPE_FLOAT64, f16 = OPFORGE_DTYPE_FLOAT16,
                    bf16 = OPFORGE_DTYPE_BFLOAT16;
  EXPECT_EQ(opforge::core::dtype_combinations(*def->spec()),
            (std::vector<C>{{f32, f32}, {f64, f32}, {f64, f64}, {f16, f32}, {f16, f16}, {bf16, f32}, {bf16, bf16}}));
  EXPECT_EQ(opforge::core::dtype_combinations(*def->spec(), 2).size(), 2u);
}

TEST(KernelDtypes, CombinationsPerDeviceAndPrecompileFollowTheKernel) {
  auto def = half_kernel_op();
  const OpforgeOpSpec& op = *def->spec();
  EXPECT_EQ(opforge::core::dtype_combinations_on(op, OPFORGE_DEVICE_CPU).size(), 4u);
  const auto cuda = opforge::core::dtype_combinations_on(op, OPFORGE_DEVICE_CUDA);
  ASSERT_EQ(cuda.size(), 2u);
  for (const auto& c : cuda) EXPECT_TRUE(c[0] == OPFORGE_DTYPE_FLOAT16 || c[0] == OPFORGE_DTYPE_BFLOAT16) << c[0];
  const json d = describe({def.get()});
  EXPECT_EQ(d["ops"][0]["dtype_combinations"].size(), 4u);
  EXPECT_EQ(d["ops"][0]["dtype_combinations_on"]["cpu"].size(), 4u);
  EXPECT_EQ(d["ops"][0]["dtype_combinations_on"]["cuda"],
            json::parse(R"([{"x": "float16", "w": "float16"}, {"x": "bfloat16", "w": "bfloat16"}])"));
  std::vector<OpforgeValue> values(2);
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(op, {OPFORGE_DTYPE_FLOAT32, -1}, values, "sm_90", "");
            }),
            "ns::hk(Tensor x, Tensor w) -> Tensor: invalid arguments\n"
            "  x: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no other), got float32");
  // A set wider than the input admits keeps only what it admits (the message lists no other).
  auto wide = finalized(opforge::detail::make_op("ns", "wide", "f.cpp", 1)
                            .input("x", opforge::kFloat16 | opforge::kFloat32)
                            .output("y", opforge::like("x"))
                            .reference(+[](Tensor, MutableTensor) {})
                            .cuda_source("w.cu", "w<{T}>")
                            .launch(opforge::elementwise("y"))
                            .kernel_dtypes("x", opforge::kFloat16 | opforge::kBFloat16 | opforge::kFloat64)
                            .release());
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*wide->spec(), {OPFORGE_DTYPE_FLOAT32}, std::vector<OpforgeValue>(1), "sm_90",
                                        "");
            }),
            "ns::wide(Tensor x) -> Tensor: invalid arguments\n"
            "  x: expected dtype float16 on cuda (its cuda kernel takes no other), got float32");
  auto plain = finalized(opforge::detail::make_op("ns", "plain", "f.cpp", 1)
                             .input("x", opforge::floating)
                             .output("y", opforge::like("x"))
                             .reference(+[](Tensor, MutableTensor) {})
                             .release());
  EXPECT_TRUE(opforge::core::dtype_combinations_on(*plain->spec(), OPFORGE_DEVICE_CUDA).empty())
      << "no CUDA kernel, no combination on cuda";
}

TEST(Autocast, APolicyTheDtypeRulesCannotTakeIsADeclarationProblem) {
  auto half_only = opforge::detail::make_op("ns", "half_only", "f.cpp", 9)
                       .input("x", opforge::half_precision)
                       .output("y", opforge::like("x"))
                       .autocast(opforge::Autocast::kFloat32)
                       .reference(unary)
                       .release();
  ASSERT_TRUE(half_only->finalize().empty());
  EXPECT_EQ(opforge::core::autocast_problem(*half_only->spec()),
            "f.cpp:9: ns::half_only: autocast(kFloat32) casts every floating input to float32, which its dtype rules "
            "refuse");
  // The CUDA kernel's dtypes count too (Note [Kernel dtypes]): autocast on CUDA casts for it.
  auto half_kernel = opforge::detail::make_op("ns", "half_kernel", "f.cpp", 10)
                         .input("x", opforge::floating)
                         .output("y", opforge::like("x"))
                         .autocast(opforge::Autocast::kFloat32)
                         .reference(unary)
                         .cuda_source("k.cu", "k<{T}>")
                         .launch(opforge::elementwise("y"))
                         .kernel_dtypes("x", opforge::half_precision)
                         .release();
  ASSERT_TRUE(half_kernel->finalize().empty());
  EXPECT_EQ(opforge::core::autocast_problem(*half_kernel->spec()),
            "f.cpp:10: ns::half_kernel: autocast(kFloat32) casts every floating input to float32, which its cuda "
            "kernel's dtypes (kernel_dtypes) refuse");
  auto norm = norm_op();  // weight: x's dtype or float32, so every floating input may be float32 or bfloat16
  EXPECT_TRUE(opforge::core::accepts_floating_as(*norm->spec(), OPFORGE_DTYPE_FLOAT32));
  EXPECT_TRUE(opforge::core::accepts_floating_as(*norm->spec(), OPFORGE_DTYPE_BFLOAT16));
  EXPECT_FALSE(opforge::core::accepts_floating_as(*norm->spec(), OPFORGE_DTYPE_INT32));
  EXPECT_EQ(opforge::core::autocast_policy(*norm->spec()), OPFORGE_AUTOCAST_NONE);
  EXPECT_EQ(opforge::core::autocast_problem(*norm->spec()), "");
  // kPromote: an x of float16 beside a weight that is float32 only would be cast to float32.
  auto promote = opforge::detail::make_op("ns", "promote", "f.cpp", 11)
                     .input("x", opforge::half_precision)
                     .input("w", opforge::kFloat32)
                     .output("y", opforge::like("x"))
                     .autocast(opforge::Autocast::kPromote)
                     .reference(two_inputs)
                     .release();
  ASSERT_TRUE(promote->finalize().empty());
  EXPECT_EQ(opforge::core::autocast_problem(*promote->spec()),
            "f.cpp:11: ns::promote: autocast(kPromote) casts every floating input to the widest among them, float32 "
            "for inputs of x=float16, w=float32, which its dtype rules refuse");
  auto unknown = opforge::detail::make_op("ns", "unknown", "f.cpp", 12)
                     .input("x", opforge::floating)
                     .output("y", opforge::like("x"))
                     .autocast(static_cast<opforge::Autocast>(7))
                     .reference(unary)
                     .release();
  ASSERT_TRUE(unknown->finalize().empty());
  EXPECT_EQ(opforge::core::autocast_problem(*unknown->spec()),
            "f.cpp:12: ns::unknown: autocast policy 7 is not one of kNone, kFloat32, kLowerPrecision, kPromote");
}

TEST(Tolerance, BrokenDeclarationsAreListedAndGoodOnesKept) {
  auto broken = opforge::detail::make_op("ns", "tol", "f.cpp", 13)
                    .input("x", opforge::floating)
                    .output("y", opforge::like("x"))
                    .tolerance(opforge::kInt32, 1e-3, 1e-3)
                    .tolerance(opforge::kBFloat16, -1e-2, 1e-2)
                    .tolerance(opforge::kBFloat16, 1e-2, std::numeric_limits<double>::quiet_NaN())
                    .reference(unary)
                    .release();
  ASSERT_TRUE(broken->finalize().empty());
  EXPECT_EQ(opforge::core::tolerance_problems(*broken->spec()),
            (std::vector<std::string>{"f.cpp:13: ns::tol: tolerance for int32: expected a floating or float8 dtype",
                                      "f.cpp:13: ns::tol: tolerance for bfloat16: expected atol finite and >= 0, got "
                                      "-0.010000",
                                      "f.cpp:13: ns::tol: tolerance for bfloat16 declared twice",
                                      "f.cpp:13: ns::tol: tolerance for bfloat16: expected rtol finite and >= 0, got "
                                      "nan"}));
  auto good = opforge::detail::make_op("ns", "tol_ok", "f.cpp", 14)
                  .input("x", opforge::floating)
                  .output("y", opforge::like("x"))
                  .tolerance(opforge::kFloat16, 8e-3, 4e-3)
                  .reference(unary)
                  .release();
  ASSERT_TRUE(good->finalize().empty());
  EXPECT_TRUE(opforge::core::tolerance_problems(*good->spec()).empty());
  const auto kept = opforge::core::tolerances(*good->spec());
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].dtype, OPFORGE_DTYPE_FLOAT16);
  EXPECT_EQ(kept[0].atol, 8e-3);
  EXPECT_EQ(kept[0].rtol, 4e-3);
  EXPECT_EQ(opforge::core::tolerance_vs_equivalent(*good->spec()), 0.0);  // not declared
}

TEST(Tolerance, AFactorOverTheEquivalentNeedsOneAndMustBeFinite) {
  const auto problems = [](double factor, bool with_equivalent) {
    auto b = opforge::detail::make_op("ns", "eqtol", "f.cpp", 15)
                 .input("x", opforge::floating)
                 .output("y", opforge::like("x"))
                 .tolerance_vs_equivalent(factor)
                 .reference(unary);
    auto op = (with_equivalent ? std::move(b).equivalent("x.clone()") : std::move(b)).release();
    EXPECT_TRUE(op->finalize().empty());
    EXPECT_EQ(opforge::core::tolerance_vs_equivalent(*op->spec()), factor);
    return opforge::core::tolerance_problems(*op->spec());
  };
  EXPECT_TRUE(problems(2.0, true).empty());
  EXPECT_TRUE(problems(0.0, false).empty());  // 0: not declared
  EXPECT_EQ(problems(2.0, false),
            (std::vector<std::string>{"f.cpp:15: ns::eqtol: tolerance_vs_equivalent needs the .equivalent() torch "
                                      "expression it is measured against"}));
  EXPECT_EQ(problems(-1.0, true), (std::vector<std::string>{"f.cpp:15: ns::eqtol: tolerance_vs_equivalent: expected "
                                                            "a finite factor >= 0, got -1.000000"}));
  EXPECT_EQ(problems(std::numeric_limits<double>::infinity(), true),
            (std::vector<std::string>{"f.cpp:15: ns::eqtol: tolerance_vs_equivalent: expected a finite factor >= 0, "
                                      "got inf"}));
}

}  // namespace
