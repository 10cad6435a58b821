// The op description API: what a declaration records, what it rejects, and the kernel entry.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include "../../src/core/schema.h"
#include "helpers.h"

#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using opforge_test::declaration_problems;

void scale_cpu(opforge::Tensor x, double alpha, int64_t n, std::string_view mode, opforge::MutableTensor y) {
  OPFORGE_CHECK(mode != "fail", "mode 'fail' was asked for");
  for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = static_cast<float>(x.data<float>()[i] * alpha + n);
}

void throws_internal(opforge::Tensor, double, int64_t, std::string_view, opforge::MutableTensor) {
  throw std::runtime_error("device on fire");
}

}  // namespace

OPFORGE_OP(unit, scale)
    .doc("y = x * alpha + n")
    .input("x", opforge::kFloat32, opforge::min_rank(1))
    .param<double>("alpha", 2.0, opforge::in_range(-10, 10))
    .param<int64_t>("n", 0, opforge::at_least(0))  // a default: torch schemas put defaults last
    .param<std::string>("mode", "fast", opforge::one_of({"fast", "fail"}))
    .output("y", opforge::like("x"))
    .reference(scale_cpu);

namespace {

const OpforgeOpSpec* find_op(const char* name) {
  const OpforgeLibrary* lib = opforge_library_v1();
  for (int32_t i = 0; i < lib->num_ops; ++i)
    if (std::strcmp(lib->ops[i]->name, name) == 0) return lib->ops[i];
  return nullptr;
}

TEST(Description, RecordsArgumentsInDeclarationOrder) {
  const OpforgeLibrary* lib = opforge_library_v1();
  ASSERT_EQ(lib->error, nullptr);
  EXPECT_EQ(lib->abi_version, OPFORGE_ABI_VERSION);
  const OpforgeOpSpec* op = find_op("scale");
  ASSERT_NE(op, nullptr);
  EXPECT_STREQ(op->ns, "unit");
  EXPECT_STREQ(op->doc, "y = x * alpha + n");
  EXPECT_NE(std::string(op->file).find("test_description.cpp"), std::string::npos);
  ASSERT_EQ(op->num_args, 4);
  EXPECT_STREQ(op->args[0].name, "x");
  EXPECT_EQ(op->args[0].kind, OPFORGE_ARG_TENSOR);
  EXPECT_EQ(op->args[0].tensor.dtypes, 1u << OPFORGE_DTYPE_FLOAT32);
  EXPECT_EQ(op->args[0].tensor.min_rank, 1);
  EXPECT_EQ(op->args[0].tensor.max_rank, -1);
  EXPECT_EQ(op->args[1].kind, OPFORGE_ARG_FLOAT);
  EXPECT_TRUE(op->args[1].param.has_default);
  EXPECT_EQ(op->args[1].param.default_value.f, 2.0);
  EXPECT_EQ(op->args[1].param.min, -10.0);
  EXPECT_EQ(op->args[1].param.max, 10.0);
  EXPECT_EQ(op->args[2].kind, OPFORGE_ARG_INT);
  EXPECT_TRUE(op->args[2].param.has_default);
  EXPECT_EQ(op->args[2].param.default_value.i, 0);
  EXPECT_TRUE(op->args[2].param.has_min);
  EXPECT_FALSE(op->args[2].param.has_max);
  EXPECT_EQ(op->args[3].kind, OPFORGE_ARG_STRING);
  EXPECT_EQ(std::string(op->args[3].param.default_value.s, op->args[3].param.default_value.len), "fast");
  ASSERT_EQ(op->args[3].param.num_choices, 2);
  EXPECT_STREQ(op->args[3].param.choices[1], "fail");
  ASSERT_EQ(op->num_outputs, 1);
  EXPECT_EQ(op->outputs[0].shape_like, 0);
  EXPECT_EQ(op->outputs[0].dtype_like, 0);
  ASSERT_EQ(op->num_kernels, 1);
  EXPECT_EQ(op->kernels[0].device_type, OPFORGE_DEVICE_CPU);
}

struct Frame {
  float in[3] = {1, 2, 3};
  float out[3] = {-1, -1, -1};
  int64_t sizes[1] = {3}, strides[1] = {1};
  OpforgeArg args[4] = {};
  OpforgeTensor output{};
  OpforgeContext ctx{sizeof(OpforgeContext), OPFORGE_DEVICE_CPU, -1, nullptr, nullptr, nullptr, 0};
  char error[256] = {0};
  OpforgeCallFrame frame{};
  explicit Frame(const char* mode) {
    args[0].tensor = {in, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, sizes, strides};
    args[1].value.kind = OPFORGE_ARG_FLOAT;
    args[1].value.f = 0.5;
    args[2].value.kind = OPFORGE_ARG_INT;
    args[2].value.i = 10;
    args[3].value.kind = OPFORGE_ARG_STRING;
    args[3].value.s = mode;
    args[3].value.len = std::strlen(mode);
    output = {out, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, sizes, strides};
    frame = {sizeof(OpforgeCallFrame), &ctx, 4, args, 1, &output, error, sizeof(error)};
  }
};

TEST(Description, KernelEntryUnpacksTypedArguments) {
  const OpforgeOpSpec* op = find_op("scale");
  Frame f("fast");
  ASSERT_EQ(op->kernels[0].fn(&f.frame, op->kernels[0].user), OPFORGE_STATUS_OK) << f.error;
  EXPECT_EQ(f.out[0], 10.5f);
  EXPECT_EQ(f.out[2], 11.5f);
}

TEST(Description, KernelEntryMapsExceptionsToStatus) {
  const OpforgeOpSpec* op = find_op("scale");
  Frame f("fail");
  EXPECT_EQ(op->kernels[0].fn(&f.frame, op->kernels[0].user), OPFORGE_STATUS_INVALID_ARGUMENT);
  EXPECT_STREQ(f.error, "mode 'fail' was asked for");

  auto def = opforge::detail::make_op("unit", "broken", "f.cpp", 1)
                 .input("x", opforge::kFloat32)
                 .param<double>("alpha")
                 .param<int64_t>("n")
                 .param<std::string>("mode")
                 .output("y", opforge::like("x"))
                 .reference(throws_internal)
                 .release();
  ASSERT_TRUE(def->finalize().empty());
  Frame g("fast");
  EXPECT_EQ(def->spec()->kernels[0].fn(&g.frame, def->spec()->kernels[0].user), OPFORGE_STATUS_INTERNAL);
  EXPECT_STREQ(g.error, "device on fire");
}

void ref1(opforge::Tensor, opforge::MutableTensor) {}
void ref2(opforge::Tensor, opforge::Tensor, opforge::MutableTensor) {}
void ref_p(opforge::Tensor, double, opforge::MutableTensor) {}
void ref_s(opforge::Tensor, std::string_view, opforge::MutableTensor) {}
void ref_3_2(opforge::Tensor, opforge::Tensor, opforge::Tensor, opforge::MutableTensor, opforge::MutableTensor);

std::vector<std::string> errors_of(std::unique_ptr<opforge::detail::OpDef> def) { return declaration_problems(*def); }

TEST(Description, RejectsUnknownNamesWithDeclarationSite) {
  auto errors = errors_of(opforge::detail::make_op("unit", "bad_like", "ops/bad.cpp", 42)
                              .input("x", opforge::floating)
                              .output("y", opforge::like("z"))
                              .reference(ref1)
                              .release());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0],
            "ops/bad.cpp:42: unit::bad_like: output 'y': like(): \"z\" names no tensor input (tensor inputs: x)");
}

TEST(Description, AcceptsRulesOverLaterInputsButNotACycle) {
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "order", "f.cpp", 7)
                          .input("a", opforge::same_dtype("b"), opforge::same_shape("b"))
                          .input("b", opforge::floating)
                          .output("y", opforge::like("a"))
                          .reference(ref2)
                          .release()),
            std::vector<std::string>{});
  // Not a cycle (rotary_embedding's rules): a's values index c, whose dtype follows b, whose size
  // follows a's; values are checked after every shape, and dtypes apart from sizes.
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "mixed", "f.cpp", 7)
                          .input("a", opforge::kInt64, opforge::rank(1), opforge::values_in(0, opforge::dim("c", 0)))
                          .input("b", opforge::floating, opforge::shape({opforge::dim("a", 0)}))
                          .input("c", opforge::same_dtype("b"), opforge::rank(1))
                          .output("y", opforge::like("b"))
                          .output("z", opforge::like("c"))
                          .reference(ref_3_2)
                          .release()),
            std::vector<std::string>{});
  // A broken fixture: a's rules read b's shape, whose rules read a's.
  EXPECT_EQ(
      errors_of(opforge::detail::make_op("unit", "cycle", "f.cpp", 8)
                    .input("a", opforge::floating, opforge::shape({opforge::dim("b", 0)}))
                    .input("b", opforge::same_dtype("a"), opforge::shape({opforge::dim("a", 0), 2}))
                    .output("y", opforge::like("a"))
                    .reference(ref2)
                    .release()),
      std::vector<std::string>{"f.cpp:8: unit::cycle: input 'a': its rules read each other in a cycle: a -> b -> a "
                               "(each input's rules may read only inputs whose rules do not read it back)"});
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "self", "f.cpp", 9)
                          .input("a", opforge::floating, opforge::shape({opforge::any, opforge::dim("a", 0)}))
                          .input("b", opforge::floating)
                          .output("y", opforge::like("a"))
                          .reference(ref2)
                          .release()),
            std::vector<std::string>{"f.cpp:9: unit::self: input 'a': its rules read each other in a cycle: a -> a "
                                     "(each input's rules may read only inputs whose rules do not read it back)"});
}

TEST(Description, LeadingDimsOfNeedsAnInputWithLeadingDims) {
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "tied", "f.cpp", 10)
                          .input("a", opforge::floating, opforge::shape({opforge::leading_dims_of("b"), 4}))
                          .input("b", opforge::floating, opforge::rank(2))
                          .output("y", opforge::like("a"))
                          .reference(ref2)
                          .release()),
            std::vector<std::string>{"f.cpp:10: unit::tied: input 'a': leading_dims_of(\"b\"): 'b' has no leading dims "
                                     "to share: declare its shape as shape({opforge::leading_dims, ...})"});
  EXPECT_EQ(
      errors_of(opforge::detail::make_op("unit", "tied2", "f.cpp", 11)
                    .input("a", opforge::floating, opforge::shape({opforge::leading_dims_of("c"), 4}))
                    .input("b", opforge::floating, opforge::shape({4, opforge::leading_dims_of("a")}))
                    .output("y", opforge::like("a"))
                    .reference(ref2)
                    .release()),
      (std::vector<std::string>{
          "f.cpp:11: unit::tied2: input 'a': leading_dims_of(): \"c\" names no tensor input (tensor inputs: a, b)",
          "f.cpp:11: unit::tied2: input 'b': shape(): opforge::leading_dims_of(\"a\") is allowed only as the first "
          "entry of an input's shape({...})"}));
}

TEST(Description, RulesByPresenceNameAnOptionalInput) {
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "gate", "f.cpp", 12)
                          .input("a", opforge::floating)
                          .input("b", opforge::floating)
                          .require(opforge::when_given("b", opforge::dim("b", 0) == opforge::dim("a", 0)))
                          .require(opforge::unless_given("c", opforge::dim("a", 0) == 1))
                          .output("y", opforge::like("a"))
                          .reference(ref2)
                          .release()),
            (std::vector<std::string>{"f.cpp:12: unit::gate: when_given(\"b\"): names no opforge::optional input (a "
                                      "rule by presence needs an input a call may leave out)",
                                      "f.cpp:12: unit::gate: unless_given(\"c\"): names no opforge::optional input "
                                      "(a rule by presence needs an input a call may leave out)"}));
  // Only a rule checked when the input is given may read it.
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "gate2", "f.cpp", 13)
                          .input("a", opforge::floating)
                          .input("b", opforge::floating, opforge::optional)
                          .require(opforge::when_given("b", opforge::dim("b", 0) == opforge::dim("a", 0))
                                       .otherwise(opforge::dim("b", 0) == 1))
                          .output("y", opforge::like("a"))
                          .reference(ref2)
                          .release()),
            std::vector<std::string>{"f.cpp:13: unit::gate2: unless_given(\"b\"): dim(): \"b\" is an "
                                     "opforge::optional input, which may be absent, so nothing else may refer to it"});
}

TEST(Description, RejectsDefaultOutsideRange) {
  auto errors = errors_of(opforge::detail::make_op("unit", "range", "f.cpp", 3)
                              .input("x", opforge::floating)
                              .param<double>("eps", -1.0, opforge::at_least(0.0))
                              .output("y", opforge::like("x"))
                              .reference(ref_p)
                              .release());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "f.cpp:3: unit::range: param 'eps': the default -1 is outside the declared range [0, inf)");
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "empty_range", "f.cpp", 4)
                          .input("x", opforge::floating)
                          .param<double>("eps", 1.0, opforge::in_range(5.0, 0.0))
                          .output("y", opforge::like("x"))
                          .reference(ref_p)
                          .release()),
            (std::vector<std::string>{"f.cpp:4: unit::empty_range: param 'eps': the declared range [5, 0] is empty"}));
}

TEST(Description, RejectsDefaultOutsideChoices) {
  auto errors = errors_of(opforge::detail::make_op("unit", "choice", "f.cpp", 3)
                              .input("x", opforge::floating)
                              .param<std::string>("mode", "slow", opforge::one_of({"fast", "exact"}))
                              .output("y", opforge::like("x"))
                              .reference(ref_s)
                              .release());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "f.cpp:3: unit::choice: param 'mode': the default \"slow\" is not one of the declared choices");
}

TEST(Description, RejectsMissingReferenceDuplicateNamesAndFloatInShapeRule) {
  auto errors = errors_of(opforge::detail::make_op("unit", "many", "f.cpp", 9)
                              .input("x", opforge::floating)
                              .param<double>("x")
                              .output("y", opforge::shape({opforge::int_param("x")}), opforge::dtype_of("x"))
                              .release());
  ASSERT_EQ(errors.size(), 3u);  // what kept the record from being written, then the record's problems
  EXPECT_EQ(errors[0],
            "f.cpp:9: unit::many: output 'y': int_param(\"x\") names a tensor input: shape rules read int64_t "
            "parameters only (opforge::dim for a tensor's sizes)");
  EXPECT_EQ(errors[1],
            "f.cpp:9: unit::many: no CPU reference: add .reference(fn), or an .equivalent() torch expression beside a "
            "device kernel");
  EXPECT_EQ(errors[2], "f.cpp:9: unit::many: param 'x': declared twice");
  void (*ref)(opforge::Tensor, double, opforge::MutableTensor) = [](opforge::Tensor, double, opforge::MutableTensor) {};
  auto wrong_kind = errors_of(opforge::detail::make_op("unit", "kind", "f.cpp", 10)
                                  .input("x", opforge::floating)
                                  .param<double>("eps", 1e-6)
                                  .output("y", opforge::shape({opforge::int_param("eps")}), opforge::dtype_of("x"))
                                  .reference(ref)
                                  .release());
  EXPECT_EQ(wrong_kind, (std::vector<std::string>{"f.cpp:10: unit::kind: output 'y': int_param(\"eps\") names a double "
                                                  "parameter: shape rules read int64_t parameters only (opforge::dim "
                                                  "for a tensor's sizes)"}));
  auto unknown = errors_of(opforge::detail::make_op("unit", "unknown", "f.cpp", 11)
                               .input("x", opforge::floating)
                               .param<double>("eps", 1e-6)
                               .output("y", opforge::shape({opforge::int_param("n")}), opforge::dtype_of("x"))
                               .reference(ref)
                               .release());
  EXPECT_EQ(unknown, (std::vector<std::string>{"f.cpp:11: unit::unknown: output 'y': int_param(\"n\") names no int64_t "
                                               "parameter (parameters: eps)"}));
}

TEST(Description, RejectsNamesTorchCompileCannotTake) {
  // Python keywords break torch.fx's signatures (Inductor, AOTInductor); a "self" beside an
  // "input" collides there, since torch's Python signatures call "self" "input".
  auto errors = errors_of(opforge::detail::make_op("unit", "names", "f.cpp", 4)
                              .input("self", opforge::floating)
                              .input("input", opforge::floating)
                              .param<double>("lambda", 1.0)
                              .output("from", opforge::like("self"))
                              .reference(+[](opforge::Tensor, opforge::Tensor, double, opforge::MutableTensor) {})
                              .release());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:4: unit::names: input 'self': \"self\" beside an argument named \"input\": torch's "
                        "Python signatures call a \"self\" argument \"input\", so the two collide under torch.compile; "
                        "rename one",
                        "f.cpp:4: unit::names: param 'lambda': \"lambda\" is a Python keyword, which torch.compile and "
                        "AOTInductor cannot take as an argument name; rename it",
                        "f.cpp:4: unit::names: output 'from': \"from\" is a Python keyword, which torch.compile and "
                        "AOTInductor cannot take as an argument name; rename it"}));
  auto alone = errors_of(opforge::detail::make_op("unit", "self_alone", "f.cpp", 5)
                             .input("self", opforge::floating)
                             .output("y", opforge::like("self"))
                             .reference(+[](opforge::Tensor, opforge::MutableTensor) {})
                             .release());
  EXPECT_TRUE(alone.empty()) << alone.front();  // works everywhere, as torch's own ops show
}

TEST(Description, RejectsOpWithoutTensorInput) {
  auto errors = errors_of(opforge::detail::make_op("unit", "notensor", "f.cpp", 1)
                              .param<int64_t>("n")
                              .output("y", opforge::shape({opforge::int_param("n")}), opforge::kFloat32)
                              .release());
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0],
            "f.cpp:1: unit::notensor: no CPU reference: add .reference(fn), or an .equivalent() torch expression "
            "beside a device kernel");
  EXPECT_EQ(errors[1],
            "f.cpp:1: unit::notensor: an op takes at least one tensor .input() (it sets the device outputs are "
            "allocated on)");
}

void ref_k(opforge::Tensor, int64_t, std::string_view, opforge::MutableTensor) {}

TEST(Description, RuntimeKernelChecks) {
  auto errors = errors_of(opforge::detail::make_op("unit", "rtc", "f.cpp", 2)
                              .input("x", opforge::floating)
                              .param<int64_t>("k", opforge::compile_time)
                              .param<std::string>("mode")
                              .output("y", opforge::like("x"))
                              .reference(ref_k)
                              .cuda_source("k.cu", "k<{T}, {k}, {z}, {T_y}, {T_w}>")
                              .cuda_source("../escape.cu", "k")
                              .launch(opforge::elementwise("nothing"))
                              .release());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:2: unit::rtc: cuda_source(\"k.cu\"): no launch rule: add "
                        ".launch(opforge::elementwise(...)) or another",
                        "f.cpp:2: unit::rtc: cuda_source(\"../escape.cu\"): launch rule: \"nothing\" names no "
                        "tensor input or output (tensors: x, y)",
                        "f.cpp:2: unit::rtc: more than one CUDA kernel (.cuda() or .cuda_source())",
                        "f.cpp:2: unit::rtc: param 'mode': run-time kernels take int64_t, double and bool "
                        "arguments; mark it opforge::compile_time",
                        "f.cpp:2: unit::rtc: cuda_source(\"k.cu\"): {z} names no parameter (use {T}, {T_<tensor>} "
                        "or {<compile_time param>})",
                        "f.cpp:2: unit::rtc: cuda_source(\"k.cu\"): {T_w}: \"w\" names no tensor input (tensor "
                        "inputs: x)",
                        "f.cpp:2: unit::rtc: cuda_source(\"../escape.cu\"): the file must be a relative path inside "
                        "the library's kernel folder",
                    }));
}

TEST(Description, CompileTimeNeedsARuntimeKernel) {
  auto errors = errors_of(opforge::detail::make_op("unit", "ct", "f.cpp", 3)
                              .input("x", opforge::floating)
                              .param<int64_t>("k", opforge::compile_time)
                              .param<std::string>("mode")
                              .output("y", opforge::like("x"))
                              .reference(ref_k)
                              .release());
  EXPECT_EQ(
      errors,
      (std::vector<std::string>{"f.cpp:3: unit::ct: compile_time parameters need a run-time kernel (.cuda_source())"}));
}

TEST(Dtype, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(opforge::Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(opforge::Half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(opforge::Half(65520.0f).bits, 0x7c00);                 // halfway to 2^16: rounds to inf
  EXPECT_EQ(opforge::Half(5.9604644775390625e-08f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(opforge::Half(1.0f + 1.0f / 2048).bits, 0x3c00);       // tie, to even
  EXPECT_EQ(opforge::Half(1.0f + 3.0f / 2048).bits, 0x3c02);       // tie, to even (up)
  EXPECT_EQ(opforge::Half(-2.0f).bits, 0xc000);
  EXPECT_TRUE(std::isnan(static_cast<float>(opforge::Half(NAN))));
  EXPECT_EQ(static_cast<float>(opforge::Half(0.333251953125f)), 0.333251953125f);  // exact in half
  EXPECT_EQ(static_cast<float>(opforge::Half::to_float(0x0001)), 5.9604644775390625e-08f);
}

TEST(Dtype, BFloat16ConversionsRoundToNearestEven) {
  EXPECT_EQ(opforge::BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(opforge::BFloat16(1.0f + 1.0f / 256).bits, 0x3f80);  // tie, to even
  EXPECT_EQ(opforge::BFloat16(1.0f + 3.0f / 256).bits, 0x3f82);  // tie, to even (up)
  EXPECT_TRUE(std::isnan(static_cast<float>(opforge::BFloat16(NAN))));
  EXPECT_EQ(static_cast<float>(opforge::BFloat16(-3.5f)), -3.5f);
}

TEST(Dtype, VisitInstantiatesOnlyTheAllowedSet) {
  int seen = 0;
  opforge::visit_dtype<opforge::floating>(
      opforge::kBFloat16, [&]<class T>(opforge::type_tag<T>) { seen = std::is_same_v<T, opforge::BFloat16> ? 1 : 2; });
  EXPECT_EQ(seen, 1);
  EXPECT_THROW(opforge::visit_dtype<opforge::floating>(opforge::kInt32, [&]<class T>(opforge::type_tag<T>) {}),
               opforge::InvalidArgument);
}

}  // namespace

void ref_xy(opforge::Tensor, opforge::MutableTensor) {}

TEST(Description, RowKernelBlocksAreWholeWarps) {
  auto errors = errors_of(opforge::detail::make_op("unit", "rows", "f.cpp", 4)
                              .input("x", opforge::floating)
                              .output("y", opforge::like("x"))
                              .reference(ref_xy)
                              .cuda_source("k.cu", "k<{T}>")
                              .launch(opforge::rows("x", 100))
                              .release());
  EXPECT_EQ(errors, (std::vector<std::string>{"f.cpp:4: unit::rows: cuda_source(\"k.cu\"): threads per block of a "
                                              "row kernel must be a multiple of 32 (whole warps)"}));
  EXPECT_TRUE(errors_of(opforge::detail::make_op("unit", "rows_auto", "f.cpp", 5)
                            .input("x", opforge::floating)
                            .output("y", opforge::like("x"))
                            .reference(ref_xy)
                            .cuda_source("k.cu", "k<{T}>")
                            .launch(opforge::rows("x"))
                            .release())
                  .empty());
}

void ref_int(opforge::Tensor, int64_t, opforge::MutableTensor) {}

TEST(Description, IntegerChoices) {
  auto errors = errors_of(opforge::detail::make_op("unit", "ints", "f.cpp", 6)
                              .input("x", opforge::floating)
                              .param<int64_t>("head_dim", 96, opforge::one_of({64, 128}))
                              .output("y", opforge::like("x"))
                              .reference(ref_int)
                              .release());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:6: unit::ints: param 'head_dim': the default 96 is not one of the declared choices"}));
}

// ---- optional tensor inputs ----------------------------------------------------------------

namespace {

struct Seen {
  bool defined = true;
  int32_t ndim = -2;
  int64_t numel = -2;
  bool null_data = false;
  bool contiguous = false;
};
Seen g_seen;

void note(opforge::Tensor mask) {
  g_seen = {mask.defined(), mask.ndim(), mask.numel(), mask.raw_data() == nullptr, mask.is_contiguous()};
}

void masked_ref(opforge::Tensor x, opforge::Tensor mask, double fill, opforge::MutableTensor y) {
  note(mask);
  for (int64_t i = 0; i < x.numel(); ++i)
    y.data<float>()[i] = mask.defined() && mask.data<bool>()[i] ? static_cast<float>(fill) : x.data<float>()[i];
}

opforge::LaunchConfig masked_grid(opforge::Tensor, opforge::Tensor mask, double, opforge::MutableTensor y) {
  note(mask);
  opforge::LaunchConfig c;
  c.args = {y.numel()};
  return c;
}

std::unique_ptr<opforge::detail::OpDef> masked_op() {
  auto def = opforge::detail::make_op("unit", "masked", "f.cpp", 1)
                 .input("x", opforge::kFloat32)
                 .input("mask", opforge::optional, opforge::kBool, opforge::same_shape("x"))
                 .param<double>("fill", 0.0)
                 .output("y", opforge::like("x"))
                 .reference(masked_ref)
                 .cuda_source("masked.cu", "masked")
                 .launch_grid(masked_grid)
                 .release();
  EXPECT_TRUE(declaration_problems(*def).empty());
  return def;
}

struct MaskedFrame {
  float in[3] = {1, 2, 3};
  bool mask[3] = {false, true, false};
  float out[3] = {-1, -1, -1};
  int64_t sizes[1] = {3}, strides[1] = {1};
  OpforgeArg args[3] = {};
  OpforgeTensor output{};
  OpforgeContext ctx{sizeof(OpforgeContext), OPFORGE_DEVICE_CPU, -1, nullptr, nullptr, nullptr, 0};
  char error[256] = {0};
  OpforgeCallFrame frame{};
  explicit MaskedFrame(bool with_mask) {
    args[0].tensor = {in, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, sizes, strides};
    args[1].tensor = with_mask ? OpforgeTensor{mask, OPFORGE_DTYPE_BOOL, OPFORGE_DEVICE_CPU, -1, 1, sizes, strides}
                               : OpforgeTensor{nullptr, -1, OPFORGE_DEVICE_CPU, -1, -1, nullptr, nullptr};  // absent
    args[2].value.kind = OPFORGE_ARG_FLOAT;
    args[2].value.f = 9;
    output = {out, OPFORGE_DTYPE_FLOAT32, OPFORGE_DEVICE_CPU, -1, 1, sizes, strides};
    frame = {sizeof(OpforgeCallFrame), &ctx, 3, args, 1, &output, error, sizeof(error)};
  }
};

TEST(Optional, RecordedInTheSpec) {
  auto def = masked_op();
  const OpforgeOpSpec& op = *def->spec();
  EXPECT_EQ(op.args[0].tensor.optional, 0);
  EXPECT_EQ(op.args[1].tensor.optional, 1);
  EXPECT_EQ(op.args[1].tensor.dtypes, 1u << OPFORGE_DTYPE_BOOL);
  EXPECT_EQ(op.args[1].tensor.shape_like, 0);
}

TEST(Optional, KernelsGetAnUndefinedTensor) {
  auto def = masked_op();
  const OpforgeKernel& ref = def->spec()->kernels[0];
  MaskedFrame absent(false);
  ASSERT_EQ(ref.fn(&absent.frame, ref.user), OPFORGE_STATUS_OK) << absent.error;
  EXPECT_FALSE(g_seen.defined);
  EXPECT_EQ(g_seen.ndim, 0);
  EXPECT_EQ(g_seen.numel, 0);
  EXPECT_TRUE(g_seen.null_data);
  EXPECT_TRUE(g_seen.contiguous);
  EXPECT_EQ(absent.out[1], 2.0f);

  MaskedFrame given(true);
  ASSERT_EQ(ref.fn(&given.frame, ref.user), OPFORGE_STATUS_OK) << given.error;
  EXPECT_TRUE(g_seen.defined);
  EXPECT_EQ(g_seen.ndim, 1);
  EXPECT_EQ(g_seen.numel, 3);
  EXPECT_EQ(given.out[0], 1.0f);
  EXPECT_EQ(given.out[1], 9.0f);
}

TEST(Optional, GridFunctionsGetAnUndefinedTensor) {
  auto def = masked_op();
  const opforge::detail::LaunchRule& rule = def->runtime_kernels[0]->rule;
  MaskedFrame absent(false);
  EXPECT_EQ(rule.grid_entry(&absent.frame, rule.grid_fn).args, (std::vector<int64_t>{3}));
  EXPECT_FALSE(g_seen.defined);
  MaskedFrame given(true);
  rule.grid_entry(&given.frame, rule.grid_fn);
  EXPECT_TRUE(g_seen.defined);
}

void ref_4_2(opforge::Tensor, opforge::Tensor, opforge::Tensor, opforge::Tensor, opforge::MutableTensor,
             opforge::MutableTensor) {}

TEST(Optional, NothingButAnOutputMayReferToAnOptionalInput) {
  auto errors = errors_of(opforge::detail::make_op("unit", "refs", "f.cpp", 8)
                              .input("x", opforge::floating)
                              .input("mask", opforge::optional, opforge::kBool)
                              .input("w", opforge::optional, opforge::same_dtype("mask"), opforge::same_shape("mask"))
                              .input("v", opforge::optional, opforge::shape({opforge::dim("mask", 0)}))
                              .output("y", opforge::like("mask"))
                              .output("z", opforge::shape({opforge::dim("mask", -1)}), opforge::dtype_of("mask"))
                              .reference(ref_4_2)
                              .cuda_source("k.cu", "k<{T_mask}>")
                              .launch(opforge::elementwise("mask"))
                              .release());
  const std::string why =
      "\"mask\" is an opforge::optional input, which may be absent, so nothing else may refer to it";
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:8: unit::refs: input 'w': same_dtype(): " + why,
                        "f.cpp:8: unit::refs: input 'w': same_shape(): " + why,
                        "f.cpp:8: unit::refs: input 'v': shape(): dim(): " + why,
                        "f.cpp:8: unit::refs: cuda_source(\"k.cu\"): launch rule: " + why,
                        "f.cpp:8: unit::refs: cuda_source(\"k.cu\"): {T_mask}: " + why,
                    }));
}

void ref_3_2(opforge::Tensor, opforge::Tensor, opforge::Tensor, opforge::MutableTensor, opforge::MutableTensor) {}

// An output whose rules read an optional input exists when that input is given (`Tensor?`).
TEST(Optional, AnOutputOfAnOptionalInputExistsWithIt) {
  auto def = opforge::detail::make_op("unit", "pair", "f.cpp", 10)
                 .input("x", opforge::floating)
                 .input("key", opforge::optional, opforge::floating)
                 .input("bias", opforge::optional, opforge::floating)
                 .output("y", opforge::like("x"))
                 .output("key_out", opforge::like("key"))
                 .reference(ref_3_2)
                 .release();
  ASSERT_TRUE(declaration_problems(*def).empty());
  const OpforgeOpSpec& op = *def->spec();
  EXPECT_EQ(op.outputs[0].present_with, -1);
  EXPECT_EQ(op.outputs[1].present_with, 1);
  EXPECT_EQ(opforge::core::schema(op), "pair(Tensor x, Tensor? key=None, Tensor? bias=None) -> (Tensor, Tensor?)");
  EXPECT_FALSE(opforge::core::has_out_overload(op));  // an out= tensor that may not exist

  auto two = opforge::detail::make_op("unit", "two", "f.cpp", 11)
                 .input("x", opforge::floating)
                 .input("key", opforge::optional, opforge::floating)
                 .input("bias", opforge::optional, opforge::floating)
                 .output("y", opforge::like("x"))
                 .output("z", opforge::shape({opforge::dim("key", 0), opforge::dim("bias", 0)}), opforge::kFloat32)
                 .reference(ref_3_2)
                 .cuda_source("k.cu", "k<{T_z}>")
                 .launch(opforge::elementwise("z"))
                 .release();
  EXPECT_EQ(declaration_problems(*two),
            (std::vector<std::string>{
                "f.cpp:11: unit::two: output 'z': dim(): \"bias\" is an opforge::optional input, which may be absent, "
                "so nothing but one output's rules (an output that exists when it is given) may refer to it",
                "f.cpp:11: unit::two: cuda_source(\"k.cu\"): launch rule: \"z\" exists only when 'key' is given; "
                "launch by a tensor every call has",
                "f.cpp:11: unit::two: cuda_source(\"k.cu\"): {T_z}: \"z\" exists only when 'key' is given, so its "
                "dtype cannot name an instantiation",
            }));
}

void ref_1_2(opforge::Tensor, opforge::MutableTensor, opforge::MutableTensor) {}
void ref_1_3(opforge::Tensor, opforge::MutableTensor, opforge::MutableTensor, opforge::MutableTensor) {}

TEST(DataDependent, ASizeFromAZeroDimInt64Output) {
  auto def =
      opforge::detail::make_op("unit", "compact", "f.cpp", 12)
          .input("x", opforge::floating)
          .output("count", opforge::shape({}), opforge::kInt64)
          .output("kept", opforge::shape({opforge::size_of("count", opforge::dim("x", 0))}), opforge::dtype_of("x"))
          .reference(ref_1_2)
          .release();
  ASSERT_TRUE(declaration_problems(*def).empty());
  const OpforgeOpSpec& op = *def->spec();
  EXPECT_EQ(op.outputs[1].size_from, 0);
  EXPECT_EQ(opforge::core::expr_string(op, op.outputs[1].dims[0]), "x.size(0)");  // the bound
  EXPECT_TRUE(opforge::core::has_data_dependent_sizes(op));
  EXPECT_FALSE(opforge::core::has_out_overload(op));
  EXPECT_EQ(opforge::core::fake_companion_schema(op),
            "_opforge_fake_compact(Tensor x, *, SymInt[] data_dependent_sizes) -> (Tensor, Tensor)");

  auto bad = opforge::detail::make_op("unit", "bad_compact", "f.cpp", 13)
                 .input("x", opforge::floating, opforge::shape({opforge::size_of("n", 4)}))
                 .output("n", opforge::shape({2}), opforge::kInt64)
                 .output("kept", opforge::shape({opforge::size_of("n", opforge::dim("x", 0))}), opforge::kFloat32)
                 .output("more", opforge::shape({opforge::size_of("nowhere", 3)}), opforge::kFloat32)
                 .reference(ref_1_3)
                 .release();
  EXPECT_EQ(declaration_problems(*bad),
            (std::vector<std::string>{
                "f.cpp:13: unit::bad_compact: input 'x': shape(): opforge::size_of(\"n\", ...) is allowed only as the "
                "first dim of an output's shape({...})",
                "f.cpp:13: unit::bad_compact: output 'more': size_of(\"nowhere\"): names no output of this op",
                "f.cpp:13: unit::bad_compact: output 'kept': size_of(\"n\"): the size must come from a 0-dim int64 "
                "output, opforge::shape({}) with opforge::kInt64",
            }));
}

void ref_3_2p(opforge::Tensor, opforge::Tensor, opforge::Tensor, double, double, opforge::MutableTensor) {}

TEST(Optional, ComesAfterTheFirstTensorAndMayPrecedeRequiredArguments) {
  auto errors = errors_of(opforge::detail::make_op("unit", "order", "f.cpp", 9)
                              .input("mask", opforge::optional)
                              .input("x", opforge::floating)
                              .input("b", opforge::optional)
                              .param<double>("eps")
                              .param<double>("scale", 1.0)
                              .output("y", opforge::like("x"))
                              .reference(ref_3_2p)
                              .release());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:9: unit::order: input 'mask': the first tensor input cannot be opforge::optional "
                        "(it sets the outputs' device and the run-time kernels' {T})",
                    }));  // mask and b have no default (`Tensor? b`): required arguments follow them
}

void ref_1_2p(opforge::Tensor, double, opforge::Tensor, int64_t, opforge::MutableTensor) {}
void ref_1_1p_2(opforge::Tensor, double, opforge::Tensor, opforge::Tensor, opforge::MutableTensor) {}
void ref_dims(opforge::Tensor, std::span<const int64_t>, opforge::MutableTensor) {}

TEST(Description, AListDefaultMayBeAStdVector) {
  // The constraint concepts call detail::apply qualified: unqualified, ADL found std::apply for
  // a std::vector argument and failed to compile inside <tuple>.
  auto def = opforge::detail::make_op("unit", "dims", "f.cpp", 7)
                 .input("x", opforge::floating)
                 .param<std::vector<int64_t>>("dims", std::vector<int64_t>{1, 2})
                 .output("y", opforge::like("x"))
                 .reference(ref_dims)
                 .release();
  EXPECT_TRUE(errors_of(std::move(def)).empty());
}

TEST(Optional, ARequiredArgumentAfterADefaultedParamIsAnError) {
  // torch's schema parser would assert ("Non-default positional argument follows default argument").
  auto errors = errors_of(opforge::detail::make_op("unit", "late", "f.cpp", 9)
                              .input("x", opforge::floating)
                              .param<double>("a", 1.0)
                              .input("w", opforge::floating)
                              .param<int64_t>("n")
                              .output("y", opforge::like("x"))
                              .reference(ref_1_2p)
                              .release());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:9: unit::late: input 'w': follows the param 'a' with a default, so it must be "
                        "optional too (torch schemas put arguments with defaults last)",
                        "f.cpp:9: unit::late: param 'n': follows the param 'a' with a default, so it needs a "
                        "default (torch schemas put arguments with defaults last)",
                    }));
  // An optional input after a default is refused where a required argument follows it, by that argument.
  errors = errors_of(opforge::detail::make_op("unit", "late", "f.cpp", 9)
                         .input("x", opforge::floating)
                         .param<double>("a", 1.0)
                         .input("o", opforge::optional)
                         .input("w", opforge::floating)
                         .output("y", opforge::like("x"))
                         .reference(ref_1_1p_2)
                         .release());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:9: unit::late: input 'w': follows the param 'a' with a default, so it must be "
                        "optional too (torch schemas put arguments with defaults last)",
                    }));
}

}  // namespace

TEST(Description, ShardDimsAreRecordedAsABitmask) {
  auto def = opforge::detail::make_op("unit", "dims", "f.cpp", 7)
                 .input("x", opforge::floating)
                 .output("y", opforge::like("x"))
                 .reference(ref_xy)
                 .sharding(opforge::shard_dims({0, 2}))
                 .release();
  EXPECT_TRUE(declaration_problems(*def).empty());
  EXPECT_EQ(def->spec()->sharding, OPFORGE_SHARDING_DIMS);
  EXPECT_EQ(def->spec()->sharding_dims, 0b101u);
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "bad_dims", "f.cpp", 8)
                          .input("x", opforge::floating)
                          .output("y", opforge::like("x"))
                          .reference(ref_xy)
                          .sharding(opforge::shard_dims({40}))
                          .release()),
            (std::vector<std::string>{"f.cpp:8: unit::bad_dims: shard_dims(): dim 40 is outside [0, 32)"}));
  EXPECT_EQ(errors_of(opforge::detail::make_op("unit", "past_rank", "f.cpp", 9)
                          .input("x", opforge::floating, opforge::rank(2))
                          .output("y", opforge::like("x"))
                          .reference(ref_xy)
                          .sharding(opforge::shard_dims({2}))
                          .release()),
            (std::vector<std::string>{
                "f.cpp:9: unit::past_rank: shard_dims(): dim 2 is not a dim of the first tensor input (rank 2)"}));
}

namespace {

void ref_f(opforge::Tensor, double, opforge::MutableTensor) {}
void ref_str(opforge::Tensor, std::string_view, opforge::MutableTensor) {}
void ref_two(opforge::Tensor, opforge::MutableTensor, opforge::MutableTensor) {}

/// The declaration errors of one op built by `body` from make_op("unit", name, "f.cpp", 2).
template <class Body>
std::vector<std::string> declaration_errors(const char* name, Body&& body) {
  return declaration_problems(*body(opforge::detail::make_op("unit", name, "f.cpp", 2)).release());
}

}  // namespace

TEST(Description, EveryDeclarationRuleHasItsMessage) {
  const auto pre = [](const char* op) { return std::string("f.cpp:2: unit::") + op + ": "; };
  EXPECT_EQ(declaration_errors("ct_float",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .param<double>("alpha", 1.0, opforge::compile_time)
                                     .output("y", opforge::like("x"))
                                     .reference(ref_f)
                                     .cuda_source("k.cu", "k<{T}>")
                                     .launch(opforge::elementwise("y"));
                               }),
            (std::vector<std::string>{
                pre("ct_float") + "param 'alpha': compile_time applies to int64_t, bool and std::string parameters"}));
  EXPECT_EQ(declaration_errors("str_rtc",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .param<std::string>("mode", "a")
                                     .output("y", opforge::like("x"))
                                     .reference(ref_str)
                                     .cuda_source("/abs/k.cu", "k<{T>")
                                     .launch(opforge::elementwise("y").threads_per_block(2000).items_per_thread(0));
                               }),
            (std::vector<std::string>{
                pre("str_rtc") + "cuda_source(\"/abs/k.cu\"): threads per block must be in [1, 1024]",
                pre("str_rtc") + "cuda_source(\"/abs/k.cu\"): items (or bytes) per thread must be positive",
                pre("str_rtc") + "param 'mode': run-time kernels take int64_t, double and bool arguments; mark it "
                                 "opforge::compile_time",
                pre("str_rtc") + "cuda_source(\"/abs/k.cu\"): the file must be a relative path inside the library's "
                                 "kernel folder",
                pre("str_rtc") + "cuda_source(\"/abs/k.cu\"): unclosed '{' in the kernel name \"k<{T>\""}));
  EXPECT_EQ(declaration_errors("no_rule",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .output("y", opforge::like("x"))
                                     .reference(ref1)
                                     .cuda_source("k.cu", "k<{T}>");
                               }),
            (std::vector<std::string>{pre("no_rule") +
                                      "cuda_source(\"k.cu\"): no launch rule: add .launch(opforge::elementwise(...)) "
                                      "or another"}));
  EXPECT_EQ(declaration_errors("launch_first",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .output("y", opforge::like("x"))
                                     .reference(ref1)
                                     .launch(opforge::elementwise("y"));
                               }),
            (std::vector<std::string>{pre("launch_first") + ".launch() comes after the .cuda_source() it applies to"}));
  // The two ways of a kernel beside the device value check: each follows its kernel and needs a
  // checked input; one kernel takes one of them.
  for (const bool checks : {false, true}) {
    const std::string step = checks ? ".checks_values_in_kernel()" : ".waits_for_value_checks()";
    const auto beside = [checks](auto b) {
      return checks ? std::move(b).checks_values_in_kernel() : std::move(b).waits_for_value_checks();
    };
    const auto op = [&](std::string name) { return (checks ? "checks_" : "waits_") + name; };
    EXPECT_EQ(
        declaration_errors(op("first").c_str(),
                           [&](opforge::OpBuilder<false> b) {
                             return beside(std::move(b)
                                               .input("x", opforge::floating)
                                               .input("i", opforge::kInt64, opforge::values_in(0, opforge::dim("x", 0)))
                                               .output("y", opforge::like("x"))
                                               .reference(ref2))
                                 .cuda_source("k.cu", "k<{T}>")
                                 .launch(opforge::elementwise("y"));
                           }),
        (std::vector<std::string>{pre(op("first").c_str()) + step +
                                  " comes after the .cuda_source() or .cuda_binary() kernel it applies to"}));
    EXPECT_EQ(declaration_errors(op("unchecked").c_str(),
                                 [&](opforge::OpBuilder<false> b) {
                                   return beside(std::move(b)
                                                     .input("x", opforge::floating)
                                                     .input("i", opforge::kInt64)
                                                     .output("y", opforge::like("x"))
                                                     .reference(ref2)
                                                     .cuda_source("k.cu", "k<{T}>")
                                                     .launch(opforge::elementwise("y")));
                                 }),
              (std::vector<std::string>{pre(op("unchecked").c_str()) + "cuda_source(\"k.cu\"): " + step +
                                        " but no input declares opforge::values_in(...): " +
                                        (checks ? "there is no value to check" : "there is no check to wait for")}));
    EXPECT_EQ(
        declaration_errors(op("ok").c_str(),
                           [&](opforge::OpBuilder<false> b) {
                             return beside(std::move(b)
                                               .input("x", opforge::floating)
                                               .input("i", opforge::kInt64, opforge::values_in(0, opforge::dim("x", 0)))
                                               .output("y", opforge::like("x"))
                                               .reference(ref2)
                                               .cuda_source("k.cu", "k<{T}>")
                                               .launch(opforge::elementwise("y")));
                           }),
        std::vector<std::string>{});
  }
  EXPECT_EQ(declaration_errors("checks_and_waits",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .input("i", opforge::kInt64, opforge::values_in(0, opforge::dim("x", 0)))
                                     .output("y", opforge::like("x"))
                                     .reference(ref2)
                                     .cuda_source("k.cu", "k<{T}>")
                                     .launch(opforge::elementwise("y"))
                                     .checks_values_in_kernel()
                                     .waits_for_value_checks();
                               }),
            (std::vector<std::string>{pre("checks_and_waits") +
                                      "cuda_source(\"k.cu\"): .checks_values_in_kernel() and "
                                      ".waits_for_value_checks(): a kernel that checks its own values has no separate "
                                      "check to wait for; keep one"}));
  EXPECT_EQ(declaration_errors("shapes",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::DtypeSet(0))
                                     .output("y", opforge::shape({opforge::any}), opforge::dtype_of("x"))
                                     .reference(ref1);
                               }),
            (std::vector<std::string>{pre("shapes") + "output 'y': opforge::any is allowed only in an input's "
                                                      "shape({...})",
                                      pre("shapes") + "input 'x': the dtype set is empty"}));
  EXPECT_EQ(declaration_errors("params",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .param<double>("a", 1.0, opforge::one_of({1, 2}))
                                     .param<int64_t>("b", 1, opforge::one_of({"one"}))
                                     .param<std::string>("c", "x", opforge::at_least(0))
                                     .output("y", opforge::like("x"))
                                     .reference(+[](opforge::Tensor, double, int64_t, std::string_view,
                                                    opforge::MutableTensor) {});
                               }),
            (std::vector<std::string>{
                pre("params") + "param 'a': one_of() with integers applies to int64_t parameters only",
                pre("params") + "param 'b': one_of() with strings applies to std::string parameters only",
                pre("params") + "param 'c': a range applies to numeric parameters only, not std::string"}));
  EXPECT_EQ(declaration_errors("outputs",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .output("x", opforge::like("x"))
                                     .output("2y", opforge::shape({opforge::dim("x", 0)}),
                                             static_cast<opforge::Dtype>(99))
                                     .reference(ref_two);
                               }),
            (std::vector<std::string>{pre("outputs") + "output '2y': no dtype rule",
                                      pre("outputs") + "output 'x': the name is already used by an argument or output",
                                      pre("outputs") + "output '2y': the name must be an identifier"}));
}

TEST(Description, RejectsNamesStartingWithTwoUnderscores) {
  for (const auto& [ns, name] : {std::pair<const char*, const char*>{"unit", "__hidden"}, {"__unit", "op"}}) {
    auto errors = errors_of(opforge::detail::make_op(ns, name, "f.cpp", 2)
                                .input("x", opforge::floating)
                                .output("y", opforge::like("x"))
                                .reference(+[](opforge::Tensor, opforge::MutableTensor) {})
                                .release());
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_EQ(errors[0], std::string("f.cpp:2: ") + ns + "::" + name +
                             ": namespace and op name must not start with \"__\": C++ reserves such names, and "
                             "Python mangles them inside classes (torch.ops.ns.__op in a method is looked up as "
                             "_Class__op)");
  }
  auto fine = errors_of(opforge::detail::make_op("unit", "a__b", "f.cpp", 3)
                            .input("x", opforge::floating)
                            .output("y", opforge::like("x"))
                            .reference(+[](opforge::Tensor, opforge::MutableTensor) {})
                            .release());
  EXPECT_TRUE(fine.empty()) << fine.front();
}

TEST(KernelDtypes, DeclarationMistakesAreNamed) {
  const auto pre = [](const char* op) { return std::string("f.cpp:2: unit::") + op + ": "; };
  const auto with = [](std::string input, opforge::DtypeSet dtypes, bool device_kernel) {
    return [=](opforge::OpBuilder<false> b) {
      auto o = std::move(b)
                   .input("x", opforge::kFloat16 | opforge::kFloat32)
                   .input("w", opforge::optional, opforge::same_dtype("x"))
                   .param<double>("alpha", 1.0)
                   .output("y", opforge::like("x"))
                   .reference(+[](opforge::Tensor, opforge::Tensor, double, opforge::MutableTensor) {});
      if (!device_kernel) return std::move(o).kernel_dtypes(input, dtypes);
      return std::move(o).cuda_source("k.cu", "k<{T}>").launch(opforge::elementwise("y")).kernel_dtypes(input, dtypes);
    };
  };
  EXPECT_EQ(declaration_errors("ok", with("x", opforge::kFloat16, true)), std::vector<std::string>{});
  EXPECT_EQ(declaration_errors("first", with("x", opforge::kFloat16, false)),
            (std::vector<std::string>{pre("first") + "kernel_dtypes(\"x\"): must follow the device kernel it applies "
                                                     "to (.cuda() or .cuda_source())"}));
  for (const auto& [name, what] :
       std::vector<std::pair<std::string, std::string>>{{"alpha", "names a parameter"},
                                                        {"w", "names an optional input, which a call may leave out"},
                                                        {"nope", "names no input"}})
    EXPECT_EQ(declaration_errors("arg", with(name, opforge::kFloat16, true)),
              (std::vector<std::string>{pre("arg") + "kernel_dtypes(\"" + name + "\"): " + what +
                                        "; expected a required tensor input (x)"}))
        << name;
  EXPECT_EQ(declaration_errors("empty", with("x", opforge::DtypeSet(0), true)),
            (std::vector<std::string>{pre("empty") + "kernel_dtypes(\"x\"): the dtype set is empty"}));
  EXPECT_EQ(declaration_errors("disjoint", with("x", opforge::kBFloat16, true)),
            (std::vector<std::string>{pre("disjoint") +
                                      "kernel_dtypes(\"x\"): none of these dtypes is one the input admits, so the "
                                      "kernel would never run"}));
  // A same_dtype input admits its model's dtypes within its own set, and its alternatives.
  const auto follower = [](opforge::DtypeSet dtypes) {
    return [=](opforge::OpBuilder<false> b) {
      return std::move(b)
          .input("x", opforge::kFloat16 | opforge::kFloat32)
          .input("w", opforge::same_dtype("x") | opforge::kFloat64)
          .output("y", opforge::like("x"))
          .reference(+[](opforge::Tensor, opforge::Tensor, opforge::MutableTensor) {})
          .cuda_source("k.cu", "k<{T}>")
          .launch(opforge::elementwise("y"))
          .kernel_dtypes("w", dtypes);
    };
  };
  EXPECT_EQ(declaration_errors("follower", follower(opforge::kInt32 | opforge::kBFloat16)),
            (std::vector<std::string>{pre("follower") +
                                      "kernel_dtypes(\"w\"): none of these dtypes is one the input admits, so the "
                                      "kernel would never run"}));
  EXPECT_EQ(declaration_errors("follower_ok", follower(opforge::kFloat64)), std::vector<std::string>{});
  EXPECT_EQ(declaration_errors("twice",
                               [](opforge::OpBuilder<false> b) {
                                 return std::move(b)
                                     .input("x", opforge::floating)
                                     .output("y", opforge::like("x"))
                                     .reference(ref1)
                                     .cuda_source("k.cu", "k<{T}>")
                                     .launch(opforge::elementwise("y"))
                                     .kernel_dtypes("x", opforge::kFloat16)
                                     .kernel_dtypes("x", opforge::kFloat32);
                               }),
            (std::vector<std::string>{pre("twice") +
                                      "kernel_dtypes(\"x\"): a second kernel_dtypes() for one kernel (name one input, "
                                      "whose dtype the others follow)"}));
}
