// Dtype rules that follow a parameter's value (src/core/param_rules.h, Note [Rules that follow a
// parameter] in opforge/op_constraints.h): the record the builder writes, the call checks, the
// dtype combinations verify draws from, the description, and deliberately broken declarations.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "../../src/core/check.h"
#include "../../src/core/dtypes.h"
#include "../../src/core/param_rules.h"
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

}  // namespace
