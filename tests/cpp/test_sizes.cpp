// Example sizes (src/core/sizes.cpp): input shapes that satisfy an op's shape rules, and the
// facts verify picks sizes by.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <string>
#include <vector>

#include "../../src/core/sizes.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(ExampleShapes, FreeDimsRulesAndMultiples) {
  auto def = finalized(opforge::detail::make_op("ns", "mix", "f.cpp", 1)
                           .input("x", opforge::floating, opforge::min_rank(1))
                           .input("w", opforge::same_dtype("x"), opforge::same_shape("x"),
                                  opforge::shape({opforge::any, opforge::multiple_of(8)}))
                           .input("b", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1) + 1}))
                           .output("y", opforge::like("x"))
                           .reference(three_inputs)
                           .release());
  const std::vector<OpforgeValue> values(3);
  const auto shapes = opforge::core::example_shapes(*def->spec(), 3, 37, values);
  // w's multiple_of(8) applies to x, whose shape w copies: 37 becomes 40.
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{3, 40}));
  EXPECT_EQ(shapes[1], (std::vector<int64_t>{3, 40}));
  EXPECT_EQ(shapes[2], (std::vector<int64_t>{41}));
  const auto empty = opforge::core::example_shapes(*def->spec(), 0, 0, values);
  EXPECT_EQ(empty[0], (std::vector<int64_t>{0, 0}));
}

TEST(Rules, ExampleFactsNameTheRulesSizesBreak) {
  auto def = rules_op();
  std::vector<OpforgeValue> values(3);
  values[2].kind = OPFORGE_ARG_INT;
  values[2].i = 4;
  const auto facts = opforge::core::example_facts(*def->spec(), {{3, 37}, {3, 37}, {}}, values);
  EXPECT_EQ(facts.rule_problems, (std::vector<std::string>{"expected x.size(-1) % block == 0, got 1 == 0"}));
  EXPECT_TRUE(opforge::core::example_facts(*def->spec(), {{3, 40}, {3, 40}, {}}, values).rule_problems.empty());
}

}  // namespace
