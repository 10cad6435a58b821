// Loading op libraries (src/core/library.cpp): a file that is not one is refused by name.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <string>

#include "../../src/core/library.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Loading, FilesThatAreNotOpLibraries) {
  EXPECT_EQ(message_of<opforge::InternalError>([] { opforge::core::load_library("/nonexistent/libx.so"); }),
            "opforge: cannot open the op library /nonexistent/libx.so: No such file or directory");
}

}  // namespace
