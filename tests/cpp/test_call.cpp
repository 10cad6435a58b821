// The call protocol (src/core/call.h): layout admission, the empty-output skip, kernel failures,
// parameter defaults, the host check of value domains, and run_call's order of steps.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../../src/core/call.h"
#include "../../src/core/device_checks.h"
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
  OpforgeContext ctx{sizeof(OpforgeContext), OPFORGE_DEVICE_CUDA, 1, nullptr, nullptr, nullptr, 0};
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

// run_call owns the order of a call's steps (Note [The call protocol]); the hooks record what the
// driver asked of the adapter, so each test sees the sequence itself.
namespace run_call_tests {

using namespace opforge_test;  // NOLINT: the shared fixtures
namespace core = opforge::core;

void accumulate(Tensor, MutableTensor, MutableTensor) {}

/// What the kernel entry saw: the data pointers of its arguments and outputs.
struct Seen {
  std::vector<const void*> args, outputs;
  int calls = 0;
};
int32_t record(const OpforgeCallFrame* f, const void* user) {
  auto* seen = const_cast<Seen*>(static_cast<const Seen*>(user));
  ++seen->calls;
  for (int32_t i = 0; i < f->num_args; ++i) seen->args.push_back(f->args[i].tensor.data);
  for (int32_t k = 0; k < f->num_outputs; ++k) seen->outputs.push_back(f->outputs[k].data);
  return OPFORGE_STATUS_OK;
}

/// Host memory the hooks hand out, and a log of every hook call in order.
struct Recorder final : core::CallHooks {
  std::vector<std::string> log;
  std::vector<std::vector<float>> memory;
  std::vector<std::vector<int64_t>> shapes;
  OpforgeTensor given_out{};  // an out= call's tensor, as the caller passed it

  OpforgeTensor dense(std::vector<int64_t> sizes) {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    memory.emplace_back(static_cast<size_t>(n), 0.0f);
    shapes.push_back(sizes);
    std::vector<int64_t>& strides = shapes.emplace_back(sizes.size(), 1);
    for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
    const std::vector<int64_t>& s = shapes[shapes.size() - 2];
    return {
        memory.back().data(), OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, static_cast<int32_t>(s.size()), s.data(),
        strides.data()};
  }
  OpforgeTensor output(int32_t k, int32_t, core::Span<const int64_t> sizes) override {
    log.push_back("output " + std::to_string(k));
    return given_out.data != nullptr ? given_out : dense({sizes.begin(), sizes.end()});
  }
  OpforgeTensor temporary(int32_t k) override {
    log.push_back("temporary " + std::to_string(k));
    return dense({given_out.sizes, given_out.sizes + given_out.ndim});
  }
  void copy_back(int32_t k) override { log.push_back("copy_back " + std::to_string(k)); }
  OpforgeTensor dense_copy(int32_t arg) override {
    log.push_back("dense_copy " + std::to_string(arg));
    return dense({4});
  }
  void fill(const OpforgeTensor&, uint8_t byte) override { log.push_back("fill " + std::to_string(byte)); }
  OpforgeContext context() override {
    log.push_back("context");
    return {sizeof(OpforgeContext), OPFORGE_DEVICE_CPU, -1, nullptr, nullptr, nullptr, 0};
  }
};

struct Fixture {
  std::unique_ptr<opforge::detail::OpDef> def;
  OpforgeKernel kernel{};
  Seen seen;
  explicit Fixture(std::unique_ptr<opforge::detail::OpDef> d) : def(finalized(std::move(d))) {
    kernel = {sizeof(OpforgeKernel), OPFORGE_DEVICE_CPU, record, &seen};
  }
  const OpforgeOpSpec& op() const { return *def->spec(); }
};

core::ArgInfo<int64_t> info_of(const OpforgeTensor& t) {
  core::ArgInfo<int64_t> i;
  i.dtype = t.dtype;
  i.dtype_label = "float32";
  i.sizes = core::Span<const int64_t>(t.sizes, static_cast<size_t>(t.ndim));
  return i;
}

TEST(RunCall, StepsRunInTheProtocolsOrder) {
  Fixture f(opforge::detail::make_op("ns", "scale", "f.cpp", 1)
                .input("x", opforge::floating)
                .output("y", opforge::like("x"))
                .reference(unary)
                .release());
  Recorder hooks;
  alignas(16) float x[8] = {};
  const int64_t size = 4, stride = 2;  // every other element: not dense, so admitted as a copy
  std::vector<OpforgeArg> args(1);
  args[0].tensor = {x, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &size, &stride};
  const std::vector<core::ArgInfo<int64_t>> info{info_of(args[0].tensor)};
  std::vector<OpforgeTensor> outputs(1);
  core::set_poison_mode(1);
  const bool launched = core::run_call({f.op(), &f.kernel, info, args, {}, false}, hooks, outputs);
  core::set_poison_mode(0);
  EXPECT_TRUE(launched);
  EXPECT_EQ(hooks.log, (std::vector<std::string>{"output 0", "fill 255", "dense_copy 0", "context"}));
  ASSERT_EQ(f.seen.calls, 1);
  EXPECT_EQ(f.seen.args[0], hooks.memory[1].data());     // the dense copy, not the caller's view
  EXPECT_EQ(f.seen.outputs[0], hooks.memory[0].data());  // the output the hooks made
  EXPECT_EQ(outputs[0].data, hooks.memory[0].data());
}

/// What a kernel that checks its own values saw of its context's domains.
struct Domains {
  std::vector<OpforgeValueDomain> seen;
};
int32_t record_domains(const OpforgeCallFrame* f, const void* user) {
  auto* d = const_cast<Domains*>(static_cast<const Domains*>(user));
  d->seen.assign(f->ctx->value_domains, f->ctx->value_domains + f->ctx->num_value_domains);
  return OPFORGE_STATUS_OK;
}

// A CUDA call of a kernel declared .checks_values_in_kernel(): no check kernel is launched (none
// could be here: no driver), and the kernel gets one domain per checked input, in argument order,
// with the bounds and message the check would have used; with checks off, domains that admit
// every value.
TEST(RunCall, AKernelThatChecksItsOwnValuesGetsTheDomainsInsteadOfACheck) {
  auto def = index_op();
  Domains domains;
  OpforgeKernel kernel{sizeof(OpforgeKernel), OPFORGE_DEVICE_CUDA, record_domains, &domains};
  kernel.checks_values = 1;
  Recorder hooks;
  float table[12] = {};
  int64_t rows[3] = {0, 2, 3};
  int32_t slots[4] = {3, -1, 7, 2};
  const std::vector<int64_t> ts{4, 3}, tst{3, 1}, rs{3}, rst{1}, ss{4}, sst{1};
  std::vector<OpforgeArg> args(3);
  args[0].tensor = {table, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CUDA, 0, 2, ts.data(), tst.data()};
  args[1].tensor = {rows, OPFORGE_DTYPE_INT64, OPFORGE_DEVICE_CUDA, 0, 1, rs.data(), rst.data()};
  args[2].tensor = {slots, OPFORGE_DTYPE_INT32, OPFORGE_DEVICE_CUDA, 0, 1, ss.data(), sst.data()};
  std::vector<core::ArgInfo<int64_t>> info;
  for (const OpforgeArg& a : args) info.push_back(info_of(a.tensor));
  info[1].dtype = OPFORGE_DTYPE_INT64, info[1].dtype_label = "int64";
  info[2].dtype = OPFORGE_DTYPE_INT32, info[2].dtype_label = "int32";
  std::vector<OpforgeTensor> outputs(1);
  core::Call call{*def->spec(), &kernel, info, args, {}, false, OPFORGE_DEVICE_CUDA, 0};
  EXPECT_TRUE(core::run_call(call, hooks, outputs));
  ASSERT_EQ(domains.seen.size(), 2u);
  EXPECT_EQ(domains.seen[0].arg, 1);
  EXPECT_EQ(std::make_pair(domains.seen[0].low, domains.seen[0].high), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(domains.seen[0].has_sentinel, 0);
  EXPECT_STREQ(domains.seen[0].message, "ns::gather: rows: expected values in [0, table.size(0)) = [0, 4)");
  EXPECT_EQ(domains.seen[1].arg, 2);
  EXPECT_EQ(std::make_pair(domains.seen[1].low, domains.seen[1].high), std::make_pair(int64_t{0}, int64_t{8}));
  EXPECT_EQ(std::make_pair(domains.seen[1].has_sentinel, domains.seen[1].sentinel), std::make_pair(1, int64_t{-1}));
  EXPECT_STREQ(domains.seen[1].message, "ns::gather: slots: expected values in [0, 8) or -1");
  core::set_device_value_checks(false);
  EXPECT_TRUE(core::run_call(call, hooks, outputs));
  core::set_device_value_checks(true);
  ASSERT_EQ(domains.seen.size(), 2u);
  for (const OpforgeValueDomain& d : domains.seen) {  // every int64 value admitted
    EXPECT_EQ(d.low, INT64_MIN);
    EXPECT_EQ(d.high, INT64_MAX);
    EXPECT_EQ(std::make_pair(d.has_sentinel, d.sentinel), std::make_pair(1, INT64_MAX));
  }
}

TEST(RunCall, AnInvalidCallAsksNothingOfTheAdapter) {
  Fixture f(opforge::detail::make_op("ns", "scale", "f.cpp", 1)
                .input("x", opforge::kFloat64)
                .output("y", opforge::like("x"))
                .reference(unary)
                .release());
  Recorder hooks;
  float x[4] = {};
  const int64_t size = 4, stride = 1;
  std::vector<OpforgeArg> args(1);
  args[0].tensor = {x, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &size, &stride};
  const std::vector<core::ArgInfo<int64_t>> info{info_of(args[0].tensor)};
  std::vector<OpforgeTensor> outputs(1);
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              core::run_call({f.op(), &f.kernel, info, args, {}, false}, hooks, outputs);
            }),
            "ns::scale(Tensor x) -> Tensor: invalid arguments\n"
            "  x: expected dtype float64, got float32");
  EXPECT_TRUE(hooks.log.empty());
  EXPECT_EQ(f.seen.calls, 0);
}

TEST(RunCall, SharedMemoryIsRefusedBeforeTheEmptyOutputSkip) {
  Fixture f(opforge::detail::make_op("ns", "accumulate", "f.cpp", 1)
                .input("x", opforge::floating)
                .input("acc", opforge::same_dtype("x"), opforge::mutated)
                .output("y", opforge::shape({0}), opforge::kFloat32)
                .reference(accumulate)
                .release());
  Recorder hooks;
  alignas(16) float buf[8] = {};
  const int64_t four = 4, eight = 8, stride = 1;
  std::vector<OpforgeArg> args(2);
  args[0].tensor = {buf, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &four, &stride};
  args[1].tensor = {buf + 4, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &four, &stride};
  // disjoint: runs, and skips the launch (its one output is empty)
  std::vector<core::ArgInfo<int64_t>> info{info_of(args[0].tensor), info_of(args[1].tensor)};
  std::vector<OpforgeTensor> outputs(1);
  EXPECT_FALSE(core::run_call({f.op(), &f.kernel, info, args, {}, false}, hooks, outputs));
  EXPECT_EQ(f.seen.calls, 0);
  args[0].tensor.sizes = &eight;  // x now covers acc: refused, even with nothing to launch
  info[0] = info_of(args[0].tensor);
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              core::run_call({f.op(), &f.kernel, info, args, {}, false}, hooks, outputs);
            }),
            "ns::accumulate(Tensor x, Tensor(a!) acc) -> Tensor: invalid arguments\n"
            "  acc: expected memory of its own (it is written in place), got memory shared with x; pass acc.clone()");
}

TEST(RunCall, AnOutTensorTheKernelCannotWriteGetsATemporaryCopiedBack) {
  Fixture f(opforge::detail::make_op("ns", "scale", "f.cpp", 1)
                .input("x", opforge::floating)
                .output("y", opforge::like("x"))
                .reference(unary)
                .release());
  Recorder hooks;
  alignas(16) float x[4] = {}, y[8] = {};
  const int64_t size = 4, dense_stride = 1, every_other = 2;
  hooks.given_out = {y, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &size, &every_other};
  std::vector<OpforgeArg> args(1);
  args[0].tensor = {x, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &size, &dense_stride};
  const std::vector<core::ArgInfo<int64_t>> info{info_of(args[0].tensor)}, given{info_of(hooks.given_out)};
  std::vector<OpforgeTensor> outputs(1);
  EXPECT_TRUE(core::run_call({f.op(), &f.kernel, info, args, given, true}, hooks, outputs));
  EXPECT_EQ(hooks.log, (std::vector<std::string>{"output 0", "temporary 0", "context", "copy_back 0"}));
  EXPECT_EQ(f.seen.outputs[0], hooks.memory[0].data());  // the kernel wrote the temporary
  EXPECT_EQ(outputs[0].data, y);                         // the call returns the caller's tensor
}

TEST(RunCall, PoisonBytes) {
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_FLOAT16, 1), 0xff);  // NaN in every floating type
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_INT32, 1), 0x7b);
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_BOOL, 1), 0x01);
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_FLOAT32, 2), 0x5a);  // finite
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_BOOL, 2), 0x00);
  // float8: a NaN of each format first, then a finite value (Note [Float8 dtypes]).
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_FLOAT8_E4M3FN, 1), 0x7f);
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_FLOAT8_E5M2, 1), 0x7f);
  EXPECT_EQ(core::poison_byte(OPFORGE_DTYPE_FLOAT8_E8M0FNU, 1), 0xff);
  for (int32_t d : {OPFORGE_DTYPE_FLOAT8_E4M3FN, OPFORGE_DTYPE_FLOAT8_E5M2, OPFORGE_DTYPE_FLOAT8_E8M0FNU})
    EXPECT_EQ(core::poison_byte(d, 2), 0x5a);
  EXPECT_TRUE(std::isnan(float(opforge::Float8_e4m3fn::from_bits(core::poison_byte(OPFORGE_DTYPE_FLOAT8_E4M3FN, 1)))));
  EXPECT_TRUE(std::isnan(float(opforge::Float8_e5m2::from_bits(core::poison_byte(OPFORGE_DTYPE_FLOAT8_E5M2, 1)))));
  EXPECT_TRUE(
      std::isnan(float(opforge::Float8_e8m0fnu::from_bits(core::poison_byte(OPFORGE_DTYPE_FLOAT8_E8M0FNU, 1)))));
  EXPECT_EQ(float(opforge::Float8_e4m3fn::from_bits(0x5a)), 20.0f);
  EXPECT_EQ(float(opforge::Float8_e5m2::from_bits(0x5a)), 192.0f);
}

}  // namespace run_call_tests
