// The backend-neutral half of run-time kernels (src/oplib/runtime_kernel.h): launch geometry,
// the kernel's argument order, instantiation names and the binary cache. No GPU needed.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "../../src/oplib/runtime_kernel.h"
#include "helpers.h"

namespace {

using opforge::MutableTensor;
using opforge::Tensor;
namespace rtc = opforge::detail::rtc;
using opforge_test::finalized;

void row_sum_cpu(Tensor, double, MutableTensor) {}
void pair_cpu(Tensor, Tensor, int64_t, double, bool, int64_t, MutableTensor) {}

/// One call's frame over host arrays (the geometry reads sizes only).
struct Frame {
  Frame() { sizes.reserve(8), strides.reserve(8); }  // tensor() hands out pointers into these
  /// row_sum's frame: x of shape `x` (scale 1), y of shape `y`.
  Frame(const std::vector<int64_t>& x, const std::vector<int64_t>& y) : Frame() {
    args.resize(2);
    args[0].tensor = tensor(x);
    outputs.push_back(tensor(y));
  }
  std::vector<std::vector<int64_t>> sizes, strides;
  std::vector<OpforgeArg> args;
  std::vector<OpforgeTensor> outputs;
  OpforgeCallFrame frame{};

  OpforgeTensor tensor(const std::vector<int64_t>& s, int32_t dtype = OPFORGE_DTYPE_FLOAT32) {
    sizes.push_back(s);
    strides.push_back(std::vector<int64_t>(s.size(), 1));
    return {reinterpret_cast<void*>(0x1000),
            dtype,
            OPFORGE_DEVICE_CUDA,
            0,
            static_cast<int32_t>(s.size()),
            sizes.back().data(),
            strides.back().data()};
  }
  const OpforgeCallFrame* get() {
    frame.struct_size = sizeof(frame);
    frame.num_args = static_cast<int32_t>(args.size());
    frame.args = args.data();
    frame.num_outputs = static_cast<int32_t>(outputs.size());
    frame.outputs = outputs.data();
    return &frame;
  }
};

std::unique_ptr<opforge::detail::OpDef> row_sum(opforge::detail::LaunchRule rule) {
  return finalized(opforge::detail::make_op("ns", "row_sum", "f.cpp", 1)
                       .input("x", opforge::floating, opforge::min_rank(1))
                       .param<double>("scale", 1.0)
                       .output("y", opforge::like("x").with_dim(-1, 1))
                       .reference(row_sum_cpu)
                       .cuda_source("row_sum.cu", "row_sum<{T}>")
                       .launch(std::move(rule))
                       .release());
}

TEST(LaunchGeometry, RowsOfLengthZeroStillLaunch) {
  // A row sum of a [4, 0] tensor is four zeros: the kernel must run (it used to be skipped,
  // leaving the [4, 1] output unwritten).
  auto def = row_sum(opforge::rows("x"));
  Frame f({4, 0}, {4, 1});
  opforge::LaunchConfig cfg;
  cfg.args = {7, 7, 7};  // what an earlier launch left: replaced
  ASSERT_TRUE(rtc::launch_config(*def->runtime_kernels[0], f.get(), cfg));
  EXPECT_EQ(cfg.grid[0], 4u);
  EXPECT_EQ(cfg.block[0], 32u);
  EXPECT_EQ(cfg.args, (std::vector<int64_t>{4, 0}));
}

TEST(LaunchGeometry, NoRowsAndNoOutputElementsLaunchNothing) {
  auto def = row_sum(opforge::rows("x"));
  Frame f({0, 5}, {0, 1});
  opforge::LaunchConfig cfg;
  EXPECT_FALSE(rtc::launch_config(*def->runtime_kernels[0], f.get(), cfg));
}

TEST(LaunchGeometry, AnEmptyGridWithOutputElementsIsAnError) {
  auto def = row_sum(opforge::elementwise("x"));
  Frame f({4, 0}, {4, 1});
  try {
    opforge::LaunchConfig cfg;
    rtc::launch_config(*def->runtime_kernels[0], f.get(), cfg);
    FAIL() << "no error";
  } catch (const opforge::InternalError& e) {
    EXPECT_STREQ(e.what(),
                 "elementwise(\"x\") of shape [4, 0] gives no threads, but output 'y' of shape [4, 1] has elements, "
                 "which would stay unwritten (launch over that output, or with launch_grid)");
  }
}

TEST(LaunchGeometry, ElementwiseBlocksCoverEveryElement) {
  auto def = row_sum(opforge::elementwise("y").bytes_per_thread(16).threads_per_block(128));
  Frame f({3, 1000}, {3, 1000});
  opforge::LaunchConfig cfg;
  ASSERT_TRUE(rtc::launch_config(*def->runtime_kernels[0], f.get(), cfg));
  EXPECT_EQ(cfg.grid[0], 6u);  // 3000 elements, 4 floats a thread, 512 a block
  EXPECT_EQ(cfg.block[0], 128u);
  EXPECT_EQ(cfg.args, (std::vector<int64_t>{3000}));
}

/// ns::pair's description (x, optional w, n, alpha, flag, compile-time k -> y), launched by `rule`.
std::unique_ptr<opforge::detail::OpDef> pair_op(opforge::detail::LaunchRule rule,
                                                const std::string& name = "pair<{T}>") {
  return finalized(opforge::detail::make_op("ns", "pair", "f.cpp", 1)
                       .input("x", opforge::floating)
                       .input("w", opforge::floating, opforge::optional)
                       .param<int64_t>("n", 2)
                       .param<double>("alpha", 0.5)
                       .param<bool>("flag", true)
                       .param<int64_t>("k", 4, opforge::compile_time)
                       .output("y", opforge::like("x"))
                       .reference(pair_cpu)
                       .cuda_source("pair.cu", name)
                       .launch(std::move(rule))
                       .release());
}

TEST(KernelArguments, PointersThenLaunchValuesThenParameters) {
  auto def = pair_op(opforge::elementwise("y"), "pair<{T}, {T_y}, {k}>");
  Frame f;
  f.args.resize(6);
  f.args[0].tensor = f.tensor({8}, OPFORGE_DTYPE_FLOAT16);
  f.args[1].tensor = {nullptr, -1, OPFORGE_DEVICE_CUDA, 0, -1, nullptr, nullptr};  // left out
  f.args[2].value.i = 7;
  f.args[3].value.f = 1.5;
  f.args[4].value.i = 1;
  f.args[5].value.i = 4;
  f.outputs.push_back(f.tensor({8}, OPFORGE_DTYPE_FLOAT32));
  f.outputs[0].data = reinterpret_cast<void*>(0x2000);
  const auto* frame = f.get();
  opforge::LaunchConfig cfg;
  cfg.args = {8};
  cfg.tensor_maps.resize(2);
  cfg.tensor_maps[1].bytes[5] = 42;
  rtc::KernelArguments args(*def->runtime_kernels[0], frame, cfg);
  void** p = args.params();
  EXPECT_EQ(*static_cast<void**>(p[0]), reinterpret_cast<void*>(0x1000));  // x
  EXPECT_EQ(*static_cast<void**>(p[1]), nullptr);                          // w, absent
  EXPECT_EQ(*static_cast<void**>(p[2]), reinterpret_cast<void*>(0x2000));  // y
  EXPECT_EQ(*static_cast<int64_t*>(p[3]), 8);                              // n of the launch rule
  EXPECT_EQ(p[4], cfg.tensor_maps[0].bytes);                               // the maps, by value: their bytes
  EXPECT_EQ(static_cast<unsigned char*>(p[5])[5], 42);
  EXPECT_EQ(*static_cast<int64_t*>(p[6]), 7);   // n
  EXPECT_EQ(*static_cast<double*>(p[7]), 1.5);  // alpha
  EXPECT_EQ(*static_cast<bool*>(p[8]), true);   // flag; k is compile-time
  std::vector<OpforgeValue> values;
  for (const auto& a : f.args) values.push_back(a.value);
  values[4].kind = OPFORGE_ARG_BOOL;
  const auto type = +[](int32_t d) {
    return d == OPFORGE_DTYPE_FLOAT16 ? "__half" : d == OPFORGE_DTYPE_FLOAT32 ? "float" : "?";
  };
  EXPECT_EQ(rtc::instantiate(*def->runtime_kernels[0], {OPFORGE_DTYPE_FLOAT16, -1, -1, -1, -1, -1},
                             {OPFORGE_DTYPE_FLOAT32}, values.data(), type),
            "pair<__half, float, 4>");
}

TEST(KernelArguments, MoreArgumentsThanHeldInlineKeepTheirOrder) {
  auto def = pair_op(opforge::elementwise("y"));
  Frame f;
  f.args.resize(6);
  f.args[0].tensor = f.tensor({8}, OPFORGE_DTYPE_FLOAT32);
  f.args[1].tensor = {nullptr, -1, OPFORGE_DEVICE_CUDA, 0, -1, nullptr, nullptr};
  f.args[2].value.i = -3;
  f.args[3].value.f = 2.5;
  f.args[4].value.i = 0;
  f.outputs.push_back(f.tensor({8}, OPFORGE_DTYPE_FLOAT32));
  opforge::LaunchConfig cfg;
  for (int64_t v = 0; v < 40; ++v) cfg.args.push_back(100 + v);  // a grid function's values, past 32
  rtc::KernelArguments args(*def->runtime_kernels[0], f.get(), cfg);
  void** p = args.params();
  EXPECT_EQ(*static_cast<void**>(p[0]), reinterpret_cast<void*>(0x1000));
  for (int v = 0; v < 40; ++v) EXPECT_EQ(*static_cast<int64_t*>(p[3 + v]), 100 + v) << v;
  EXPECT_EQ(*static_cast<int64_t*>(p[43]), -3);
  EXPECT_EQ(*static_cast<double*>(p[44]), 2.5);
  EXPECT_EQ(*static_cast<bool*>(p[45]), false);
}

// A kernel declared .checks_values_in_kernel() takes the call's value domains last, by value (a
// pointer to each in its context); a context without them (a core that launched a separate
// check instead) is refused before the launch.
TEST(KernelArguments, AKernelThatChecksItsValuesTakesTheDomainsLast) {
  auto def =
      finalized(opforge::detail::make_op("ns", "gather", "f.cpp", 1)
                    .input("table", opforge::floating, opforge::rank(1))
                    .input("rows", opforge::kInt64, opforge::rank(1), opforge::values_in(0, opforge::dim("table", 0)))
                    .param<double>("alpha", 0.5)
                    .output("y", opforge::like("table"))
                    .reference(+[](Tensor, Tensor, double, MutableTensor) {})
                    .cuda_source("gather.cu", "gather<{T}>")
                    .launch(opforge::elementwise("y"))
                    .checks_values_in_kernel()
                    .release());
  const auto& rk = *def->runtime_kernels[0];
  Frame f;
  f.args.resize(3);
  f.args[0].tensor = f.tensor({8});
  f.args[1].tensor = f.tensor({8}, OPFORGE_DTYPE_INT64);
  f.args[2].value.f = 1.5;
  f.outputs.push_back(f.tensor({8}));
  OpforgeValueDomain domain{};
  domain.high = 8;
  domain.arg = 1;
  OpforgeContext ctx{sizeof(OpforgeContext), OPFORGE_DEVICE_CUDA, 0};
  ctx.value_domains = &domain;
  ctx.num_value_domains = 1;
  OpforgeCallFrame* frame = const_cast<OpforgeCallFrame*>(f.get());
  frame->ctx = &ctx;
  opforge::LaunchConfig cfg;
  cfg.args = {8};
  rtc::KernelArguments args(rk, frame, cfg);
  void** p = args.params();
  EXPECT_EQ(*static_cast<double*>(p[4]), 1.5);  // alpha, then the domain of rows
  EXPECT_EQ(p[5], &domain);
  EXPECT_EQ(
      rtc::parameters_text(
          rtc::kernel_parameters(rk, {OPFORGE_DTYPE_FLOAT32, OPFORGE_DTYPE_INT64, -1}, {OPFORGE_DTYPE_FLOAT32}, 1),
          +[](int32_t d) { return d == OPFORGE_DTYPE_FLOAT32 ? "float" : "long long"; }),
      "float const*, long long const*, float*, int64_t, double, opforge::kernel::ValueDomain");
  ctx.num_value_domains = 0;
  ctx.value_domains = nullptr;
  EXPECT_EQ(opforge_test::message_of<opforge::InternalError>([&] { rtc::KernelArguments refused(rk, frame, cfg); }),
            "ns::gather: the kernel checks its own values and takes 1 value domain, but the call's context "
            "carries 0");
}

/// pair_op's instantiation key for x in `x_dtype`, y in `y_dtype`, compile-time k and run-time n.
std::vector<int64_t> pair_key(const opforge::detail::OpDef& def, int32_t x_dtype, int32_t y_dtype, int64_t k, int64_t n,
                              int32_t capacity = 16) {
  Frame f;
  f.args.resize(6);
  f.args[0].tensor = f.tensor({8}, x_dtype);
  f.args[1].tensor = {nullptr, -1, OPFORGE_DEVICE_CUDA, 0, -1, nullptr, nullptr};
  f.args[2].value.i = n;
  f.args[3].value.f = 0.5;
  f.args[4].value.i = 1;
  f.args[5].value.i = k;
  f.outputs.push_back(f.tensor({8}, y_dtype));
  std::vector<int64_t> key(capacity);
  int32_t size = 0;
  if (!rtc::instantiation_key(*def.runtime_kernels[0], f.get(), key.data(), capacity, size)) return {};
  key.resize(size);
  return key;
}

TEST(InstantiationKey, EqualExactlyWhenTheNameIsEqual) {
  auto def = pair_op(opforge::elementwise("y"), "pair<{T}, {T_y}, {k}>");
  const auto base = pair_key(*def, OPFORGE_DTYPE_FLOAT16, OPFORGE_DTYPE_FLOAT32, 4, 7);
  // x, w (absent: -1), k, y
  EXPECT_EQ(base, (std::vector<int64_t>{OPFORGE_DTYPE_FLOAT16, -1, 4, OPFORGE_DTYPE_FLOAT32}));
  EXPECT_EQ(pair_key(*def, OPFORGE_DTYPE_FLOAT16, OPFORGE_DTYPE_FLOAT32, 4, 99), base);  // n is a kernel argument
  EXPECT_NE(pair_key(*def, OPFORGE_DTYPE_FLOAT32, OPFORGE_DTYPE_FLOAT32, 4, 7), base);
  EXPECT_NE(pair_key(*def, OPFORGE_DTYPE_FLOAT16, OPFORGE_DTYPE_FLOAT16, 4, 7), base);
  EXPECT_NE(pair_key(*def, OPFORGE_DTYPE_FLOAT16, OPFORGE_DTYPE_FLOAT32, 8, 7), base);
  EXPECT_TRUE(pair_key(*def, OPFORGE_DTYPE_FLOAT16, OPFORGE_DTYPE_FLOAT32, 4, 7, /*capacity=*/3).empty());
}

void modal_cpu(opforge::Tensor, std::string_view, opforge::MutableTensor) {}

TEST(InstantiationKey, AStringCompileTimeParameterHasNone) {
  auto def = finalized(opforge::detail::make_op("ns", "modal", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<std::string>("mode", "fast", opforge::compile_time)
                           .output("y", opforge::like("x"))
                           .reference(modal_cpu)
                           .cuda_source("modal.cu", "modal<{T}, {mode}>")
                           .launch(opforge::elementwise("y"))
                           .release());
  Frame f;
  f.args.resize(2);
  f.args[0].tensor = f.tensor({8});
  f.args[1].value.s = "fast";
  f.args[1].value.len = 4;
  f.outputs.push_back(f.tensor({8}));
  int64_t key[8];
  int32_t size = 0;
  EXPECT_FALSE(rtc::instantiation_key(*def->runtime_kernels[0], f.get(), key, 8, size));
}

const char* cuda_name(int32_t d) { return d == OPFORGE_DTYPE_FLOAT16 ? "__half" : "float"; }

TEST(KernelSignature, WhatTheKernelIsPassedInOrder) {
  auto def = pair_op(opforge::elementwise("y"));
  const auto params = rtc::kernel_parameters(*def->runtime_kernels[0], {OPFORGE_DTYPE_FLOAT16, -1, -1, -1, -1, -1},
                                             {OPFORGE_DTYPE_FLOAT16}, 1);
  EXPECT_EQ(rtc::parameters_text(params, cuda_name),
            "__half const*, optional*, __half*, int64_t, int64_t, double, bool");
  EXPECT_TRUE(rtc::signature_problems("__half const*, __half const*, __half*, long long, long, double, bool", params,
                                      true, cuda_name)
                  .empty());
  // void pointers take any tensor; a left-out optional input takes any pointer.
  EXPECT_TRUE(rtc::signature_problems("void const*, float const*, void*, long long, long long, double, bool", params,
                                      true, cuda_name)
                  .empty());
  EXPECT_EQ(rtc::signature_problems("__half const*, __half const*, __half const*, int, long long, float", params, true,
                                    cuda_name),
            (std::vector<std::string>{
                "parameter 3 (output y): expected __half*, found __half const*",
                "parameter 4 (launch value n): expected int64_t, found int",
                "parameter 6 (parameter alpha): expected double, found float",
                "parameter 7 (parameter flag): expected bool, the kernel has no such parameter",
            }));
  EXPECT_EQ(rtc::signature_problems("__half const*, __half const*, __half*, long long, long long, double, bool, int",
                                    params, true, cuda_name),
            (std::vector<std::string>{"parameter 8: the kernel declares int, but opforge passes only 7 arguments"}));
}

TEST(KernelSignature, AGridFunctionsValuesAreAnyNumberOfInt64s) {
  auto def = pair_op(opforge::rows("x"));
  const auto unknown = rtc::kernel_parameters(*def->runtime_kernels[0], {OPFORGE_DTYPE_FLOAT32, OPFORGE_DTYPE_FLOAT32},
                                              {OPFORGE_DTYPE_FLOAT32}, -1);
  EXPECT_TRUE(rtc::signature_problems("float const*, float const*, float*, long long, long long, long long, long long, "
                                      "double, bool",
                                      unknown, false, cuda_name)
                  .empty());
  EXPECT_EQ(rtc::signature_problems("float const*, float const*, float*, long long, int, long long, double, bool",
                                    unknown, false, cuda_name),
            (std::vector<std::string>{"parameter 5 (launch value args[1]): expected int64_t, found int"}));
  const auto rows = rtc::kernel_parameters(*def->runtime_kernels[0], {OPFORGE_DTYPE_FLOAT32, OPFORGE_DTYPE_FLOAT32},
                                           {OPFORGE_DTYPE_FLOAT32}, 2);
  EXPECT_EQ(rtc::parameters_text(rows, cuda_name),
            "float const*, optional*, float*, int64_t, int64_t, int64_t, double, bool");
  EXPECT_EQ(
      rtc::signature_problems("float const*, float const*, float*, long long, long long, double, bool", rows, true,
                              cuda_name),
      (std::vector<std::string>{"parameter 6 (parameter n): expected int64_t, found double",
                                "parameter 7 (parameter alpha): expected double, found bool",
                                "parameter 8 (parameter flag): expected bool, the kernel has no such parameter"}));
}

TEST(KernelSignature, TensorMapsFollowAGridFunctionsValues) {
  auto def = pair_op(opforge::rows("x"));
  const auto& rk = *def->runtime_kernels[0];
  const std::vector<int32_t> dtypes = {OPFORGE_DTYPE_FLOAT32, OPFORGE_DTYPE_FLOAT32}, out = {OPFORGE_DTYPE_FLOAT32};
  const std::string map = "opforge::kernel::TensorMap";
  // Before the grid function runs: its int64 args, then its maps, any number of each.
  const auto unknown = rtc::kernel_parameters(rk, dtypes, out, -1);
  EXPECT_TRUE(rtc::signature_problems(
                  "float const*, float const*, float*, long long, " + map + ", " + map + ", long long, double, bool",
                  unknown, false, cuda_name)
                  .empty());
  EXPECT_EQ(rtc::signature_problems(
                "float const*, float const*, float*, long long, int, " + map + ", long long, double, bool", unknown,
                false, cuda_name),
            (std::vector<std::string>{"parameter 5 (launch value args[1]): expected int64_t, found int"}));
  EXPECT_EQ(rtc::parameters_text(unknown, cuda_name, /*grid_values_unknown=*/true),
            "float const*, optional*, float*, the grid function's int64 args and tensor maps, int64_t, double, bool");
  const std::string by_value =
      " (a tensor map is taken by value, `const __grid_constant__ opforge::kernel::TensorMap`, after the grid "
      "function's int64 args and before the op's parameters)";
  EXPECT_EQ(rtc::signature_problems(
                "float const*, float const*, float*, long long, " + map + " const*, long long, double, bool", unknown,
                false, cuda_name),
            (std::vector<std::string>{"parameter 5 (launch value args[1]): expected int64_t, found " + map + " const*" +
                                      by_value}));
  // Once it has run: exactly its args and maps, in that order.
  const auto known = rtc::kernel_parameters(rk, dtypes, out, 1, 2);
  EXPECT_EQ(rtc::parameters_text(known, cuda_name),
            "float const*, optional*, float*, int64_t, " + map + ", " + map + ", int64_t, double, bool");
  EXPECT_TRUE(rtc::signature_problems(
                  "float const*, float const*, float*, long long, " + map + ", " + map + ", long long, double, bool",
                  known, true, cuda_name)
                  .empty());
  EXPECT_EQ(rtc::signature_problems(
                "float const*, float const*, float*, " + map + ", long long, " + map + ", long long, double, bool",
                known, true, cuda_name),
            (std::vector<std::string>{"parameter 4 (launch value rows): expected int64_t, found " + map + by_value,
                                      "parameter 5 (tensor map 0): expected " + map + ", found long long"}));
  EXPECT_EQ(
      rtc::signature_problems(
          "float const*, float const*, float*, long long, " + map + ", CUtensorMap_st" + ", long long, double, bool",
          known, true, cuda_name),
      (std::vector<std::string>{"parameter 6 (tensor map 1): expected " + map + ", found CUtensorMap_st" + by_value}));
}

TEST(KernelSignature, APrebuiltKernelsParametersAreCheckedBySize) {
  auto def = pair_op(opforge::elementwise("y"));
  const auto& rk = *def->runtime_kernels[0];
  const auto params =
      rtc::kernel_parameters(rk, {OPFORGE_DTYPE_FLOAT32, -1, -1, -1, -1, -1}, {OPFORGE_DTYPE_FLOAT32}, 1);
  // x, w, y, the launch value n, then the parameters n, alpha and flag (k is compile-time).
  EXPECT_TRUE(rtc::size_problems({8, 8, 8, 8, 8, 8, 1}, params, true, cuda_name).empty());
  EXPECT_EQ(rtc::size_problems({8, 8, 8, 4, 8, 8}, params, true, cuda_name),
            (std::vector<std::string>{
                "parameter 4 (launch value n): expected int64_t (8 bytes), found a parameter of 4 bytes",
                "parameter 7 (parameter flag): expected bool (1 byte), the kernel has no such parameter",
            }));
  EXPECT_EQ(rtc::size_problems({8, 8, 8, 8, 8, 8, 1, 16}, params, true, cuda_name),
            (std::vector<std::string>{
                "parameter 8: the kernel declares a parameter of 16 bytes, but opforge passes only 7 arguments"}));
  // A grid function's values before it has run: 8-byte args, then 128-byte tensor maps.
  const auto unknown =
      rtc::kernel_parameters(rk, {OPFORGE_DTYPE_FLOAT32, -1, -1, -1, -1, -1}, {OPFORGE_DTYPE_FLOAT32}, -1);
  EXPECT_TRUE(rtc::size_problems({8, 8, 8, 8, 8, 128, 128, 8, 8, 1}, unknown, false, cuda_name).empty());
  EXPECT_EQ(rtc::size_problems({8, 8, 8, 8, 4, 128, 8, 8, 1}, unknown, false, cuda_name),
            (std::vector<std::string>{
                "parameter 5 (launch value args[1]): expected int64_t (8 bytes), found a parameter of 4 bytes"}));
}

void scale_cpu(Tensor, double, MutableTensor) {}
opforge::LaunchConfig scale_cuda_grid(Tensor, double, MutableTensor) { return {}; }
opforge::TritonLaunch scale_triton_grid(Tensor, double, MutableTensor) { return {}; }

/// The declaration problems of ns::scale (x, alpha -> y) whose device kernel `kernel` adds.
template <class Kernel>
std::vector<std::string> scale_problems(Kernel kernel) {
  auto b = opforge::detail::make_op("ns", "scale", "f.cpp", 3)
               .input("x", opforge::floating)
               .param<double>("alpha", 2.0)
               .output("y", opforge::like("x"))
               .reference(scale_cpu);
  return opforge_test::declaration_problems(*kernel(std::move(b)).release());
}

TEST(PrebuiltKernel, ItsDeclarationIsCheckedLikeOtherRunTimeKernels) {
  EXPECT_TRUE(scale_problems([](auto b) {
                return std::move(b).cuda_binary("scale.cubin", "scale_{T}").launch(opforge::elementwise("y"));
              }).empty());
  EXPECT_TRUE(scale_problems([](auto b) {
                return std::move(b).cuda_binary("scale.ptx", "scale").launch_grid(scale_cuda_grid);
              }).empty());
  EXPECT_EQ(scale_problems([](auto b) { return std::move(b).cuda_binary("../scale.cubin", "scale_{U}"); }),
            (std::vector<std::string>{
                "f.cpp:3: ns::scale: cuda_binary(\"../scale.cubin\"): no launch rule: add "
                ".launch(opforge::elementwise(...)) or another",
                "f.cpp:3: ns::scale: cuda_binary(\"../scale.cubin\"): the file must be a relative path inside the "
                "library's kernel folder",
                "f.cpp:3: ns::scale: cuda_binary(\"../scale.cubin\"): {U} names no parameter (use {T}, "
                "{T_<tensor>} or {<compile_time param>})",
            }));
}

TEST(PrebuiltKernel, AGridFunctionReturnsWhatItsBackendLaunches) {
  EXPECT_EQ(scale_problems(
                [](auto b) { return std::move(b).cuda_binary("scale.cubin", "scale").launch_grid(scale_triton_grid); }),
            (std::vector<std::string>{
                "f.cpp:3: ns::scale: cuda_binary(\"scale.cubin\"): a CUDA kernel's grid function returns "
                "opforge::LaunchConfig (opforge::TritonLaunch is a .triton_source() kernel's)"}));
  EXPECT_EQ(scale_problems(
                [](auto b) { return std::move(b).triton_source("scale.py", "scale").launch_grid(scale_cuda_grid); }),
            (std::vector<std::string>{"f.cpp:3: ns::scale: triton_source(\"scale.py\"): a Triton kernel's grid "
                                      "function returns opforge::TritonLaunch"}));
}

/// tensor_map_layout's error for `t` with `box`, or "" if it takes them.
std::string tensor_map_problem(const OpforgeTensor& t, std::vector<uint32_t> box,
                               opforge::TensorMapSwizzle swizzle = opforge::TensorMapSwizzle::k128B) {
  try {
    rtc::tensor_map_layout(Tensor(t), box.data(), box.size(), swizzle);
    return "";
  } catch (const opforge::InvalidArgument& e) {
    return e.what();
  }
}

TEST(TensorMap, LayoutIsTheTensorsDimsInnermostFirst) {
  Frame f;
  // A head-split view [2, 4, 100, 64] of a [2, 100, 3 * 4 * 64] bfloat16 projection.
  OpforgeTensor q = f.tensor({2, 4, 100, 64}, OPFORGE_DTYPE_BFLOAT16);
  f.strides.back() = {100 * 768, 64, 768, 1};
  const uint32_t box[] = {64, 128, 1, 1};
  const rtc::TensorMapLayout l = rtc::tensor_map_layout(Tensor(q), box, 4, opforge::TensorMapSwizzle::k128B);
  EXPECT_EQ(l.rank, 4u);
  EXPECT_EQ(std::vector<uint64_t>(l.dims, l.dims + 4), (std::vector<uint64_t>{64, 100, 4, 2}));
  EXPECT_EQ(std::vector<uint64_t>(l.strides, l.strides + 3), (std::vector<uint64_t>{1536, 128, 153600}));
}

TEST(TensorMap, WhatTheCopyEngineCannotTakeIsRefused) {
  Frame f;
  const std::string prefix = "opforge::tensor_map of a bfloat16 tensor of shape [2, 100, 64]: ";
  OpforgeTensor t = f.tensor({2, 100, 64}, OPFORGE_DTYPE_BFLOAT16);
  f.strides.back() = {6400, 64, 1};
  EXPECT_EQ(tensor_map_problem(t, {64, 128, 1}), "");
  EXPECT_EQ(tensor_map_problem(t, {64, 128}), prefix + "a box of 2 sizes for 3 dims");
  EXPECT_EQ(tensor_map_problem(t, {64, 512, 1}), prefix + "box size 512 (1 to 256)");
  EXPECT_EQ(tensor_map_problem(t, {128, 128, 1}),
            prefix + "a box row of 256 bytes under a 128-byte swizzle (at most its span)");
  EXPECT_EQ(tensor_map_problem(t, {4, 128, 1}, opforge::TensorMapSwizzle::kNone),
            prefix + "a box row of 8 bytes (a multiple of 16 is needed)");
  f.strides.back() = {6400, 68, 1};  // rows 136 bytes apart
  EXPECT_EQ(tensor_map_problem(t, {64, 128, 1}), prefix + "dim 1's stride of 136 bytes (a multiple of 16 is needed)");
  f.strides.back() = {6400, 1, 100};  // a transpose: the last dim is not contiguous
  EXPECT_EQ(tensor_map_problem(t, {64, 128, 1}), prefix + "the last dim is not contiguous");
  f.strides.back() = {6400, 64, 1};
  t.data = reinterpret_cast<void*>(0x1008);
  EXPECT_EQ(tensor_map_problem(t, {64, 128, 1}), prefix + "the data is not 16-byte aligned");
  t.data = reinterpret_cast<void*>(0x1000);
  t.device_type = OPFORGE_DEVICE_CPU;
  EXPECT_EQ(tensor_map_problem(t, {64, 128, 1}), prefix + "the tensor is not on a CUDA device");
  OpforgeTensor wide = f.tensor({1, 1, 1, 1, 1, 16}, OPFORGE_DTYPE_BFLOAT16);
  EXPECT_EQ(tensor_map_problem(wide, {16, 1, 1, 1, 1, 1}),
            "opforge::tensor_map of a bfloat16 tensor of shape [1, 1, 1, 1, 1, 16]: rank 6 (tensor maps take 1 to 5 "
            "dims)");
}

TEST(KernelSignature, DemangledParameterLists) {
  // void twice<float>(float const*, float*, long long) and an extern "C" name (no types).
  EXPECT_EQ(rtc::demangled_parameters("_Z5twiceIfEvPKT_PS0_x").value_or("?"), "float const*, float*, long long");
  EXPECT_EQ(rtc::demangled_parameters("twice_c"), std::nullopt);
  EXPECT_EQ(rtc::demangled_parameters("_Znot a name"), std::nullopt);
}

TEST(KernelFolder, FilesInListsRegularFilesAndLinksSorted) {
  const auto dir = std::filesystem::temp_directory_path() / ("opforge-files-in-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "sub");
  std::ofstream(dir / "tma.cuh") << "b";
  std::ofstream(dir / "kernel.cuh") << "a";
  std::filesystem::create_symlink(dir / "kernel.cuh", dir / "linked.cuh");  // the build links the headers
  EXPECT_EQ(rtc::files_in(dir.string()), (std::vector<std::string>{"kernel.cuh", "linked.cuh", "tma.cuh"}));
  EXPECT_TRUE(rtc::files_in((dir / "missing").string()).empty());
  std::filesystem::remove_all(dir);
}

TEST(BinaryCache, EntriesRoundTripAndDamagedOnesAreIgnored) {
  const auto dir = std::filesystem::temp_directory_path() / ("opforge-cache-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  setenv("OPFORGE_CACHE_DIR", (dir / "user").c_str(), 1);
  rtc::Binary b{"_Z3fooi", std::string("\x7f"
                                       "ELF binary",
                                       11)},
      out;
  EXPECT_FALSE(rtc::find_cached("key one", (dir / "w").string(), false, out));
  rtc::store((dir / "w").string(), "key one", b);
  ASSERT_TRUE(rtc::find_cached("key one", (dir / "w").string(), false, out));
  EXPECT_EQ(out.lowered_name, b.lowered_name);
  EXPECT_EQ(out.image, b.image);
  EXPECT_FALSE(rtc::find_cached("key two", (dir / "w").string(), false, out));
  for (const auto& e : std::filesystem::directory_iterator(dir / "w")) {  // flip a byte of the image
    std::fstream file(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('X');
  }
  EXPECT_FALSE(rtc::find_cached("key one", (dir / "w").string(), false, out));
  // Found in the user cache, copied into the write folder when asked (packages carry binaries).
  rtc::store(rtc::user_cache_dir(), "key three", b);
  ASSERT_TRUE(rtc::find_cached("key three", (dir / "pkg").string(), true, out));
  EXPECT_TRUE(std::filesystem::exists(dir / "pkg"));
  unsetenv("OPFORGE_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

}  // namespace

namespace {

TEST(LaunchGeometry, GridsBeyondOneLaunchAreRefused) {
  const int64_t huge = int64_t{1} << 42;
  auto rows = row_sum(opforge::rows("x"));
  Frame f({huge, 1}, {huge, 1});
  try {
    opforge::LaunchConfig cfg;
    rtc::launch_config(*rows->runtime_kernels[0], f.get(), cfg);
    FAIL() << "no error";
  } catch (const opforge::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "4398046511104 rows exceed one launch's grid");
  }
  auto flat = row_sum(opforge::elementwise("x").threads_per_block(32));
  Frame g({huge, 1}, {huge, 1});
  try {
    opforge::LaunchConfig cfg;
    rtc::launch_config(*flat->runtime_kernels[0], g.get(), cfg);
    FAIL() << "no error";
  } catch (const opforge::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "4398046511104 elements exceed one launch's grid");
  }
}

TEST(CudaLaunch, WithoutAGpuDriverALaunchSaysSo) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "this machine has a GPU driver";
  cudaGetLastError();
  auto def = row_sum(opforge::rows("x"));
  Frame f({4, 8}, {4, 1});
  OpforgeContext ctx{sizeof(OpforgeContext), OPFORGE_DEVICE_CUDA, 0, nullptr, nullptr, nullptr, 0};
  char error[512] = {0};
  f.frame.ctx = &ctx;
  f.frame.error = error;
  f.frame.error_capacity = sizeof(error);
  const OpforgeCallFrame* frame = f.get();
  EXPECT_EQ(opforge::detail::rtc_launch(frame, def->runtime_kernels[0].get()), OPFORGE_STATUS_INTERNAL);
  EXPECT_STREQ(error, "opforge: the CUDA driver API is not available (no GPU driver?)");
}

}  // namespace
