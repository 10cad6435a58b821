// src/core/call.h: run_call owns the order of a call's steps (Note [The call protocol]); the
// hooks record what the driver asked of the adapter, so each test sees the sequence itself.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../src/core/call.h"

namespace {

using opforge::MutableTensor;
using opforge::Tensor;
namespace core = opforge::core;

void scale(Tensor, MutableTensor) {}
void accumulate(Tensor, MutableTensor, MutableTensor) {}

std::unique_ptr<opforge::detail::OpDef> finalized(std::unique_ptr<opforge::detail::OpDef> def) {
  auto errors = def->finalize();
  EXPECT_TRUE(errors.empty()) << errors.front();
  return def;
}

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
    return {memory.back().data(), OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, static_cast<int32_t>(s.size()),
            s.data(), strides.data()};
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
    return {sizeof(OpforgeContext), OPFORGE_DEVICE_CPU, -1, nullptr, nullptr, nullptr};
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
                .reference(scale)
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

TEST(RunCall, AnInvalidCallAsksNothingOfTheAdapter) {
  Fixture f(opforge::detail::make_op("ns", "scale", "f.cpp", 1)
                .input("x", opforge::kFloat64)
                .output("y", opforge::like("x"))
                .reference(scale)
                .release());
  Recorder hooks;
  float x[4] = {};
  const int64_t size = 4, stride = 1;
  std::vector<OpforgeArg> args(1);
  args[0].tensor = {x, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, &size, &stride};
  const std::vector<core::ArgInfo<int64_t>> info{info_of(args[0].tensor)};
  std::vector<OpforgeTensor> outputs(1);
  try {
    core::run_call({f.op(), &f.kernel, info, args, {}, false}, hooks, outputs);
    FAIL() << "expected InvalidArgument";
  } catch (const opforge::InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "ns::scale(Tensor x) -> Tensor: invalid arguments\n"
                                     "  x: expected dtype float64, got float32");
  }
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
  try {
    core::run_call({f.op(), &f.kernel, info, args, {}, false}, hooks, outputs);
    FAIL() << "expected InvalidArgument";
  } catch (const opforge::InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "ns::accumulate(Tensor x, Tensor(a!) acc) -> Tensor: invalid arguments\n"
              "  acc: expected memory of its own (it is written in place), got memory shared with x; pass acc.clone()");
  }
}

TEST(RunCall, AnOutTensorTheKernelCannotWriteGetsATemporaryCopiedBack) {
  Fixture f(opforge::detail::make_op("ns", "scale", "f.cpp", 1)
                .input("x", opforge::floating)
                .output("y", opforge::like("x"))
                .reference(scale)
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
}

}  // namespace
