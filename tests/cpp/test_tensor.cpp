// What kernels see (opforge/tensor.h): the context's scratch memory, whether a value check precedes.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <string>

#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Context, AFailedScratchAllocationSaysSo) {
  OpforgeContext c{sizeof(OpforgeContext),
                   OPFORGE_DEVICE_CPU,
                   -1,
                   nullptr,
                   +[](void*, size_t) -> void* { return nullptr; },
                   nullptr};
  EXPECT_EQ(message_of<opforge::InternalError>([&] { opforge::Context(c).allocate(64); }),
            "opforge: scratch allocation failed");
}

TEST(Context, AfterValueCheckIsReadOnlyWhereTheCoreWroteIt) {
  OpforgeContext c{};
  c.struct_size = sizeof(OpforgeContext);
  EXPECT_FALSE(opforge::Context(c).after_value_check());
  c.after_value_check = 1;
  EXPECT_TRUE(opforge::Context(c).after_value_check());
  // A core before ABI 10 passes a shorter record: the field past its end is not read.
  c.struct_size = offsetof(OpforgeContext, after_value_check);
  EXPECT_FALSE(opforge::Context(c).after_value_check());
}

}  // namespace
