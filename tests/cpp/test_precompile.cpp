// Precompile requests (src/core/precompile.cpp): checked as calls are, with the same messages.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <string>
#include <vector>

#include "../../src/core/precompile.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Precompile, RequestsAreCheckedAsCallsAre) {
  auto def = finalized(opforge::detail::make_op("ns", "pc", "f.cpp", 1)
                           .input("x", opforge::kFloat16 | opforge::kFloat32)
                           .input("w", opforge::same_dtype("x"))
                           .param<int64_t>("k", 4, opforge::one_of({4, 8}), opforge::compile_time)
                           .output("y", opforge::like("x"))
                           .reference(+[](Tensor, Tensor, int64_t, MutableTensor) {})
                           .cuda_source("pc.cu", "pc<{T}, {k}>")
                           .launch(opforge::elementwise("y"))
                           .release());
  std::vector<OpforgeValue> values(3);
  values[2].kind = OPFORGE_ARG_INT;
  values[2].i = 5;
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {OPFORGE_DTYPE_FLOAT64, OPFORGE_DTYPE_FLOAT16, -1}, values,
                                        "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n"
            "  x: expected dtype one of {float32, float16}, got float64\n"
            "  k: expected one of 4, 8, got 5");
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {OPFORGE_DTYPE_FLOAT32, OPFORGE_DTYPE_FLOAT16, -1}, values,
                                        "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n"
            "  w: expected dtype float32 (the dtype of x), got float16\n"
            "  k: expected one of 4, 8, got 5");
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {OPFORGE_DTYPE_FLOAT16, -1, -1}, values, "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n  k: expected one of 4, 8, got 5")
      << "w's dtype follows from x's (same_dtype)";
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {-1, -1, -1}, values, "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n  x: expected a dtype, got none\n"
            "  w: expected a dtype, got none\n  k: expected one of 4, 8, got 5");
}

}  // namespace
