// Dtypes as kernels see them (opforge/dtype.h): visiting a dtype outside the kernel's set.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <string>

#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Dtype, VisitingADtypeOutsideTheSetSaysSo) {
  EXPECT_EQ(message_of<opforge::InvalidArgument>(
                [] { opforge::visit_dtype<opforge::floating>(opforge::kInt32, []<class T>(opforge::type_tag<T>) {}); }),
            "opforge::visit_dtype: dtype int32 is not in the set this kernel was instantiated for");
}

}  // namespace
