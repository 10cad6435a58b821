// Backward-op pairing (src/core/backward.cpp): mismatches listed one per line with the
// declaration site, and results whose gradient the backward op does not take.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <memory>
#include <string>
#include <vector>

#include "../../src/core/backward.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(BackwardOps, MismatchesAreListedOnePerLineWithTheDeclarationSite) {
  auto fwd = finalized(opforge::detail::make_op("ns", "f", "f.cpp", 3)
                           .input("x", opforge::floating)
                           .param<double>("alpha")
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  auto bwd = finalized(opforge::detail::make_op("ns", "f_backward", "f.cpp", 9)
                           .input("grad_z", opforge::floating)
                           .param<int64_t>("alpha")
                           .output("dx", opforge::like("grad_z"))
                           .reference(+[](Tensor, int64_t, MutableTensor) {})
                           .release());
  std::vector<std::string> problems;
  opforge::core::plan_backward(*fwd->spec(), *bwd->spec(), problems);
  EXPECT_EQ(problems,
            (std::vector<std::string>{
                "f.cpp:3: ns::f: backward op ns::f_backward: input 'grad_z' matches nothing of the forward op: "
                "expected one of grad_y, x, alpha, y",
                "f.cpp:3: ns::f: backward op ns::f_backward: input 'alpha' is int, but the forward op's alpha "
                "is float",
                "f.cpp:3: ns::f: backward op ns::f_backward: output 'dx' is not the gradient of a tensor input: "
                "expected one of grad_x, or grad_<a>_and_<b> for one gradient of several"}));
}

TEST(BackwardOps, AResultWhoseGradientTheBackwardOpDoesNotTakeIsNotDifferentiable) {
  auto fwd = finalized(opforge::detail::make_op("ns", "two", "f.cpp", 3)
                           .input("x", opforge::floating)
                           .output("y", opforge::like("x"))
                           .output("stat", opforge::like("x"))
                           .reference(+[](Tensor, MutableTensor, MutableTensor) {})
                           .release());
  auto bwd = finalized(opforge::detail::make_op("ns", "two_backward", "f.cpp", 9)
                           .input("grad_y", opforge::floating)
                           .input("stat", opforge::floating)
                           .output("grad_x", opforge::like("grad_y"))
                           .reference(+[](Tensor, Tensor, MutableTensor) {})
                           .release());
  std::vector<std::string> problems;
  const auto plan = opforge::core::plan_backward(*fwd->spec(), *bwd->spec(), problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(plan.differentiable, (std::vector<bool>{true, false}));  // stat is saved, not differentiated
}

std::vector<std::string> backward_problems(std::unique_ptr<opforge::detail::OpDef> fwd,
                                           std::unique_ptr<opforge::detail::OpDef> bwd) {
  fwd->finalize();
  bwd->finalize();
  std::vector<std::string> problems;
  opforge::core::plan_backward(*fwd->spec(), *bwd->spec(), problems);
  return problems;
}

TEST(BackwardOps, GradientsAndOutputsAreTensors) {
  auto fwd = opforge::detail::make_op("ns", "g", "f.cpp", 3)
                 .input("x", opforge::floating)
                 .output("y", opforge::like("x"))
                 .reference(+[](Tensor, MutableTensor) {})
                 .release();
  auto bwd = opforge::detail::make_op("ns", "g_backward", "f.cpp", 5)
                 .input("x", opforge::floating)
                 .param<double>("grad_y")
                 .param<double>("y")
                 .output("grad_x", opforge::like("x"))
                 .reference(+[](Tensor, double, double, MutableTensor) {})
                 .release();
  EXPECT_EQ(backward_problems(std::move(fwd), std::move(bwd)),
            (std::vector<std::string>{
                "f.cpp:3: ns::g: backward op ns::g_backward: input 'grad_y' is float, but a gradient is a Tensor",
                "f.cpp:3: ns::g: backward op ns::g_backward: input 'y' is float, but the forward op's output y is a "
                "Tensor"}));
}

}  // namespace
