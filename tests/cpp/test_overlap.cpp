// src/core/overlap.h: whether strided views share memory (Note [Memory overlap]).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "../../src/core/overlap.h"

namespace {

using opforge::core::internal_overlap;
using opforge::core::Overlap;
using opforge::core::overlap;

/// A float32 view of `base` at element `offset`, with its own sizes and strides.
struct View {
  std::vector<int64_t> sizes, strides;
  OpforgeTensor t{};
  View(float* base, int64_t offset, std::vector<int64_t> s, std::vector<int64_t> st)
      : sizes(std::move(s)), strides(std::move(st)) {
    t = {base + offset, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, static_cast<int32_t>(sizes.size()),
         sizes.data(),  strides.data()};
  }
};

Overlap of(const View& a, const View& b) { return overlap(a.t, 4, b.t, 4); }

TEST(Overlap, DisjointRangesAndDenseRanges) {
  std::vector<float> buf(64);
  EXPECT_EQ(of(View(buf.data(), 0, {4}, {1}), View(buf.data(), 4, {4}, {1})), Overlap::kNone);
  EXPECT_EQ(of(View(buf.data(), 0, {4}, {1}), View(buf.data(), 3, {4}, {1})), Overlap::kShared);
  EXPECT_EQ(of(View(buf.data(), 0, {4}, {1}), View(buf.data(), 0, {4}, {1})), Overlap::kShared);
  EXPECT_EQ(of(View(buf.data(), 0, {0}, {1}), View(buf.data(), 0, {4}, {1})), Overlap::kNone);  // no elements
}

TEST(Overlap, HeadSplitViewsOfOneBuffer) {
  std::vector<float> qkv(3 * 96);  // 3 tokens x (q, k, v) x 2 heads x 16
  const View q(qkv.data(), 0, {3, 2, 16}, {96, 16, 1}), k(qkv.data(), 32, {3, 2, 16}, {96, 16, 1});
  EXPECT_EQ(of(q, k), Overlap::kNone);
  const View shifted(qkv.data(), 8, {3, 2, 16}, {96, 16, 1});  // the second head of q in every token
  EXPECT_EQ(of(q, shifted), Overlap::kShared);
  EXPECT_EQ(of(k, View(qkv.data(), 95, {1}, {1})), Overlap::kNone);  // v's last element of token 0
}

TEST(Overlap, ElementsInterleavedOneByOne) {
  std::vector<float> buf(64);
  const View even(buf.data(), 0, {4, 8}, {16, 2}), odd(buf.data(), 1, {4, 8}, {16, 2});
  EXPECT_EQ(of(even, odd), Overlap::kNone);
  EXPECT_EQ(of(even, View(buf.data(), 2, {4, 8}, {16, 2})), Overlap::kShared);
  EXPECT_EQ(of(even, View(buf.data(), 15, {1}, {1})), Overlap::kNone);  // the gap after each row
}

TEST(Overlap, DifferentElementSizesShareBytes) {
  std::vector<double> buf(8);
  const OpforgeTensor doubles{buf.data(), OPFORGE_DTYPE_FLOAT64, OPFORGE_DEVICE_CPU, -1, 0, nullptr, nullptr};
  const int64_t size = 1, stride = 1;
  const OpforgeTensor high_half{
      reinterpret_cast<char*>(buf.data()) + 4, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &size, &stride};
  EXPECT_EQ(overlap(doubles, 8, high_half, 4), Overlap::kShared);  // a 0-dim view: one element
}

TEST(Overlap, StridesThatDoNotNestAreNotDecided) {
  std::vector<float> buf(64);
  const View odd_rows(buf.data(), 0, {3, 2, 16}, {16, 8, 1});               // heads overlap by 8 elements
  EXPECT_EQ(of(odd_rows, View(buf.data(), 63, {1}, {1})), Overlap::kNone);  // past its range: still decided
  EXPECT_EQ(of(odd_rows, View(buf.data(), 40, {1}, {1})), Overlap::kUnknown);
}

TEST(Overlap, InternalOverlap) {
  std::vector<float> buf(64);
  EXPECT_FALSE(internal_overlap(View(buf.data(), 0, {4, 3}, {3, 1}).t));
  EXPECT_FALSE(internal_overlap(View(buf.data(), 0, {3, 4}, {1, 3}).t));  // transposed
  EXPECT_FALSE(internal_overlap(View(buf.data(), 0, {1, 4}, {0, 1}).t));  // stride 0 of a size-1 dim
  EXPECT_TRUE(internal_overlap(View(buf.data(), 0, {4, 3}, {0, 1}).t));   // expanded
  EXPECT_TRUE(internal_overlap(View(buf.data(), 0, {3, 2, 16}, {16, 8, 1}).t));
  EXPECT_FALSE(internal_overlap(View(buf.data(), 0, {2, 2}, {4, 2}).t));  // gaps are fine
}

}  // namespace
