// libopforge_core: the library description, the call protocol, sharding and example sizes,
// precompile's checks, and the backward-op pairing, each at its seam with exact messages.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <nlohmann/json.hpp>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "../../src/core/backward.h"
#include "../../src/core/call.h"
#include "../../src/core/check.h"
#include "../../src/core/description.h"
#include "../../src/core/dtypes.h"
#include "../../src/core/library.h"
#include "../../src/core/precompile.h"
#include "../../src/core/schema.h"
#include "../../src/core/sharding.h"
#include "../../src/core/sizes.h"
#include "../../src/core/span.h"
#include "declaration_problems.h"

namespace {

using nlohmann::json;
using opforge::MutableTensor;
using opforge::Tensor;

void one_param(Tensor, double, MutableTensor) {}
void two_inputs(Tensor, Tensor, MutableTensor) {}
void three_inputs(Tensor, Tensor, Tensor, MutableTensor) {}
void with_tag(Tensor, std::string_view, MutableTensor) {}
void with_ints(Tensor, std::span<const int64_t>, MutableTensor) {}

std::unique_ptr<opforge::detail::OpDef> finalized(std::unique_ptr<opforge::detail::OpDef> def) {
  auto errors = declaration_problems(*def);
  EXPECT_TRUE(errors.empty()) << errors.front();
  return def;
}

/// The description of a library holding `defs`.
json describe(std::vector<const opforge::detail::OpDef*> defs) {
  std::vector<const OpforgeOpSpec*> ops;
  for (auto* d : defs) ops.push_back(d->spec());
  OpforgeLibrary lib{sizeof(OpforgeLibrary), OPFORGE_ABI_VERSION, static_cast<int32_t>(ops.size()), ops.data(),
                     nullptr};
  return json::parse(opforge::core::description_json(lib));
}

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(Description, DescribesArgumentsOutputsAndKernels) {
  auto def = finalized(opforge::detail::make_op("ns", "req", "f.cpp", 5)
                           .doc("say \"hi\"")
                           .input("x", opforge::kFloat16 | opforge::kBFloat16, opforge::contiguous_last_dim)
                           .param<double>("alpha", 0.5, opforge::at_least(0))
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  const json j = describe({def.get()});
  EXPECT_EQ(j["abi_version"], OPFORGE_ABI_VERSION);
  const json& op = j["ops"][0];
  EXPECT_EQ(op["name"], "ns::req");
  EXPECT_EQ(op["schema"], "ns::req(Tensor x, float alpha=0.5) -> Tensor");
  EXPECT_EQ(op["out_schema"], "ns::req.out(Tensor x, float alpha=0.5, *, Tensor(a!) y) -> Tensor(a!)");
  EXPECT_EQ(op["doc"], "say \"hi\"");
  EXPECT_EQ(op["file"], "f.cpp");
  EXPECT_EQ(op["line"], 5);
  EXPECT_EQ(op["sharding"], "none");
  EXPECT_EQ(op["backward"], nullptr);
  EXPECT_EQ(op["is_backward_op"], false);
  EXPECT_EQ(op["args"][0], json::parse(R"({"name": "x", "type": "Tensor", "kind": "tensor",
      "dtypes": ["float16", "bfloat16"], "same_dtype": null, "dtype_alternatives": [], "same_shape": null,
      "min_rank": -1, "max_rank": -1, "leading_dims": false,
      "layout": "contiguous_last_dim", "optional": false, "mutated": false, "values": null, "shape": null,
      "shape_rules": null, "multiple_of": [], "follows": []})"));
  EXPECT_EQ(op["args"][1], json::parse(R"({"name": "alpha", "type": "float", "kind": "param", "default": 0.5,
      "min": 0.0, "choices": null, "compile_time": false})"));
  EXPECT_EQ(op["outputs"][0], json::parse(R"({"name": "y", "dtype": null, "dtype_like": "x", "like": "x",
      "present_with": null, "size_from": null, "shape": [], "shape_rules": [], "with_dims": [], "with_dim_rules": []})"));
  EXPECT_EQ(op["devices"], json::parse(R"(["cpu"])"));
  EXPECT_EQ(op["dtype_combinations"], json::parse(R"([{"x": "float16"}, {"x": "bfloat16"}])"));
  EXPECT_EQ(op["runtime_kernels"], json::array());
}

TEST(Description, DefaultsAreTypedValues) {
  auto def = finalized(opforge::detail::make_op("ns", "tag", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<std::string>("tag", "it's \\ \"q\"\n")
                           .output("y", opforge::like("x"))
                           .reference(with_tag)
                           .release());
  auto inf = finalized(opforge::detail::make_op("ns", "inf", "f.cpp", 2)
                           .input("x", opforge::floating)
                           .param<double>("alpha", -std::numeric_limits<double>::infinity())
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  auto ints = finalized(opforge::detail::make_op("ns", "ints", "f.cpp", 3)
                            .input("x", opforge::floating)
                            .param<std::vector<int64_t>>("dims", std::vector<int64_t>{})
                            .output("y", opforge::like("x"))
                            .reference(with_ints)
                            .release());
  const json j = describe({def.get(), inf.get(), ints.get()});
  EXPECT_EQ(j["ops"][0]["args"][1]["default"], "it's \\ \"q\"\n");
  EXPECT_EQ(j["ops"][1]["args"][1]["default"], "-inf");
  EXPECT_EQ(j["ops"][2]["args"][1]["default"], json::array());
}

TEST(Description, ShapeRulesAsTrees) {
  auto def = finalized(opforge::detail::make_op("ns", "rules", "f.cpp", 1)
                           .input("x", opforge::floating, opforge::shape({opforge::any, opforge::multiple_of(4)}))
                           .input("w", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1) * 2}))
                           .output("y", opforge::like("x").with_dim(-1, opforge::ceildiv(opforge::dim("x", -1), 4)))
                           .reference(two_inputs)
                           .release());
  const json op = describe({def.get()})["ops"][0];
  EXPECT_EQ(op["args"][0]["shape"], json::parse(R"(["*", "multiple of 4"])"));
  EXPECT_EQ(op["args"][0]["shape_rules"], json::parse(R"([{"any": true}, {"multiple_of": 4}])"));
  EXPECT_EQ(op["args"][0]["multiple_of"], json::parse("[[1, 4]]"));
  EXPECT_EQ(op["args"][1]["shape_rules"], json::parse(R"([{"mul": [{"dim": ["x", -1]}, {"const": 2}]}])"));
  EXPECT_EQ(op["outputs"][0]["with_dims"], json::parse(R"j([[-1, "ceildiv(x.size(-1), 4)"]])j"));
  EXPECT_EQ(op["outputs"][0]["with_dim_rules"],
            json::parse(R"([[-1, {"ceildiv": [{"dim": ["x", -1]}, {"const": 4}]}]])"));
  EXPECT_EQ(op["unshardable_dims"], json::parse("[-1]"));
}

TEST(Sharding, InputsFollowTheFirstInputsDimsThroughTheirShapeRules) {
  auto def =
      finalized(opforge::detail::make_op("ns", "attn", "f.cpp", 1)
                    .sharding(opforge::shard_dims({0, 1}))
                    .input("q", opforge::floating, opforge::rank(4))
                    .input("k", opforge::same_dtype("q"), opforge::same_shape("q"))
                    .input("mask", opforge::floating, opforge::shape({opforge::dim("q", 0), opforge::dim("q", -2)}))
                    .output("y", opforge::like("q"))
                    .reference(three_inputs)
                    .release());
  const auto maps = opforge::core::follow_dims(*def->spec());
  EXPECT_EQ(maps.at(0), (std::map<int32_t, int32_t>{{0, 0}, {1, 1}}));
  EXPECT_EQ(maps.at(1), (std::map<int32_t, int32_t>{{0, 0}, {1, 1}}));  // same_shape of q
  EXPECT_EQ(maps.at(2), (std::map<int32_t, int32_t>{{0, 0}, {2, 1}}));  // q's dim -2 is dim 2 of 4
  const json op = describe({def.get()})["ops"][0];
  EXPECT_EQ(op["sharding"], "dims");
  EXPECT_EQ(op["sharding_dims"], json::parse("[0, 1]"));
  EXPECT_EQ(op["args"][2]["follows"], json::parse("[[0, 0], [2, 1]]"));
}

TEST(ExampleShapes, FreeDimsRulesAndMultiples) {
  auto def = finalized(opforge::detail::make_op("ns", "mix", "f.cpp", 1)
                           .input("x", opforge::floating, opforge::min_rank(1))
                           .input("w", opforge::same_dtype("x"), opforge::same_shape("x"),
                                  opforge::shape({opforge::any, opforge::multiple_of(8)}))
                           .input("b", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1) + 1}))
                           .output("y", opforge::like("x"))
                           .reference(three_inputs)
                           .release());
  const std::vector<OpforgeValue> values(3);
  const auto shapes = opforge::core::example_shapes(*def->spec(), 3, 37, values);
  // w's multiple_of(8) applies to x, whose shape w copies: 37 becomes 40.
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{3, 40}));
  EXPECT_EQ(shapes[1], (std::vector<int64_t>{3, 40}));
  EXPECT_EQ(shapes[2], (std::vector<int64_t>{41}));
  const auto empty = opforge::core::example_shapes(*def->spec(), 0, 0, values);
  EXPECT_EQ(empty[0], (std::vector<int64_t>{0, 0}));
}

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

TEST(Precompile, RequestsAreCheckedAsCallsAre) {
  auto def = finalized(opforge::detail::make_op("ns", "pc", "f.cpp", 1)
                           .input("x", opforge::kFloat16 | opforge::kFloat32)
                           .input("w", opforge::same_dtype("x"))
                           .param<int64_t>("k", 4, opforge::one_of({4, 8}), opforge::compile_time)
                           .output("y", opforge::like("x"))
                           .reference(+[](Tensor, Tensor, int64_t, MutableTensor) {})
                           .cuda_source("pc.cu", "pc<{T}, {k}>")
                           .launch(opforge::elementwise("y"))
                           .release());
  std::vector<OpforgeValue> values(3);
  values[2].kind = OPFORGE_ARG_INT;
  values[2].i = 5;
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {OPFORGE_DTYPE_FLOAT64, OPFORGE_DTYPE_FLOAT16, -1}, values,
                                        "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n"
            "  x: expected dtype one of {float32, float16}, got float64\n"
            "  k: expected one of 4, 8, got 5");
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {OPFORGE_DTYPE_FLOAT32, OPFORGE_DTYPE_FLOAT16, -1}, values,
                                        "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n"
            "  w: expected dtype float32 (the dtype of x), got float16\n"
            "  k: expected one of 4, 8, got 5");
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {OPFORGE_DTYPE_FLOAT16, -1, -1}, values, "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n  k: expected one of 4, 8, got 5")
      << "w's dtype follows from x's (same_dtype)";
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*def->spec(), {-1, -1, -1}, values, "sm_90", "");
            }),
            "ns::pc(Tensor x, Tensor w, int k=4) -> Tensor: invalid arguments\n  x: expected a dtype, got none\n"
            "  w: expected a dtype, got none\n  k: expected one of 4, 8, got 5");
}

TEST(BackwardOps, MismatchesAreListedOnePerLineWithTheDeclarationSite) {
  auto fwd = finalized(opforge::detail::make_op("ns", "f", "f.cpp", 3)
                           .input("x", opforge::floating)
                           .param<double>("alpha")
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  auto bwd = finalized(opforge::detail::make_op("ns", "f_backward", "f.cpp", 9)
                           .input("grad_z", opforge::floating)
                           .param<int64_t>("alpha")
                           .output("dx", opforge::like("grad_z"))
                           .reference(+[](Tensor, int64_t, MutableTensor) {})
                           .release());
  std::vector<std::string> problems;
  opforge::core::plan_backward(*fwd->spec(), *bwd->spec(), problems);
  EXPECT_EQ(problems,
            (std::vector<std::string>{
                "f.cpp:3: ns::f: backward op ns::f_backward: input 'grad_z' matches nothing of the forward op: "
                "expected one of grad_y, x, alpha, y",
                "f.cpp:3: ns::f: backward op ns::f_backward: input 'alpha' is int, but the forward op's alpha "
                "is float",
                "f.cpp:3: ns::f: backward op ns::f_backward: output 'dx' is not the gradient of a tensor input: "
                "expected one of grad_x, or grad_<a>_and_<b> for one gradient of several"}));
}

TEST(BackwardOps, AResultWhoseGradientTheBackwardOpDoesNotTakeIsNotDifferentiable) {
  auto fwd = finalized(opforge::detail::make_op("ns", "two", "f.cpp", 3)
                           .input("x", opforge::floating)
                           .output("y", opforge::like("x"))
                           .output("stat", opforge::like("x"))
                           .reference(+[](Tensor, MutableTensor, MutableTensor) {})
                           .release());
  auto bwd = finalized(opforge::detail::make_op("ns", "two_backward", "f.cpp", 9)
                           .input("grad_y", opforge::floating)
                           .input("stat", opforge::floating)
                           .output("grad_x", opforge::like("grad_y"))
                           .reference(+[](Tensor, Tensor, MutableTensor) {})
                           .release());
  std::vector<std::string> problems;
  const auto plan = opforge::core::plan_backward(*fwd->spec(), *bwd->spec(), problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(plan.differentiable, (std::vector<bool>{true, false}));  // stat is saved, not differentiated
}

TEST(Loading, FilesThatAreNotOpLibraries) {
  EXPECT_EQ(message_of<opforge::InternalError>([] { opforge::core::load_library("/nonexistent/libx.so"); }),
            "opforge: cannot open the op library /nonexistent/libx.so: No such file or directory");
}

}  // namespace

namespace {

std::vector<std::string> backward_problems(std::unique_ptr<opforge::detail::OpDef> fwd,
                                           std::unique_ptr<opforge::detail::OpDef> bwd) {
  fwd->finalize();
  bwd->finalize();
  std::vector<std::string> problems;
  opforge::core::plan_backward(*fwd->spec(), *bwd->spec(), problems);
  return problems;
}

TEST(BackwardOps, GradientsAndOutputsAreTensors) {
  auto fwd = opforge::detail::make_op("ns", "g", "f.cpp", 3)
                 .input("x", opforge::floating)
                 .output("y", opforge::like("x"))
                 .reference(+[](Tensor, MutableTensor) {})
                 .release();
  auto bwd = opforge::detail::make_op("ns", "g_backward", "f.cpp", 5)
                 .input("x", opforge::floating)
                 .param<double>("grad_y")
                 .param<double>("y")
                 .output("grad_x", opforge::like("x"))
                 .reference(+[](Tensor, double, double, MutableTensor) {})
                 .release();
  EXPECT_EQ(backward_problems(std::move(fwd), std::move(bwd)),
            (std::vector<std::string>{
                "f.cpp:3: ns::g: backward op ns::g_backward: input 'grad_y' is float, but a gradient is a Tensor",
                "f.cpp:3: ns::g: backward op ns::g_backward: input 'y' is float, but the forward op's output y is a "
                "Tensor"}));
}

TEST(ShapeRules, AReplacedDimOutsideTheRankIsReported) {
  auto def = finalized(opforge::detail::make_op("ns", "wd", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .output("y", opforge::like("x").with_dim(-3, 1))
                           .reference(+[](Tensor, MutableTensor) {})
                           .release());
  std::vector<opforge::core::ArgInfo<int64_t>> args(1);
  args[0].dtype = OPFORGE_DTYPE_FLOAT32;
  const std::vector<int64_t> sizes{4, 5};
  args[0].sizes = sizes;
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  EXPECT_EQ(opforge::core::check_call<int64_t>(*def->spec(), args, outs),
            "ns::wd(Tensor x) -> Tensor: invalid arguments\n  output y: with_dim(-3) is out of range for rank 2");
}

TEST(KernelApi, ScratchAndDtypeFailuresSaySo) {
  OpforgeContext c{sizeof(OpforgeContext),
                   OPFORGE_DEVICE_CPU,
                   -1,
                   nullptr,
                   +[](void*, size_t) -> void* { return nullptr; },
                   nullptr};
  EXPECT_EQ(message_of<opforge::InternalError>([&] { opforge::Context(c).allocate(64); }),
            "opforge: scratch allocation failed");
  EXPECT_EQ(message_of<opforge::InvalidArgument>(
                [] { opforge::visit_dtype<opforge::floating>(opforge::kInt32, []<class T>(opforge::type_tag<T>) {}); }),
            "opforge::visit_dtype: dtype int32 is not in the set this kernel was instantiated for");
}

}  // namespace

namespace {

void ref_rules(Tensor, Tensor, int64_t, MutableTensor) {}
void ref_index(Tensor, Tensor, Tensor, MutableTensor) {}

std::unique_ptr<opforge::detail::OpDef> rules_op() {
  return finalized(opforge::detail::make_op("ns", "rot", "f.cpp", 1)
                       .input("x", opforge::floating, opforge::rank(2))
                       .input("cache", opforge::same_dtype("x"), opforge::rank(2))
                       .param<int64_t>("block", 4)
                       .require(opforge::dim("cache", 1) <= opforge::dim("x", -1))
                       .require(opforge::dim("x", -1) % opforge::int_param("block") == 0)
                       .output("y", opforge::like("x"))
                       .reference(ref_rules)
                       .release());
}

/// check_call of rules_op() for x and cache of these sizes (float32) and this block.
std::string check_rules(const OpforgeOpSpec& op, const std::vector<int64_t>& x, const std::vector<int64_t>& cache,
                        int64_t block) {
  std::vector<opforge::core::ArgInfo<int64_t>> args(3);
  args[0].dtype = args[1].dtype = OPFORGE_DTYPE_FLOAT32;
  args[0].dtype_label = args[1].dtype_label = "float32";
  args[0].sizes = x;
  args[1].sizes = cache;
  args[2].value.kind = OPFORGE_ARG_INT;
  args[2].value.i = block;
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  return opforge::core::check_call<int64_t>(op, args, outs);
}

TEST(Rules, CrossArgumentRulesAreCheckedWithTheArguments) {
  auto def = rules_op();
  EXPECT_EQ(check_rules(*def->spec(), {3, 64}, {9, 32}, 16), "");
  EXPECT_EQ(check_rules(*def->spec(), {3, 60}, {9, 96}, 16),
            "ns::rot(Tensor x, Tensor cache, SymInt block=4) -> Tensor: invalid arguments\n"
            "  expected cache.size(1) <= x.size(-1), got 96 <= 60\n"
            "  expected x.size(-1) % block == 0, got 12 == 0");
  // A rule that reads an argument already reported is not checked again.
  EXPECT_EQ(check_rules(*def->spec(), {3}, {9, 96}, 16),
            "ns::rot(Tensor x, Tensor cache, SymInt block=4) -> Tensor: invalid arguments\n"
            "  x: expected rank 2, got rank 1 (shape [3])");
  const json op = describe({def.get()})["ops"][0];
  EXPECT_EQ(op["rules"][0]["text"], "cache.size(1) <= x.size(-1)");
  EXPECT_EQ(op["rules"][1], json::parse(R"({"text": "x.size(-1) % block == 0", "op": "==",
      "lhs": {"mod": [{"dim": ["x", -1]}, {"param": "block"}]}, "rhs": {"const": 0}})"));
}

TEST(Rules, ExampleFactsNameTheRulesSizesBreak) {
  auto def = rules_op();
  std::vector<OpforgeValue> values(3);
  values[2].kind = OPFORGE_ARG_INT;
  values[2].i = 4;
  const auto facts = opforge::core::example_facts(*def->spec(), {{3, 37}, {3, 37}, {}}, values);
  EXPECT_EQ(facts.rule_problems, (std::vector<std::string>{"expected x.size(-1) % block == 0, got 1 == 0"}));
  EXPECT_TRUE(opforge::core::example_facts(*def->spec(), {{3, 40}, {3, 40}, {}}, values).rule_problems.empty());
}

std::unique_ptr<opforge::detail::OpDef> index_op() {
  return finalized(
      opforge::detail::make_op("ns", "gather", "f.cpp", 1)
          .input("table", opforge::floating, opforge::rank(2))
          .input("rows", opforge::kInt64, opforge::rank(1), opforge::values_in(0, opforge::dim("table", 0)))
          .input("slots", opforge::kInt32, opforge::rank(1), opforge::values_in(0, 8).unique_values().or_value(-1))
          .output("y", opforge::like("table"))
          .reference(ref_index)
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
  EXPECT_EQ(arg["values"], json::parse(R"({"low": "0", "high": "8", "low_rule": {"const": 0},
      "high_rule": {"const": 8}, "unique": true, "sentinel": -1})"));
  std::vector<OpforgeValue> values(3);
  const auto facts = opforge::core::example_facts(*def->spec(), {{5, 3}, {2}, {4}}, values);
  EXPECT_EQ(facts.bounds[1], std::make_pair(int64_t{0}, int64_t{5}));
  EXPECT_EQ(facts.bounds[2], std::make_pair(int64_t{0}, int64_t{8}));
  EXPECT_FALSE(facts.bounds[0].has_value());
}

TEST(ValueDomains, OnlyIntegerInputsIndex) {
  auto def = opforge::detail::make_op("ns", "bad", "f.cpp", 7)
                 .input("x", opforge::floating, opforge::values_in(0, opforge::any))
                 .output("y", opforge::like("x"))
                 .reference(+[](Tensor, MutableTensor) {})
                 .release();
  EXPECT_EQ(
      declaration_problems(*def),
      (std::vector<std::string>{"f.cpp:7: ns::bad: input 'x': values_in(): opforge::any is allowed only in an "
                                "input's shape({...})",
                                "f.cpp:7: ns::bad: input 'x': values_in() applies to integer inputs, but its dtypes "
                                "include float32"}));
}

}  // namespace

namespace {

/// x in {float16, bfloat16, float32, float64} with w following it; the CUDA kernel takes 16-bit x only.
std::unique_ptr<opforge::detail::OpDef> half_kernel_op() {
  return finalized(opforge::detail::make_op("ns", "hk", "f.cpp", 1)
                       .input("x", opforge::floating)
                       .input("w", opforge::same_dtype("x"))
                       .output("y", opforge::like("x"))
                       .reference(two_inputs)
                       .cuda_source("hk.cu", "hk<{T}>")
                       .launch(opforge::elementwise("y"))
                       .kernel_dtypes("x", opforge::half_precision)
                       .release());
}

std::string check_on(const OpforgeOpSpec& op, const char* device, int32_t dtype, const char* label) {
  const std::vector<int64_t> sizes{4};
  std::vector<opforge::core::ArgInfo<int64_t>> args(2);
  for (auto& a : args) {
    a.dtype = dtype;
    a.dtype_label = label;
    a.device_type = device;
    a.sizes = sizes;
  }
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  return opforge::core::check_call<int64_t>(op, args, outs);
}

}  // namespace

TEST(KernelDtypes, ADeviceCallOfADtypeItsKernelDoesNotTakeIsRefused) {
  auto def = half_kernel_op();
  const OpforgeOpSpec& op = *def->spec();
  EXPECT_EQ(check_on(op, "cuda", OPFORGE_DTYPE_FLOAT32, "torch.float32"),
            "ns::hk(Tensor x, Tensor w) -> Tensor: invalid arguments\n"
            "  x: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no other), got "
            "torch.float32");
  EXPECT_EQ(check_on(op, "cuda", OPFORGE_DTYPE_BFLOAT16, "torch.bfloat16"), "");
  EXPECT_EQ(check_on(op, "cpu", OPFORGE_DTYPE_FLOAT64, "torch.float64"), "") << "the reference takes every dtype";
  EXPECT_EQ(check_on(op, "meta", OPFORGE_DTYPE_FLOAT32, "torch.float32"), "") << "no kernel runs on meta";
  // A dtype the declaration refuses is reported once, by its own rule.
  EXPECT_EQ(check_on(op, "cuda", OPFORGE_DTYPE_INT32, "torch.int32"),
            "ns::hk(Tensor x, Tensor w) -> Tensor: invalid arguments\n"
            "  x: expected dtype one of {float32, float64, float16, bfloat16}, got torch.int32");
}

TEST(KernelDtypes, CombinationsPerDeviceAndPrecompileFollowTheKernel) {
  auto def = half_kernel_op();
  const OpforgeOpSpec& op = *def->spec();
  EXPECT_EQ(opforge::core::dtype_combinations_on(op, OPFORGE_DEVICE_CPU).size(), 4u);
  const auto cuda = opforge::core::dtype_combinations_on(op, OPFORGE_DEVICE_CUDA);
  ASSERT_EQ(cuda.size(), 2u);
  for (const auto& c : cuda) EXPECT_TRUE(c[0] == OPFORGE_DTYPE_FLOAT16 || c[0] == OPFORGE_DTYPE_BFLOAT16) << c[0];
  const json d = describe({def.get()});
  EXPECT_EQ(d["ops"][0]["dtype_combinations"].size(), 4u);
  EXPECT_EQ(d["ops"][0]["dtype_combinations_on"]["cpu"].size(), 4u);
  EXPECT_EQ(d["ops"][0]["dtype_combinations_on"]["cuda"],
            json::parse(R"([{"x": "float16", "w": "float16"}, {"x": "bfloat16", "w": "bfloat16"}])"));
  std::vector<OpforgeValue> values(2);
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(op, {OPFORGE_DTYPE_FLOAT32, -1}, values, "sm_90", "");
            }),
            "ns::hk(Tensor x, Tensor w) -> Tensor: invalid arguments\n"
            "  x: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no other), got float32");
  // A set wider than the input admits keeps only what it admits (the message lists no other).
  auto wide = finalized(opforge::detail::make_op("ns", "wide", "f.cpp", 1)
                            .input("x", opforge::kFloat16 | opforge::kFloat32)
                            .output("y", opforge::like("x"))
                            .reference(+[](Tensor, MutableTensor) {})
                            .cuda_source("w.cu", "w<{T}>")
                            .launch(opforge::elementwise("y"))
                            .kernel_dtypes("x", opforge::kFloat16 | opforge::kBFloat16 | opforge::kFloat64)
                            .release());
  EXPECT_EQ(message_of<opforge::InvalidArgument>([&] {
              opforge::core::precompile(*wide->spec(), {OPFORGE_DTYPE_FLOAT32}, std::vector<OpforgeValue>(1), "sm_90",
                                        "");
            }),
            "ns::wide(Tensor x) -> Tensor: invalid arguments\n"
            "  x: expected dtype float16 on cuda (its cuda kernel takes no other), got float32");
  auto plain = finalized(opforge::detail::make_op("ns", "plain", "f.cpp", 1)
                             .input("x", opforge::floating)
                             .output("y", opforge::like("x"))
                             .reference(+[](Tensor, MutableTensor) {})
                             .release());
  EXPECT_TRUE(opforge::core::dtype_combinations_on(*plain->spec(), OPFORGE_DEVICE_CUDA).empty())
      << "no CUDA kernel, no combination on cuda";
}

TEST(KernelDtypes, AZeroedKernelRecordRestrictsNothing) {
  OpforgeKernel k{sizeof(OpforgeKernel), OPFORGE_DEVICE_CUDA, nullptr, nullptr};  // dtype_arg 0, dtypes 0
  EXPECT_FALSE(opforge::core::restricts_dtypes(k));
  EXPECT_TRUE(opforge::core::kernel_takes(k, 0, OPFORGE_DTYPE_FLOAT64));
  k.dtypes = 1u << OPFORGE_DTYPE_FLOAT16;
  EXPECT_TRUE(opforge::core::restricts_dtypes(k));
  EXPECT_FALSE(opforge::core::kernel_takes(k, 0, OPFORGE_DTYPE_FLOAT64));
  EXPECT_TRUE(opforge::core::kernel_takes(k, 0, OPFORGE_DTYPE_FLOAT16));
  EXPECT_TRUE(opforge::core::kernel_takes(k, 1, OPFORGE_DTYPE_FLOAT64)) << "another argument is not restricted";
  EXPECT_FALSE(opforge::core::kernel_takes(k, 0, -1)) << "a dtype opforge does not know";
}
