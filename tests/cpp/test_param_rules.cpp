// Rules that follow a parameter's value (src/core/param_rules.h, Note [Rules that follow a
// parameter] in opforge/op_constraints.h): dtype rules of inputs, shape rules of inputs and outputs
// and dtype rules of outputs: the record the builder writes, the call checks, the output shapes,
// the combinations and shapes verify draws from, the description, and deliberately broken
// declarations.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "../../src/core/check.h"
#include "../../src/core/dtypes.h"
#include "../../src/core/param_rules.h"
#include "../../src/core/sizes.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures
using Info = opforge::core::ArgInfo<int64_t>;

void cache_ref(Tensor, MutableTensor, std::string_view) {}
void flag_ref(Tensor, MutableTensor, bool) {}
void scale_ref(Tensor, MutableTensor, double) {}
void later_ref(MutableTensor, Tensor, std::string_view) {}

// A cache written in x's dtype under "auto", float8_e5m2 under "fp8_e5m2", float8_e4m3fn otherwise.
std::unique_ptr<opforge::detail::OpDef> cache_op() {
  return finalized(opforge::detail::make_op("ns", "cache", "f.cpp", 7)
                       .input("x", opforge::kFloat16 | opforge::kBFloat16)
                       .input("cache",
                              opforge::when("kv_cache_dtype", "auto", opforge::same_dtype("x"))
                                  .when("fp8_e5m2", opforge::kFloat8_e5m2)
                                  .otherwise(opforge::kFloat8_e4m3fn),
                              opforge::mutated)
                       .param<std::string>("kv_cache_dtype", opforge::one_of({"auto", "fp8", "fp8_e5m2"}))
                       .reference(cache_ref)
                       .release());
}

std::deque<std::vector<int64_t>> sizes_store;
std::deque<std::string> text_store;

Info tensor(int32_t dtype) {
  Info i;
  i.dtype = dtype;
  i.dtype_label = opforge::dtype_name(dtype);
  i.sizes = sizes_store.emplace_back(std::vector<int64_t>{4});
  return i;
}

Info text(std::string s) {
  Info i;
  const std::string& kept = text_store.emplace_back(std::move(s));
  i.value.kind = OPFORGE_ARG_STRING;
  i.value.s = kept.c_str();
  i.value.len = kept.size();
  return i;
}

std::vector<std::string> check(const OpforgeOpSpec& op, const std::vector<Info>& args) {
  std::vector<std::string> lines;
  opforge::core::check_args<int64_t>(op, args, lines);
  return lines;
}

TEST(ParamRules, TheRecordHoldsOneCasePerValue) {
  auto def = cache_op();
  const OpforgeOpSpec& op = *def->spec();
  ASSERT_EQ(op.num_dtype_cases, 2);
  EXPECT_EQ(op.dtype_cases[0].arg, 1);
  EXPECT_EQ(op.dtype_cases[0].param, 2);
  EXPECT_STREQ(op.dtype_cases[0].value, "auto");
  EXPECT_EQ(op.dtype_cases[0].dtype_like, 0);
  EXPECT_STREQ(op.dtype_cases[1].value, "fp8_e5m2");
  EXPECT_EQ(op.dtype_cases[1].dtypes, 1u << OPFORGE_DTYPE_FLOAT8_E5M2);
  EXPECT_EQ(op.dtype_cases[1].dtype_like, -1);
  // The spec's own rule is the one of every other value.
  EXPECT_EQ(op.args[1].tensor.dtypes, 1u << OPFORGE_DTYPE_FLOAT8_E4M3FN);
  EXPECT_EQ(op.args[1].tensor.dtype_like, -1);
  EXPECT_EQ(opforge::core::ruling_param(op, 1), 2);
  EXPECT_EQ(opforge::core::ruling_param(op, 0), -1);
  EXPECT_EQ(opforge::core::ruled_values(op, 2), (std::vector<std::string>{"auto", "fp8_e5m2", "fp8"}));
}

TEST(ParamRules, EachCallIsCheckedAgainstTheRuleItsValueSelects) {
  auto def = cache_op();
  const OpforgeOpSpec& op = *def->spec();
  EXPECT_TRUE(check(op, {tensor(OPFORGE_DTYPE_BFLOAT16), tensor(OPFORGE_DTYPE_BFLOAT16), text("auto")}).empty());
  EXPECT_TRUE(check(op, {tensor(OPFORGE_DTYPE_BFLOAT16), tensor(OPFORGE_DTYPE_FLOAT8_E4M3FN), text("fp8")}).empty());
  EXPECT_TRUE(check(op, {tensor(OPFORGE_DTYPE_FLOAT16), tensor(OPFORGE_DTYPE_FLOAT8_E5M2), text("fp8_e5m2")}).empty());
  EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_BFLOAT16), tensor(OPFORGE_DTYPE_FLOAT8_E4M3FN), text("auto")}),
            (std::vector<std::string>{
                "cache: expected dtype bfloat16 (the dtype of x) where kv_cache_dtype is 'auto', got float8_e4m3fn"}));
  EXPECT_EQ(
      check(op, {tensor(OPFORGE_DTYPE_BFLOAT16), tensor(OPFORGE_DTYPE_BFLOAT16), text("fp8")}),
      (std::vector<std::string>{"cache: expected dtype float8_e4m3fn where kv_cache_dtype is 'fp8', got bfloat16"}));
  EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_BFLOAT16), tensor(OPFORGE_DTYPE_FLOAT8_E4M3FN), text("fp8_e5m2")}),
            (std::vector<std::string>{
                "cache: expected dtype float8_e5m2 where kv_cache_dtype is 'fp8_e5m2', got float8_e4m3fn"}));
}

TEST(ParamRules, CombinationsTakeEachValueWithTheDtypesItsRuleAdmits) {
  auto def = cache_op();
  const auto j = describe({def.get()});
  const auto& op = j["ops"][0];
  EXPECT_EQ(op["dtype_combinations"], json::parse(R"([{"x": "float16", "cache": "float16", "kv_cache_dtype": "auto"},
                            {"x": "bfloat16", "cache": "bfloat16", "kv_cache_dtype": "auto"},
                            {"x": "float16", "cache": "float8_e5m2", "kv_cache_dtype": "fp8_e5m2"},
                            {"x": "bfloat16", "cache": "float8_e5m2", "kv_cache_dtype": "fp8_e5m2"},
                            {"x": "float16", "cache": "float8_e4m3fn", "kv_cache_dtype": "fp8"},
                            {"x": "bfloat16", "cache": "float8_e4m3fn", "kv_cache_dtype": "fp8"}])"));
  const auto& cases = op["args"][1]["dtype_cases"];
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[0]["param"], "kv_cache_dtype");
  EXPECT_EQ(cases[0]["value"], "auto");
  EXPECT_EQ(cases[0]["same_dtype"], "x");
  EXPECT_EQ(cases[1]["value"], "fp8_e5m2");
  EXPECT_EQ(cases[1]["same_dtype"], nullptr);
  EXPECT_EQ(cases[1]["dtypes"], json::parse(R"(["float8_e5m2"])"));
  EXPECT_EQ(op["args"][1]["dtypes"], json::parse(R"(["float8_e4m3fn"])"));
  EXPECT_EQ(opforge::core::admitted_dtypes(*def->spec(), 1),
            (1u << OPFORGE_DTYPE_FLOAT16) | (1u << OPFORGE_DTYPE_BFLOAT16) | (1u << OPFORGE_DTYPE_FLOAT8_E4M3FN) |
                (1u << OPFORGE_DTYPE_FLOAT8_E5M2));
}

TEST(ParamRules, ABoolParameterSelectsByTrueAndFalse) {
  auto def = finalized(
      opforge::detail::make_op("ns", "flagged", "f.cpp", 9)
          .input("x", opforge::kFloat32)
          .input("y", opforge::when("wide", true, opforge::kFloat64).otherwise(opforge::kFloat32), opforge::mutated)
          .param<bool>("wide")
          .reference(flag_ref)
          .release());
  EXPECT_EQ(opforge::core::ruled_values(*def->spec(), 2), (std::vector<std::string>{"true", "false"}));
  Info wide;
  wide.value.kind = OPFORGE_ARG_BOOL;
  wide.value.i = 1;
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32), tensor(OPFORGE_DTYPE_FLOAT32), wide}),
            (std::vector<std::string>{"y: expected dtype float64 where wide is true, got float32"}));
}

// Broken declarations, each reported with the declaration's file and line.
TEST(ParamRules, AnUnknownParameterIsReported) {
  auto def =
      opforge::detail::make_op("ns", "unknown", "g.cpp", 11)
          .input("x", opforge::kFloat16)
          .input("cache", opforge::when("dtype", "auto", opforge::same_dtype("x")).otherwise(opforge::kFloat8_e4m3fn),
                 opforge::mutated)
          .param<std::string>("kv_cache_dtype")
          .reference(cache_ref)
          .release();
  EXPECT_EQ(
      declaration_problems(*def),
      (std::vector<std::string>{"g.cpp:11: ns::unknown: input 'cache': when(\"dtype\", \"auto\"): \"dtype\" names "
                                "no parameter (parameters: kv_cache_dtype)"}));
}

TEST(ParamRules, AValueOutsideTheChoicesIsReported) {
  auto def =
      opforge::detail::make_op("ns", "choices", "g.cpp", 12)
          .input("x", opforge::kFloat16)
          .input("cache",
                 opforge::when("kv_cache_dtype", "fp16", opforge::same_dtype("x")).otherwise(opforge::kFloat8_e4m3fn),
                 opforge::mutated)
          .param<std::string>("kv_cache_dtype", opforge::one_of({"auto", "fp8"}))
          .reference(cache_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"g.cpp:12: ns::choices: input 'cache': when(\"kv_cache_dtype\", \"fp16\"): "
                                      "\"fp16\" is not one of the values of 'kv_cache_dtype' (one_of: auto, fp8)"}));
}

TEST(ParamRules, AFloatParameterCannotSelectARule) {
  auto def =
      opforge::detail::make_op("ns", "floaty", "g.cpp", 13)
          .input("x", opforge::kFloat32)
          .input("y", opforge::when("scale", 1, opforge::kFloat64).otherwise(opforge::kFloat32), opforge::mutated)
          .param<double>("scale")
          .reference(scale_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"g.cpp:13: ns::floaty: input 'y': when(\"scale\", \"1\"): a dtype rule follows "
                                      "a std::string, int64_t or bool parameter, and 'scale' is a double"}));
}

TEST(ParamRules, ABoolParameterTakesTrueOrFalse) {
  auto def =
      opforge::detail::make_op("ns", "yes", "g.cpp", 14)
          .input("x", opforge::kFloat32)
          .input("y", opforge::when("wide", "yes", opforge::kFloat64).otherwise(opforge::kFloat32), opforge::mutated)
          .param<bool>("wide")
          .reference(flag_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"g.cpp:14: ns::yes: input 'y': when(\"wide\", \"yes\"): \"yes\" is not a value "
                                      "of the bool parameter 'wide'"}));
}

TEST(ParamRules, OneValueOneRuleOneParameter) {
  auto def = opforge::detail::make_op("ns", "twice", "g.cpp", 15)
                 .input("x", opforge::kFloat16)
                 .input("cache",
                        opforge::when("kv_cache_dtype", "auto", opforge::same_dtype("x"))
                            .when("auto", opforge::kFloat16)
                            .otherwise(opforge::kFloat8_e4m3fn),
                        opforge::mutated)
                 .param<std::string>("kv_cache_dtype")
                 .reference(cache_ref)
                 .release();
  EXPECT_EQ(
      declaration_problems(*def),
      (std::vector<std::string>{
          "g.cpp:15: ns::twice: input 'cache': when(\"kv_cache_dtype\", \"auto\"): a second rule for this value"}));
}

TEST(ParamRules, ASameDtypeOfALaterInputIsReported) {
  auto def =
      opforge::detail::make_op("ns", "later", "g.cpp", 16)
          .input("cache",
                 opforge::when("kv_cache_dtype", "auto", opforge::same_dtype("x")).otherwise(opforge::kFloat8_e4m3fn),
                 opforge::mutated)
          .input("x", opforge::kFloat16)
          .param<std::string>("kv_cache_dtype")
          .reference(later_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"g.cpp:16: ns::later: input 'cache': when(\"kv_cache_dtype\", \"auto\"): "
                                      "same_dtype(\"x\") must name an earlier tensor input"}));
}

// ---- shape rules and output dtype rules that follow a parameter ---------------------------------

void quant_ref(Tensor, Tensor, bool, MutableTensor, MutableTensor) {}
void out_ref(Tensor, bool, MutableTensor) {}
void scale_out_ref(Tensor, double, MutableTensor) {}

// vLLM's scaled_fp8_quant, reduced: one scale per row of x under per_token, one for the tensor
// otherwise, given (scale) or returned (out_scale); out is float8 under per_token, x's dtype otherwise.
std::unique_ptr<opforge::detail::OpDef> quant_op() {
  return finalized(
      opforge::detail::make_op("ns", "quant", "q.cpp", 21)
          .input("x", opforge::kFloat32, opforge::rank(2))
          .input("scale", opforge::kFloat32, opforge::optional,
                 opforge::when("per_token", true, opforge::shape({opforge::dim("x", 0), 1}))
                     .otherwise(opforge::shape({1})))
          .param<bool>("per_token", false)
          .output("out", opforge::shape({opforge::dim("x", 0), opforge::dim("x", 1)}),
                  opforge::when("per_token", true, opforge::kFloat8_e4m3fn).otherwise(opforge::same_dtype("x")))
          .output("out_scale",
                  opforge::when("per_token", true, opforge::shape({opforge::dim("x", 0), 1}))
                      .otherwise(opforge::shape({1})),
                  opforge::kFloat32)
          .reference(quant_ref)
          .release());
}

Info sized(int32_t dtype, std::vector<int64_t> sizes) {
  Info i = tensor(dtype);
  i.sizes = sizes_store.emplace_back(std::move(sizes));
  return i;
}

Info flag(bool v) {
  Info i;
  i.value.kind = OPFORGE_ARG_BOOL;
  i.value.i = v;
  return i;
}

TEST(ParamShapeRules, TheRecordHoldsOneCasePerValueAndRule) {
  auto def = quant_op();
  const OpforgeOpSpec& op = *def->spec();
  ASSERT_EQ(op.num_rule_cases, 3);
  EXPECT_EQ(op.rule_cases[0].arg, 1);
  EXPECT_EQ(op.rule_cases[0].output, -1);
  EXPECT_EQ(op.rule_cases[0].param, 2);
  EXPECT_STREQ(op.rule_cases[0].value, "true");
  EXPECT_EQ(op.rule_cases[0].has_shape, 1);
  EXPECT_EQ(op.rule_cases[0].num_dims, 2);
  EXPECT_EQ(op.rule_cases[1].output, 0);
  EXPECT_EQ(op.rule_cases[1].has_dtype, 1);
  EXPECT_EQ(op.rule_cases[1].dtype, OPFORGE_DTYPE_FLOAT8_E4M3FN);
  EXPECT_EQ(op.rule_cases[2].output, 1);
  EXPECT_EQ(op.rule_cases[2].has_shape, 1);
  // The specs' own rules are those of every other value.
  EXPECT_EQ(op.args[1].tensor.num_dims, 1);
  EXPECT_EQ(op.outputs[0].dtype_like, 0);
  EXPECT_EQ(op.outputs[1].num_dims, 1);
  EXPECT_EQ(opforge::core::shape_ruling_param(op, 1), 2);
  EXPECT_EQ(opforge::core::shape_ruling_param(op, 0), -1);
  EXPECT_EQ(opforge::core::output_ruling_param(op, 0, true), 2);
  EXPECT_EQ(opforge::core::output_ruling_param(op, 0, false), -1);
  EXPECT_EQ(opforge::core::ruled_values(op, 2), (std::vector<std::string>{"true", "false"}));
}

TEST(ParamShapeRules, EachCallIsCheckedAgainstTheShapeItsValueSelects) {
  auto def = quant_op();
  const OpforgeOpSpec& op = *def->spec();
  const Info x = sized(OPFORGE_DTYPE_FLOAT32, {4, 8});
  EXPECT_TRUE(check(op, {x, sized(OPFORGE_DTYPE_FLOAT32, {4, 1}), flag(true)}).empty());
  EXPECT_TRUE(check(op, {x, sized(OPFORGE_DTYPE_FLOAT32, {1}), flag(false)}).empty());
  EXPECT_EQ(check(op, {x, sized(OPFORGE_DTYPE_FLOAT32, {1}), flag(true)}),
            (std::vector<std::string>{"scale: expected rank 2 where per_token is true, got rank 1 (shape [1])"}));
  EXPECT_EQ(
      check(op, {x, sized(OPFORGE_DTYPE_FLOAT32, {1, 1}), flag(true)}),
      (std::vector<std::string>{"scale: expected shape [x.size(0), 1] = [4, 1] where per_token is true, got [1, 1]"}));
  EXPECT_EQ(check(op, {x, sized(OPFORGE_DTYPE_FLOAT32, {2}), flag(false)}),
            (std::vector<std::string>{"scale: expected shape [1] = [1] where per_token is false, got [2]"}));
}

TEST(ParamShapeRules, OutputsFollowTheValue) {
  auto def = quant_op();
  const OpforgeOpSpec& op = *def->spec();
  Info absent;
  absent.defined = false;
  const Info x = sized(OPFORGE_DTYPE_FLOAT32, {4, 8});
  for (const bool per_token : {true, false}) {
    std::vector<Info> args = {x, absent, flag(per_token)};
    std::vector<opforge::core::OutputInfo<int64_t>> outs;
    EXPECT_EQ(opforge::core::check_call<int64_t>(op, args, outs), "");
    ASSERT_EQ(outs.size(), 2u);
    EXPECT_EQ(outs[0].dtype, per_token ? OPFORGE_DTYPE_FLOAT8_E4M3FN : OPFORGE_DTYPE_FLOAT32);
    EXPECT_EQ(outs[0].sizes, (std::vector<int64_t>{4, 8}));
    EXPECT_EQ(outs[1].sizes, per_token ? (std::vector<int64_t>{4, 1}) : (std::vector<int64_t>{1}));
  }
}

TEST(ParamShapeRules, ExampleShapesFollowTheValue) {
  auto def = quant_op();
  const OpforgeOpSpec& op = *def->spec();
  std::vector<OpforgeValue> values(3);
  values[2].kind = OPFORGE_ARG_BOOL;
  values[2].i = 1;
  EXPECT_EQ(opforge::core::example_shapes(op, 3, 8, values)[1], (std::vector<int64_t>{3, 1}));
  values[2].i = 0;
  EXPECT_EQ(opforge::core::example_shapes(op, 3, 8, values)[1], (std::vector<int64_t>{1}));
}

TEST(ParamShapeRules, TheDescriptionListsTheCases) {
  auto def = quant_op();
  const auto j = describe({def.get()});
  const auto& op = j["ops"][0];
  EXPECT_EQ(op["args"][1]["shape"], json::parse(R"j(["1"])j"));
  EXPECT_EQ(op["args"][1]["shape_cases"], json::parse(R"j([{"param": "per_token", "value": true,
      "shape": ["x.size(0)", "1"], "leading_dims": false, "dtype": null, "dtype_like": null}])j"));
  EXPECT_EQ(op["outputs"][0]["cases"], json::parse(R"j([{"param": "per_token", "value": true, "shape": null,
      "leading_dims": false, "dtype": "float8_e4m3fn", "dtype_like": null}])j"));
  EXPECT_EQ(op["outputs"][1]["cases"][0]["shape"], json::parse(R"j(["x.size(0)", "1"])j"));
  EXPECT_EQ(op["dtype_combinations"], json::parse(R"j([{"x": "float32", "scale": "float32", "per_token": true},
                            {"x": "float32", "scale": "float32", "per_token": false}])j"));
}

// Broken declarations, each reported with the declaration's file and line.
TEST(ParamShapeRules, AValueOutsideTheChoicesIsReported) {
  auto def =
      opforge::detail::make_op("ns", "choice", "h.cpp", 31)
          .input("x", opforge::kFloat32)
          .input("y",
                 opforge::when("mode", "rows", opforge::shape({opforge::dim("x", 0)})).otherwise(opforge::shape({1})),
                 opforge::mutated)
          .param<std::string>("mode", opforge::one_of({"row", "tensor"}))
          .reference(cache_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"h.cpp:31: ns::choice: input 'y': when(\"mode\", \"rows\"): \"rows\" is not one "
                                      "of the values of 'mode' (one_of: row, tensor)"}));
}

TEST(ParamShapeRules, ARuleNamingAnUnknownArgumentIsReported) {
  auto def =
      opforge::detail::make_op("ns", "unknown", "h.cpp", 32)
          .input("x", opforge::kFloat32)
          .param<bool>("wide", false)
          .output("y",
                  opforge::when("wide", true, opforge::shape({opforge::dim("z", 0)})).otherwise(opforge::shape({1})),
                  opforge::kFloat32)
          .reference(out_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"h.cpp:32: ns::unknown: output 'y': when(\"wide\", \"true\"): dim(): \"z\" "
                                      "names no tensor input (tensor inputs: x)"}));
}

TEST(ParamShapeRules, ATensorCannotSelectARule) {
  auto def =
      opforge::detail::make_op("ns", "tensorial", "h.cpp", 33)
          .input("x", opforge::kFloat32)
          .param<bool>("wide", false)
          .output("y", opforge::when("x", true, opforge::shape({2})).otherwise(opforge::shape({1})), opforge::kFloat32)
          .reference(out_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"h.cpp:33: ns::tensorial: output 'y': when(\"x\", \"true\"): \"x\" names no "
                                      "parameter (parameters: wide)"}));
}

TEST(ParamShapeRules, AFloatParameterCannotSelectAShape) {
  auto def =
      opforge::detail::make_op("ns", "floaty", "h.cpp", 34)
          .input("x", opforge::kFloat32)
          .param<double>("scale")
          .output("y", opforge::when("scale", 1, opforge::shape({2})).otherwise(opforge::shape({1})), opforge::kFloat32)
          .reference(scale_out_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"h.cpp:34: ns::floaty: output 'y': when(\"scale\", \"1\"): a shape rule "
                                      "follows a std::string, int64_t or bool parameter, and 'scale' is a double"}));
}

TEST(ParamShapeRules, OneValueOneShape) {
  auto def = opforge::detail::make_op("ns", "twice", "h.cpp", 35)
                 .input("x", opforge::kFloat32)
                 .param<bool>("wide", false)
                 .output("y",
                         opforge::when("wide", true, opforge::shape({2}))
                             .when(true, opforge::shape({3}))
                             .otherwise(opforge::shape({1})),
                         opforge::kFloat32)
                 .reference(out_ref)
                 .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{
                "h.cpp:35: ns::twice: output 'y': when(\"wide\", \"true\"): a second rule for this value"}));
}

TEST(ParamShapeRules, AnOutputDtypeCaseIsOneDtype) {
  auto def =
      opforge::detail::make_op("ns", "several", "h.cpp", 36)
          .input("x", opforge::kFloat32)
          .param<bool>("wide", false)
          .output("y", opforge::shape({1}),
                  opforge::when("wide", true, opforge::kFloat32 | opforge::kFloat64).otherwise(opforge::kFloat32))
          .reference(out_ref)
          .release();
  EXPECT_EQ(declaration_problems(*def),
            (std::vector<std::string>{"h.cpp:36: ns::several: output 'y': when(\"wide\", \"true\"): an output's dtype "
                                      "rule is one dtype or a same_dtype, not a set of dtypes"}));
}

}  // namespace
