// Input checks and shape rules (src/core/check.h), evaluated over int64 (the run-time path; the
// adapter's Meta kernel runs the same code over c10::SymInt).
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "../../src/core/check.h"
#include "../../src/core/schema.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures
using Info = opforge::core::ArgInfo<int64_t>;

/// A copy of `sizes` that lives for the whole test run: an ArgInfo only views its sizes.
opforge::core::Span<const int64_t> kept(std::vector<int64_t> sizes) {
  static std::deque<std::vector<int64_t>> store;
  return store.emplace_back(std::move(sizes));
}

/// output_shapes over a list of arguments.
bool shapes(const OpforgeOpSpec& op, std::vector<Info> args, std::vector<opforge::core::OutputInfo<int64_t>>& outs,
            std::vector<std::string>& errors) {
  return opforge::core::output_shapes<int64_t>(op, args, outs, errors);
}

void pool_ref(Tensor, Tensor, int64_t, MutableTensor, MutableTensor) {}

// x: [B, S, H]; w: [H, n]; out: [B, ceildiv(S, 2), n]; stats: like x with last dim n * 2.
std::unique_ptr<opforge::detail::OpDef> pool_op() {
  auto def =
      opforge::detail::make_op("ns", "pool", "f.cpp", 1)
          .input("x", opforge::floating, opforge::rank(3))
          .input("w", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1), opforge::any}))
          .param<int64_t>("n", opforge::at_least(1))
          .output("out",
                  opforge::shape(
                      {opforge::dim("x", 0), opforge::ceildiv(opforge::dim("x", 1), 2), opforge::int_param("n")}),
                  opforge::dtype_of("x"))
          .output("stats", opforge::like("x").with_dim(-1, opforge::int_param("n") * 2).with_dtype(opforge::kFloat32))
          .reference(pool_ref)
          .release();
  auto errors = declaration_problems(*def);
  EXPECT_TRUE(errors.empty());
  return def;
}

Info tensor(int32_t dtype, std::vector<int64_t> sizes, const char* device_type = "cpu", int32_t index = -1) {
  Info i;
  i.dtype = dtype;
  i.dtype_label = opforge::dtype_name(dtype);
  i.device_type = device_type;
  i.device_index = index;
  i.sizes = kept(std::move(sizes));
  return i;
}

Info int_value(int64_t v) {
  Info i;
  i.value.kind = OPFORGE_ARG_INT;
  i.value.i = v;
  return i;
}

std::vector<std::string> check(const OpforgeOpSpec& op, const std::vector<Info>& args) {
  std::vector<std::string> lines;
  opforge::core::check_args<int64_t>(op, args, lines);
  return lines;
}

TEST(ShapeRules, OutputsFromExpressionsAndLike) {
  auto def = pool_op();
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_FLOAT16, {4, 7, 64}), tensor(OPFORGE_DTYPE_FLOAT16, {64, 3}),
                            int_value(5)};
  EXPECT_TRUE(check(*def->spec(), args).empty());
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  std::vector<std::string> errors;
  ASSERT_TRUE(shapes(*def->spec(), args, outs, errors));
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].sizes, (std::vector<int64_t>{4, 4, 5}));
  EXPECT_EQ(outs[0].dtype, OPFORGE_DTYPE_FLOAT16);
  EXPECT_EQ(outs[1].sizes, (std::vector<int64_t>{4, 7, 10}));
  EXPECT_EQ(outs[1].dtype, OPFORGE_DTYPE_FLOAT32);
}

TEST(ShapeRules, EveryBadArgumentReportedOnceByName) {
  auto def = pool_op();
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_INT64, {4, 7}), tensor(OPFORGE_DTYPE_FLOAT32, {32, 3}, "cuda", 0),
                            int_value(0)};
  EXPECT_EQ(check(*def->spec(), args),
            (std::vector<std::string>{
                "x: expected dtype one of {float32, float64, float16, bfloat16}, got int64",
                "x: expected rank 3, got rank 2 (shape [4, 7])", "w: expected device cpu (the device of x), got cuda:0",
                "n: expected a value >= 1, got 0",  // declaration order: x, w, n
            }));
}

TEST(ShapeRules, ShapeMismatchPrintsRuleAndValues) {
  auto def = pool_op();
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 64}), tensor(OPFORGE_DTYPE_FLOAT32, {32, 3}),
                            int_value(1)};
  EXPECT_EQ(check(*def->spec(), args),
            (std::vector<std::string>{"w: expected shape [x.size(-1), *] = [64, *], got [32, 3]"}));
  EXPECT_EQ(opforge::core::invalid_arguments_message(*def->spec(), check(*def->spec(), args)),
            "ns::pool(Tensor x, Tensor w, SymInt n) -> (Tensor, Tensor): invalid arguments\n"
            "  w: expected shape [x.size(-1), *] = [64, *], got [32, 3]");
}

TEST(ShapeRules, ExpressionArithmetic) {
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_FLOAT32, {10, 3}), int_value(4)};
  auto nodes = [](std::vector<OpforgeExprNode> n) { return n; };
  auto eval = [&](const std::vector<OpforgeExprNode>& n) {
    OpforgeExpr e{static_cast<int32_t>(n.size()), n.data()};
    return opforge::core::eval_expr<int64_t>(e, args);
  };
  const OpforgeExprNode d0{OPFORGE_EXPR_DIM, 0, 0}, dm1{OPFORGE_EXPR_DIM, 0, -1}, p{OPFORGE_EXPR_PARAM, 1, 0};
  EXPECT_EQ(eval(nodes({d0, p, {OPFORGE_EXPR_FLOORDIV, -1, 0}})), 2);
  EXPECT_EQ(eval(nodes({d0, p, {OPFORGE_EXPR_CEILDIV, -1, 0}})), 3);
  EXPECT_EQ(eval(nodes({d0, dm1, {OPFORGE_EXPR_SUB, -1, 0}})), 7);
  EXPECT_EQ(eval(nodes({d0, dm1, {OPFORGE_EXPR_MIN, -1, 0}})), 3);
  EXPECT_EQ(eval(nodes({d0, dm1, {OPFORGE_EXPR_MAX, -1, 0}, p, {OPFORGE_EXPR_MUL, -1, 0}})), 40);
  EXPECT_EQ(eval(nodes({{OPFORGE_EXPR_DIM, 0, 5}})), std::nullopt);                                         // no dim 5
  EXPECT_EQ(eval(nodes({d0, {OPFORGE_EXPR_CONST, -1, 0}, {OPFORGE_EXPR_FLOORDIV, -1, 0}})), std::nullopt);  // / 0
  // 20 operands on the stack before the first operator: deeper than the inline stack.
  std::vector<OpforgeExprNode> deep(20, d0);
  deep.insert(deep.end(), 19, OpforgeExprNode{OPFORGE_EXPR_ADD, -1, 0});
  EXPECT_EQ(eval(deep), 200);
  deep.pop_back();  // one operand too many left over
  EXPECT_EQ(eval(deep), std::nullopt);
}

TEST(ShapeRules, NegativeSizeIsAnError) {
  void (*ref)(Tensor, int64_t, MutableTensor) = [](Tensor, int64_t, MutableTensor) {};
  auto def = opforge::detail::make_op("ns", "crop", "f.cpp", 1)
                 .input("x", opforge::floating)
                 .param<int64_t>("k")
                 .output("y", opforge::shape({opforge::dim("x", 0) - opforge::int_param("k")}), opforge::dtype_of("x"))
                 .reference(ref)
                 .release();
  ASSERT_TRUE(declaration_problems(*def).empty());
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_FLOAT32, {3}), int_value(5)};
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  std::vector<std::string> errors;
  EXPECT_FALSE(shapes(*def->spec(), args, outs, errors));
  EXPECT_EQ(errors, (std::vector<std::string>{"output y: the shape rule x.size(0) - k gives a negative size -2"}));
}

TEST(ShapeRules, Int64OverflowIsAnErrorNeverAWrappedSize) {
  void (*ref)(Tensor, int64_t, MutableTensor) = [](Tensor, int64_t, MutableTensor) {};
  auto def = opforge::detail::make_op("ns", "tile", "f.cpp", 1)
                 .input("x", opforge::floating)
                 .param<int64_t>("k")
                 .output("y", opforge::shape({opforge::dim("x", 0) * opforge::int_param("k"), opforge::dim("x", 0)}),
                         opforge::dtype_of("x"))
                 .require(opforge::dim("x", 0) + opforge::int_param("k") >= opforge::dim("x", 0))
                 .reference(ref)
                 .release();
  ASSERT_TRUE(declaration_problems(*def).empty());
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  std::vector<std::string> errors;
  const int64_t big = int64_t{1} << 62;
  EXPECT_FALSE(shapes(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {3}), int_value(big)}, outs, errors));
  EXPECT_EQ(errors,
            (std::vector<std::string>{"output y: the shape rule x.size(0) * k overflows int64 for these inputs"}));
  errors.clear();
  EXPECT_FALSE(
      shapes(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {int64_t{1} << 32}), int_value(1 << 30)}, outs, errors));
  EXPECT_EQ(errors, (std::vector<std::string>{"output y: shape [4611686018427387904, 4294967296] has more elements "
                                              "than int64 counts"}));
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {3}), int_value(INT64_MAX)}),
            (std::vector<std::string>{"expected x.size(0) + k >= x.size(0), got a side that overflows int64"}));
}

void bias_ref(Tensor, Tensor, int64_t, MutableTensor) {}

// x: [B, H]; bias (optional): [H] of x's dtype; y like x.
std::unique_ptr<opforge::detail::OpDef> bias_op() {
  auto def = opforge::detail::make_op("ns", "add_bias", "f.cpp", 1)
                 .input("x", opforge::floating, opforge::rank(2))
                 .input("bias", opforge::optional, opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
                 .param<int64_t>("n", 1, opforge::at_least(1))
                 .output("y", opforge::like("x"))
                 .reference(bias_ref)
                 .release();
  EXPECT_TRUE(declaration_problems(*def).empty());
  return def;
}

Info absent() {
  Info i;
  i.defined = false;
  return i;
}

TEST(ShapeRules, OptionalInputLeftOutIsNotChecked) {
  auto def = bias_op();
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_FLOAT32, {2, 4}), absent(), int_value(1)};
  EXPECT_TRUE(check(*def->spec(), args).empty());
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  std::vector<std::string> errors;
  ASSERT_TRUE(shapes(*def->spec(), args, outs, errors));
  EXPECT_EQ(outs[0].sizes, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(opforge::core::qualified_schema(*def->spec()),
            "ns::add_bias(Tensor x, Tensor? bias=None, int n=1) -> Tensor");
}

TEST(ShapeRules, OptionalInputGivenIsChecked) {
  auto def = bias_op();
  EXPECT_TRUE(
      check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT16, {2, 4}), tensor(OPFORGE_DTYPE_FLOAT16, {4}), int_value(1)})
          .empty());
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_FLOAT32, {2, 4}), tensor(OPFORGE_DTYPE_FLOAT64, {3}, "cuda", 0),
                            int_value(0)};
  EXPECT_EQ(opforge::core::invalid_arguments_message(*def->spec(), check(*def->spec(), args)),
            "ns::add_bias(Tensor x, Tensor? bias=None, int n=1) -> Tensor: invalid arguments\n"
            "  bias: expected dtype float32 (the dtype of x), got float64\n"
            "  bias: expected device cpu (the device of x), got cuda:0\n"
            "  bias: expected shape [x.size(-1)] = [4], got [3]\n"
            "  n: expected a value >= 1, got 0");
}

TEST(ShapeRules, RequiredInputLeftOutIsAnError) {
  auto def = bias_op();
  std::vector<Info> args = {absent(), tensor(OPFORGE_DTYPE_FLOAT32, {4}), int_value(1)};
  // bias's rules read x, which is already reported.
  EXPECT_EQ(check(*def->spec(), args), (std::vector<std::string>{"x: expected a tensor, got None"}));
}

}  // namespace

namespace {

void vec_ref(Tensor, Tensor, MutableTensor) {}

// x: [rows, a multiple of 8]; w: [x.size(-1)].
std::unique_ptr<opforge::detail::OpDef> vec_op() {
  auto def = opforge::detail::make_op("ns", "vec", "f.cpp", 1)
                 .input("x", opforge::floating, opforge::shape({opforge::any, opforge::multiple_of(8)}))
                 .input("w", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
                 .output("y", opforge::like("x"))
                 .reference(vec_ref)
                 .release();
  EXPECT_TRUE(declaration_problems(*def).empty());
  return def;
}

}  // namespace

TEST(ShapeRules, MultipleOfAcceptsMultiplesOnly) {
  auto def = vec_op();
  for (int64_t cols : {0, 8, 4096})
    EXPECT_TRUE(
        check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {3, cols}), tensor(OPFORGE_DTYPE_FLOAT32, {cols})}).empty())
        << cols;
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {3, 12}), tensor(OPFORGE_DTYPE_FLOAT32, {12})}),
            (std::vector<std::string>{"x: expected shape [*, multiple of 8], got [3, 12]"}));
}

TEST(ShapeRules, MultipleOfOnlyAsAWholeInputDim) {
  auto errors = declaration_problems(
      *opforge::detail::make_op("ns", "badvec", "f.cpp", 3)
           .input("x", opforge::floating, opforge::shape({opforge::multiple_of(0)}))
           .input("w", opforge::floating, opforge::shape({opforge::multiple_of(8) + 1}))
           .output("y", opforge::shape({opforge::multiple_of(4), opforge::any + 1}), opforge::dtype_of("x"))
           .reference(vec_ref)
           .release());
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_EQ(errors[0],
            "f.cpp:3: ns::badvec: input 'w': shape(): opforge::multiple_of(8) stands for a whole dim of an "
            "input's shape({...}); it cannot be part of an expression");
  EXPECT_EQ(errors[1],
            "f.cpp:3: ns::badvec: output 'y': opforge::multiple_of is allowed only in an input's "
            "shape({...})");
  EXPECT_EQ(errors[2],
            "f.cpp:3: ns::badvec: output 'y': opforge::any stands for a whole dim of an input's "
            "shape({...}); it cannot be part of an expression");  // was a null dereference
  EXPECT_EQ(errors[3], "f.cpp:3: ns::badvec: input 'x': shape(): opforge::multiple_of(0): expected a factor > 0");
}

namespace {

void vec_ref_1(Tensor, MutableTensor) {}
void three_ref(Tensor, Tensor, Tensor, MutableTensor) {}

}  // namespace

TEST(LeadingDims, AnyNumberOfLeadingDimsAndTheLastDimsRuled) {
  auto def = norm_op();
  for (std::vector<int64_t> x : {std::vector<int64_t>{8}, {2, 8}, {2, 3, 5, 8}, {0, 8}})
    EXPECT_TRUE(check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, x), tensor(OPFORGE_DTYPE_FLOAT32, {8})}).empty())
        << x.size();
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 6}), tensor(OPFORGE_DTYPE_FLOAT32, {6})}),
            (std::vector<std::string>{"x: expected shape [*, multiple of 4], got [2, 3, 6]"}));
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {}), tensor(OPFORGE_DTYPE_FLOAT32, {8})}),
            (std::vector<std::string>{"x: expected rank >= 1, got rank 0 (shape [])"}));
  std::vector<opforge::core::OutputInfo<int64_t>> outs, none;
  std::vector<std::string> errors;
  ASSERT_TRUE(shapes(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 8}), tensor(OPFORGE_DTYPE_FLOAT32, {8})}, outs,
                     errors));
  EXPECT_EQ(outs[0].sizes, (std::vector<int64_t>{2, 3, 8}));
}

TEST(LeadingDims, ARankConstraintBesideAFixedShapeIsADeclarationError) {
  auto errors =
      declaration_problems(*opforge::detail::make_op("ns", "rank1", "f.cpp", 6)
                                .input("x", opforge::floating, opforge::min_rank(1), opforge::shape({opforge::any}))
                                .input("w", opforge::floating, opforge::rank_between(0, 1),
                                       opforge::shape({opforge::leading_dims, opforge::any, opforge::any}))
                                .input("v", opforge::floating, opforge::shape({opforge::any, opforge::leading_dims}))
                                .output("y", opforge::like("x"))
                                .reference(three_ref)
                                .release());
  EXPECT_EQ(errors, (std::vector<std::string>{
                        "f.cpp:6: ns::rank1: input 'x': a rank constraint beside shape({...}) of 1 dims, which fixes "
                        "the rank at 1: for any number of leading dims, write shape({opforge::leading_dims, ...})",
                        "f.cpp:6: ns::rank1: input 'v': shape(): opforge::leading_dims is allowed only as the first "
                        "entry of an input's shape({...})",
                        "f.cpp:6: ns::rank1: input 'w': a rank of at most 1 is below the 2 dims its "
                        "shape({opforge::leading_dims, ...}) rules",
                    }));
}

TEST(LeadingDims, AnEmptyRankRangeBesideLeadingDimsIsADeclarationError) {
  auto errors = declaration_problems(*opforge::detail::make_op("ns", "rank2", "f.cpp", 7)
                                          .input("x", opforge::floating, opforge::rank_between(3, 1),
                                                 opforge::shape({opforge::leading_dims, opforge::any}))
                                          .output("y", opforge::like("x"))
                                          .reference(vec_ref_1)
                                          .release());
  EXPECT_EQ(errors, (std::vector<std::string>{"f.cpp:7: ns::rank2: input 'x': the rank range [3, 1] is empty"}));
}

TEST(MixedDtypes, ASameDtypeRuleWithAlternatives) {
  auto def = norm_op();
  const std::string bf16_x = "weight: expected dtype bfloat16 (the dtype of x) or float32, got float16";
  for (int32_t w : {OPFORGE_DTYPE_BFLOAT16, OPFORGE_DTYPE_FLOAT32})
    EXPECT_TRUE(check(*def->spec(), {tensor(OPFORGE_DTYPE_BFLOAT16, {2, 8}), tensor(w, {8})}).empty()) << w;
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_BFLOAT16, {2, 8}), tensor(OPFORGE_DTYPE_FLOAT16, {8})}),
            (std::vector<std::string>{bf16_x}));
  // With x in float32 the alternative is x's own dtype, named once.
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {2, 8}), tensor(OPFORGE_DTYPE_FLOAT16, {8})}),
            (std::vector<std::string>{"weight: expected dtype float32 (the dtype of x), got float16"}));
  // x's own dtype must still be allowed: a bad x is reported once, not again by weight's rule.
  EXPECT_EQ(check(*def->spec(), {tensor(OPFORGE_DTYPE_INT32, {2, 8}), tensor(OPFORGE_DTYPE_INT32, {8})}),
            (std::vector<std::string>{"x: expected dtype one of {float32, float64, float16, bfloat16}, got int32"}));
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  std::vector<std::string> errors;
  ASSERT_TRUE(
      shapes(*def->spec(), {tensor(OPFORGE_DTYPE_BFLOAT16, {2, 8}), tensor(OPFORGE_DTYPE_FLOAT32, {8})}, outs, errors));
  EXPECT_EQ(outs[0].dtype, OPFORGE_DTYPE_BFLOAT16);  // like("x"): x's dtype, not the weight's
}

namespace {
void pair_ref(Tensor, Tensor, MutableTensor, MutableTensor) {}
}  // namespace

TEST(OptionalOutputs, UndefinedWhenTheirInputIsLeftOut) {
  auto def = opforge::detail::make_op("ns", "pair", "f.cpp", 7)
                 .input("x", opforge::floating)
                 .input("key", opforge::optional, opforge::floating, opforge::shape({opforge::any, opforge::any}))
                 .output("y", opforge::like("x"))
                 .output("key_out", opforge::like("key").with_dim(-1, opforge::dim("key", -1) * 2))
                 .reference(pair_ref)
                 .release();
  ASSERT_TRUE(declaration_problems(*def).empty());
  Info absent;
  absent.defined = false;
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  std::vector<std::string> errors;
  ASSERT_TRUE(shapes(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {4}), absent}, outs, errors));
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_TRUE(outs[0].defined);
  EXPECT_FALSE(outs[1].defined);
  ASSERT_TRUE(
      shapes(*def->spec(), {tensor(OPFORGE_DTYPE_FLOAT32, {4}), tensor(OPFORGE_DTYPE_FLOAT16, {3, 5})}, outs, errors));
  EXPECT_TRUE(outs[1].defined);
  EXPECT_EQ(outs[1].sizes, (std::vector<int64_t>{3, 10}));
  EXPECT_EQ(outs[1].dtype, OPFORGE_DTYPE_FLOAT16);
}

TEST(SizeParams, ParametersThatShapeRulesReadAreSymInt) {
  auto def = pool_op();  // n gives out's last dim
  EXPECT_TRUE(opforge::core::is_size_param(*def->spec(), 2));
  EXPECT_EQ(opforge::core::schema(*def->spec()), "pool(Tensor x, Tensor w, SymInt n) -> (Tensor, Tensor)");
  // While a framework traces, a symbolic value is read by the rules and its own check waits.
  std::vector<Info> args = {tensor(OPFORGE_DTYPE_FLOAT32, {2, 6, 4}), tensor(OPFORGE_DTYPE_FLOAT32, {4, 3}),
                            int_value(-5)};
  args[2].symbolic = 7;
  std::vector<opforge::core::OutputInfo<int64_t>> outs;
  EXPECT_EQ(opforge::core::check_call<int64_t>(*def->spec(), args, outs), "");
  EXPECT_EQ(outs[0].sizes, (std::vector<int64_t>{2, 3, 7}));
  args[2].symbolic.reset();
  EXPECT_NE(opforge::core::check_call<int64_t>(*def->spec(), args, outs).find("n: expected a value >= 1, got -5"),
            std::string::npos);
}

namespace {

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
  EXPECT_EQ(op["rules"][1], json::parse(R"({"text": "x.size(-1) % block == 0", "op": "=="})"));
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

}  // namespace

namespace {

void out_first_ref(MutableTensor, Tensor) {}

// vLLM's out-first silu_and_mul: out [..., d] ruled by the later input [..., 2d].
std::unique_ptr<opforge::detail::OpDef> out_first_op() {
  return finalized(
      opforge::detail::make_op("ns", "act", "f.cpp", 1)
          .input("out", opforge::same_dtype("input"), opforge::mutated,
                 opforge::shape({opforge::leading_dims_of("input"), opforge::dim("input", -1) / 2}))
          .input("input", opforge::floating, opforge::shape({opforge::leading_dims, opforge::multiple_of(2)}))
          .reference(out_first_ref)
          .release());
}

TEST(LaterArguments, AnOutFirstOpIsRuledByItsLaterInputAtAnyRank) {
  auto def = out_first_op();
  const auto& op = *def->spec();
  for (std::vector<int64_t> lead : {std::vector<int64_t>{}, {5}, {2, 3}, {2, 3, 4}, {0, 3}}) {
    std::vector<int64_t> out = lead, input = lead;
    out.push_back(4);
    input.push_back(8);
    EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_BFLOAT16, out), tensor(OPFORGE_DTYPE_BFLOAT16, input)}),
              std::vector<std::string>{})
        << lead.size();
  }
  EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 5}), tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 8})}),
            std::vector<std::string>{"out: expected shape [*, input.size(-1) // 2] = [*, 4], got [2, 3, 5]"});
  EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_FLOAT16, {2, 3, 4}), tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 8})}),
            std::vector<std::string>{"out: expected dtype float32 (the dtype of input), got float16"});
  // The later input is checked first: a rule of out over a bad input is not reported again.
  EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 4}), tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 7})}),
            std::vector<std::string>{"input: expected shape [*, multiple of 2], got [2, 3, 7]"});
}

TEST(LeadingDimsOf, LeadingDimsAreTiedInNumberAndSizes) {
  auto def = out_first_op();
  const auto& op = *def->spec();
  EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_FLOAT32, {2, 4, 4}), tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 8})}),
            std::vector<std::string>{
                "out: expected leading dims [2, 3] (those of input, shape [2, 3, 8]), got [2, 4] (shape [2, 4, 4])"});
  EXPECT_EQ(check(op, {tensor(OPFORGE_DTYPE_FLOAT32, {6, 4}), tensor(OPFORGE_DTYPE_FLOAT32, {2, 3, 8})}),
            std::vector<std::string>{
                "out: expected leading dims [2, 3] (those of input, shape [2, 3, 8]), got [6] (shape [6, 4])"});
  EXPECT_EQ(
      check(op, {tensor(OPFORGE_DTYPE_FLOAT32, {1, 4}), tensor(OPFORGE_DTYPE_FLOAT32, {8})}),
      std::vector<std::string>{"out: expected leading dims [] (those of input, shape [8]), got [1] (shape [1, 4])"});
  const json input = describe({def.get()})["ops"][0]["args"][0];
  EXPECT_EQ(input["leading_dims_of"], "input");
}

// A state indexed by idx when it is given, by batch otherwise.
std::unique_ptr<opforge::detail::OpDef> presence_op() {
  return finalized(opforge::detail::make_op("ns", "upd", "f.cpp", 1)
                       .input("x", opforge::floating, opforge::rank(2))
                       .input("state", opforge::same_dtype("x"), opforge::shape({opforge::any, opforge::dim("x", 1)}))
                       .input("idx", opforge::kInt32, opforge::shape({opforge::dim("x", 0)}), opforge::optional)
                       .require(opforge::when_given("idx", opforge::dim("state", 0) >= opforge::dim("x", 0))
                                    .otherwise(opforge::dim("state", 0) == opforge::dim("x", 0)))
                       .output("y", opforge::like("x"))
                       .reference(three_inputs)
                       .release());
}

TEST(RulesByPresence, EachRuleHoldsForTheCallsItsPresenceCovers) {
  auto def = presence_op();
  const auto& op = *def->spec();
  const auto x = tensor(OPFORGE_DTYPE_FLOAT32, {4, 8}), idx = tensor(OPFORGE_DTYPE_INT32, {4});
  EXPECT_EQ(check(op, {x, tensor(OPFORGE_DTYPE_FLOAT32, {4, 8}), absent()}), std::vector<std::string>{});
  EXPECT_EQ(check(op, {x, tensor(OPFORGE_DTYPE_FLOAT32, {6, 8}), idx}), std::vector<std::string>{});
  EXPECT_EQ(check(op, {x, tensor(OPFORGE_DTYPE_FLOAT32, {6, 8}), absent()}),
            std::vector<std::string>{"expected state.size(0) == x.size(0) when idx is not given, got 6 == 4"});
  EXPECT_EQ(check(op, {x, tensor(OPFORGE_DTYPE_FLOAT32, {2, 8}), idx}),
            std::vector<std::string>{"expected state.size(0) >= x.size(0) when idx is given, got 2 >= 4"});
  const json rules = describe({def.get()})["ops"][0]["rules"];
  EXPECT_EQ(rules[0]["text"], "state.size(0) >= x.size(0) when idx is given");
  EXPECT_EQ(rules[1]["text"], "state.size(0) == x.size(0) when idx is not given");
}

}  // namespace
