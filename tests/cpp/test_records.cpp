// The accessors of the C ABI records (src/core/records.h): a record whose struct_size stops
// before a field appended later reads as one without it (Note [ABI versioning]).
#include <gtest/gtest.h>

#include <cstddef>

#include "../../src/core/records.h"
#include "opforge/c_api.h"

namespace {

TEST(Records, HasFieldComparesStructSizeWithTheFieldsEnd) {
  OpforgeOpSpec op{};
  op.struct_size = offsetof(OpforgeOpSpec, tolerances);
  EXPECT_TRUE(OPFORGE_HAS_FIELD(OpforgeOpSpec, op, autocast));
  EXPECT_TRUE(OPFORGE_HAS_FIELD(OpforgeOpSpec, op, num_tolerances));  // in the tail padding of ABI 5's record
  EXPECT_FALSE(OPFORGE_HAS_FIELD(OpforgeOpSpec, op, tolerances));
  op.struct_size = offsetof(OpforgeOpSpec, tolerances) + sizeof(op.tolerances) - 1;
  EXPECT_FALSE(OPFORGE_HAS_FIELD(OpforgeOpSpec, op, tolerances));
  op.struct_size = sizeof(OpforgeOpSpec);
  EXPECT_TRUE(OPFORGE_HAS_FIELD(OpforgeOpSpec, op, tolerance_vs_equivalent));
}

TEST(Records, AnOpRecordWithoutAppendedFieldsReadsTheirDefaults) {
  const OpforgeTolerance tolerance{OPFORGE_DTYPE_FLOAT16, 1e-2, 1e-2};
  OpforgeOpSpec op{};
  op.equivalent = "x";
  op.sharding = OPFORGE_SHARDING_DIMS;
  op.sharding_dims = 1;
  op.backward = "ns::op_backward";
  op.num_rules = 1;
  op.autocast = OPFORGE_AUTOCAST_FLOAT32;
  op.num_tolerances = 1;
  op.tolerances = &tolerance;
  op.tolerance_vs_equivalent = 2.0;
  op.struct_size = sizeof(OpforgeOpSpec);
  EXPECT_STREQ(opforge::core::equivalent(op), "x");
  EXPECT_EQ(opforge::core::sharding_dims(op), 1u);
  EXPECT_STREQ(opforge::core::backward_name(op), "ns::op_backward");
  EXPECT_EQ(opforge::core::num_rules(op), 1);
  EXPECT_EQ(opforge::core::autocast_policy(op), OPFORGE_AUTOCAST_FLOAT32);
  EXPECT_EQ(opforge::core::tolerances(op).size(), 1u);
  EXPECT_EQ(opforge::core::tolerance_vs_equivalent(op), 2.0);
  op.struct_size = offsetof(OpforgeOpSpec, tolerance_vs_equivalent);
  EXPECT_EQ(opforge::core::tolerance_vs_equivalent(op), 0.0);
  op.struct_size = offsetof(OpforgeOpSpec, tolerances);
  EXPECT_TRUE(opforge::core::tolerances(op).empty());
  op.struct_size = offsetof(OpforgeOpSpec, autocast);
  EXPECT_EQ(opforge::core::autocast_policy(op), OPFORGE_AUTOCAST_NONE);
  op.struct_size = offsetof(OpforgeOpSpec, num_rules);
  EXPECT_EQ(opforge::core::num_rules(op), 0);
  op.struct_size = offsetof(OpforgeOpSpec, backward);
  EXPECT_EQ(opforge::core::backward_name(op), nullptr);
  op.struct_size = offsetof(OpforgeOpSpec, sharding_dims);
  EXPECT_EQ(opforge::core::sharding(op), OPFORGE_SHARDING_NONE);  // DIMS without its dims: none
  op.struct_size = offsetof(OpforgeOpSpec, equivalent);
  EXPECT_EQ(opforge::core::equivalent(op), nullptr);
}

TEST(Records, KernelAndLibraryRecordsWithoutAppendedFields) {
  OpforgeKernel k{};
  k.source = "k.cu";
  k.precompile = +[](OpforgePrecompileRequest*, const void*) { return int32_t{0}; };
  k.struct_size = sizeof(OpforgeKernel);
  EXPECT_TRUE(opforge::core::has_runtime_source(k));
  k.struct_size = offsetof(OpforgeKernel, precompile);
  EXPECT_FALSE(opforge::core::has_runtime_source(k));

  const OpforgeClassSpec* classes[1] = {nullptr};
  OpforgeLibrary lib{};
  lib.kernel_dir = "/k";
  lib.reload = +[] {};
  lib.num_classes = 1;
  lib.classes = classes;
  lib.struct_size = sizeof(OpforgeLibrary);
  EXPECT_STREQ(opforge::core::kernel_dir(lib), "/k");
  EXPECT_NE(opforge::core::reload_entry(lib), nullptr);
  EXPECT_EQ(opforge::core::library_classes(lib).size(), 1u);
  lib.struct_size = offsetof(OpforgeLibrary, num_classes);
  EXPECT_TRUE(opforge::core::library_classes(lib).empty());
  lib.struct_size = offsetof(OpforgeLibrary, kernel_dir);
  EXPECT_EQ(opforge::core::kernel_dir(lib), nullptr);
  EXPECT_EQ(opforge::core::reload_entry(lib), nullptr);
}

}  // namespace
