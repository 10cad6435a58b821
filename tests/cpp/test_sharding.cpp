// Sharding facts (src/core/sharding.cpp): the dims other inputs follow, and the inputs a batching
// transform may batch in one call.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <map>
#include <vector>

#include "../../src/core/sharding.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Sharding, InputsFollowTheFirstInputsDimsThroughTheirShapeRules) {
  auto def =
      finalized(opforge::detail::make_op("ns", "attn", "f.cpp", 1)
                    .sharding(opforge::shard_dims({0, 1}))
                    .input("q", opforge::floating, opforge::rank(4))
                    .input("k", opforge::same_dtype("q"), opforge::same_shape("q"))
                    .input("mask", opforge::floating, opforge::shape({opforge::dim("q", 0), opforge::dim("q", -2)}))
                    .output("y", opforge::like("q"))
                    .reference(three_inputs)
                    .release());
  const auto maps = opforge::core::follow_dims(*def->spec());
  EXPECT_EQ(maps.at(0), (std::map<int32_t, int32_t>{{0, 0}, {1, 1}}));
  EXPECT_EQ(maps.at(1), (std::map<int32_t, int32_t>{{0, 0}, {1, 1}}));  // same_shape of q
  EXPECT_EQ(maps.at(2), (std::map<int32_t, int32_t>{{0, 0}, {2, 1}}));  // q's dim -2 is dim 2 of 4
  const json op = describe({def.get()})["ops"][0];
  EXPECT_EQ(op["sharding"], "dims");
  EXPECT_EQ(op["sharding_dims"], json::parse("[0, 1]"));
  EXPECT_EQ(op["args"][2]["follows"], json::parse("[[0, 0], [2, 1]]"));
}

TEST(Batching, APointwiseOrRowwiseOpOfFreeRankTakesTheBatchAtItsFirstInput) {
  auto rowwise = opforge::detail::make_op("ns", "rownorm", "f.cpp", 10)
                     .input("x", opforge::floating, opforge::shape({opforge::leading_dims, opforge::any}))
                     .input("weight", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
                     .output("y", opforge::like("x"))
                     .sharding(opforge::Sharding::kRowwise)
                     .reference(two_inputs)
                     .release();
  ASSERT_TRUE(rowwise->finalize().empty());
  EXPECT_EQ(opforge::core::batchable_args(*rowwise->spec()), (std::vector<int32_t>{0}));
  auto front = opforge::detail::make_op("ns", "front", "f.cpp", 11)  // reads x.size(0): a batch would shift it
                   .input("x", opforge::floating, opforge::min_rank(1))
                   .input("weight", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", 0)}))
                   .output("y", opforge::like("x"))
                   .sharding(opforge::Sharding::kPointwise)
                   .reference(two_inputs)
                   .release();
  ASSERT_TRUE(front->finalize().empty());
  EXPECT_TRUE(opforge::core::batchable_args(*front->spec()).empty());
  EXPECT_TRUE(opforge::core::batchable_args(*norm_op()->spec()).empty());  // no sharding kind declared
}

}  // namespace
