// core::Span (src/core/span.h): a view of the caller's elements that never outlives them.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <array>
#include <type_traits>
#include <vector>

#include "../../src/core/span.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Span, ViewsTheCallersElements) {
  using opforge::core::Span;
  const std::vector<int> v{1, 2, 3};
  const Span<const int> s(v);
  EXPECT_EQ(s.data(), v.data());
  EXPECT_EQ(s.size(), 3u);
  std::array<int, 2> a{4, 5};
  Span<int> m(a);  // a mutable view writes through to its container
  m[1] = 7;
  EXPECT_EQ(a[1], 7);
  auto total = [](Span<const int> x) {
    int t = 0;
    for (int e : x) t += e;
    return t;
  };
  EXPECT_EQ(total(v), 6);
  EXPECT_EQ(total(Span<const int>(v.data() + 1, 2)), 5);
  // A view of a temporary would dangle: it does not convert.
  static_assert(std::is_constructible_v<Span<const int>, std::vector<int>&>);
  static_assert(!std::is_constructible_v<Span<const int>, std::vector<int>>);
  static_assert(!std::is_constructible_v<Span<int>, const std::vector<int>&>);
  static_assert(std::is_constructible_v<Span<const int>, const Span<const int>&&>);  // a view copies
  const Span<const int> none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.begin(), none.end());
}

}  // namespace
