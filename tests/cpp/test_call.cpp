// The call protocol (src/core/call.h): layout admission, the empty-output skip, kernel failures,
// parameter defaults and the host check of value domains.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "../../src/core/call.h"
#include "../../src/core/sizes.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

OpforgeTensor view(void* data, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  return {data,         OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, static_cast<int32_t>(sizes.size()),
          sizes.data(), strides.data()};
}

TEST(CallProtocol, LayoutAdmission) {
  using opforge::core::Admission;
  using opforge::core::admit;
  alignas(16) float buf[64];
  OpforgeTensorSpec dense{}, strided{}, rows{};
  dense.layout = OPFORGE_LAYOUT_CONTIGUOUS;
  strided.layout = OPFORGE_LAYOUT_STRIDED;
  rows.layout = OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM;
  const std::vector<int64_t> s24{2, 4}, c24{4, 1}, t24{1, 2}, p24{8, 1}, s20{2, 0}, any{3, 7};
  EXPECT_EQ(admit(dense, view(buf, s24, c24), 4), Admission::kAsIs);
  EXPECT_EQ(admit(dense, view(buf + 1, s24, c24), 4), Admission::kDenseCopy);  // misaligned
  EXPECT_EQ(admit(dense, view(buf, s24, t24), 4), Admission::kDenseCopy);      // transposed
  EXPECT_EQ(admit(dense, view(buf, s20, any), 4), Admission::kAsIs);           // no elements
  EXPECT_EQ(admit(strided, view(buf + 1, s24, t24), 4), Admission::kAsIs);
  EXPECT_EQ(admit(rows, view(buf, s24, p24), 4), Admission::kAsIs);       // padded rows, 32-byte row stride
  EXPECT_EQ(admit(rows, view(buf, s24, t24), 4), Admission::kDenseCopy);  // last dim not adjacent
  const std::vector<int64_t> p25{2, 5}, r25{5, 1};
  EXPECT_EQ(admit(rows, view(buf, p25, r25), 4), Admission::kDenseCopy);  // 20-byte rows
}

TEST(CallProtocol, LaunchIsSkippedOnlyWhenEveryOutputIsEmpty) {
  float buf[4];
  const std::vector<int64_t> s40{4, 0}, s4{4}, st{1, 1}, st1{1};
  using opforge::core::skip_launch;
  const std::vector<OpforgeTensor> empty{view(buf, s40, st)}, one_not{view(buf, s40, st), view(buf, s4, st1)}, none;
  EXPECT_TRUE(skip_launch(empty));
  EXPECT_FALSE(skip_launch(one_not));
  EXPECT_FALSE(skip_launch(none));  // an op without outputs (it writes its inputs) always runs
}

int32_t fails_invalid(const OpforgeCallFrame* f, const void*) {
  std::snprintf(f->error, f->error_capacity, "k must be even");
  return OPFORGE_STATUS_INVALID_ARGUMENT;
}
int32_t fails_internal(const OpforgeCallFrame* f, const void*) {
  std::snprintf(f->error, f->error_capacity, "device on fire");
  return OPFORGE_STATUS_INTERNAL;
}

TEST(CallProtocol, KernelFailuresNameTheOpOnce) {
  auto def = finalized(opforge::detail::make_op("ns", "k", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<double>("alpha")
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  OpforgeContext ctx{sizeof(OpforgeContext), OPFORGE_DEVICE_CUDA, 1, nullptr, nullptr, nullptr};
  std::vector<OpforgeArg> args(2);
  OpforgeKernel k{sizeof(OpforgeKernel), OPFORGE_DEVICE_CUDA, fails_invalid, nullptr};
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] { opforge::core::call_kernel(*def->spec(), k, ctx, args, {}); }),
            "ns::k: k must be even");
  k.fn = fails_internal;
  EXPECT_EQ(message_of<opforge::InternalError>([&] { opforge::core::call_kernel(*def->spec(), k, ctx, args, {}); }),
            "ns::k (cuda:1 kernel): device on fire");
}

TEST(CallProtocol, AParameterLeftOutTakesItsDefault) {
  auto def = finalized(opforge::detail::make_op("ns", "d", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<std::vector<int64_t>>("pads", std::vector<int64_t>{})
                           .output("y", opforge::like("x"))
                           .reference(with_ints)
                           .release());
  const OpforgeValue& v = opforge::core::default_value(*def->spec(), 1);
  EXPECT_EQ(v.kind, OPFORGE_ARG_INT_LIST);
  EXPECT_EQ(v.len, 0u);
  auto req = finalized(opforge::detail::make_op("ns", "r", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<double>("alpha")
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  EXPECT_EQ(
      message_of<opforge::InvalidArgument>([&] { opforge::core::default_value(*req->spec(), 1); }),
      "ns::r(Tensor x, float alpha) -> Tensor: invalid arguments\n  alpha: expected a value of type float, got None");
}

std::unique_ptr<opforge::detail::OpDef> index_op() {
  return finalized(
      opforge::detail::make_op("ns", "gather", "f.cpp", 1)
          .input("table", opforge::floating, opforge::rank(2))
          .input("rows", opforge::kInt64, opforge::rank(1), opforge::values_in(0, opforge::dim("table", 0)))
          .input("slots", opforge::kInt32, opforge::rank(1), opforge::values_in(0, 8).unique_values().or_value(-1))
          .output("y", opforge::like("table"))
          .reference(three_inputs)
          .release());
}

TEST(ValueDomains, HostCallsCheckTheValues) {
  auto def = index_op();
  float table[12] = {0};
  int64_t rows[3] = {0, 2, 5};
  int32_t slots[4] = {3, -1, 7, 3};
  const std::vector<int64_t> ts{4, 3}, tst{3, 1}, rs{3}, rst{1}, ss{4}, sst{1};
  std::vector<OpforgeArg> args(3);
  args[0].tensor = {table, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 2, ts.data(), tst.data()};
  args[1].tensor = {rows, OPFORGE_DTYPE_INT64, OPFORGE_DEVICE_CPU, -1, 1, rs.data(), rst.data()};
  args[2].tensor = {slots, OPFORGE_DTYPE_INT32, OPFORGE_DEVICE_CPU, -1, 1, ss.data(), sst.data()};
  EXPECT_EQ(opforge::core::value_problems(*def->spec(), args),
            (std::vector<std::string>{"rows: expected values in [0, table.size(0)) = [0, 4), got 5 at [2]",
                                      "slots: expected distinct values (but -1), got 3 at [0] and [3]"}));
  rows[2] = 3;
  slots[3] = -1;  // the marker may repeat
  EXPECT_TRUE(opforge::core::value_problems(*def->spec(), args).empty());
  slots[0] = 8;
  EXPECT_EQ(opforge::core::value_problems(*def->spec(), args),
            (std::vector<std::string>{"slots: expected values in [0, 8) or -1, got 8 at [0]"}));
  const json arg = describe({def.get()})["ops"][0]["args"][2];
  EXPECT_EQ(arg["values"], json::parse(R"({"low": "0", "high": "8", "unique": true, "sentinel": -1})"));
  std::vector<OpforgeValue> values(3);
  const auto facts = opforge::core::example_facts(*def->spec(), {{5, 3}, {2}, {4}}, values);
  EXPECT_EQ(facts.bounds[1], std::make_pair(int64_t{0}, int64_t{5}));
  EXPECT_EQ(facts.bounds[2], std::make_pair(int64_t{0}, int64_t{8}));
  EXPECT_FALSE(facts.bounds[0].has_value());
}

}  // namespace
