// The op-library runtime (src/oplib/op_library.cpp): what OpDef::finalize refuses in a declaration.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <string>
#include <vector>

#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(ValueDomains, OnlyIntegerInputsIndex) {
  auto def = opforge::detail::make_op("ns", "bad", "f.cpp", 7)
                 .input("x", opforge::floating, opforge::values_in(0, opforge::any))
                 .output("y", opforge::like("x"))
                 .reference(+[](Tensor, MutableTensor) {})
                 .release();
  EXPECT_EQ(
      declaration_problems(*def),
      (std::vector<std::string>{"f.cpp:7: ns::bad: input 'x': values_in(): opforge::any is allowed only in an "
                                "input's shape({...})",
                                "f.cpp:7: ns::bad: input 'x': values_in() applies to integer inputs, but its dtypes "
                                "include float32"}));
}

}  // namespace
