// What kernels see (opforge/tensor.h): the context's scratch memory.
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

}  // namespace
