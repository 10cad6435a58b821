// Schema strings derived from declarations (src/core/schema.cpp): types, defaults and returns as
// torch parses them; and the accessors of schema.h that read a declaration's records.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include "../../src/core/schema.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

void all_params(Tensor, int64_t, double, bool, std::string_view, std::span<const int64_t>, std::span<const double>,
                MutableTensor) {}
void two_outputs(Tensor, MutableTensor, MutableTensor) {}

TEST(Schema, EveryParameterTypeWithDefaults) {
  auto def = finalized(opforge::detail::make_op("ns", "everything", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<int64_t>("n", 3)
                           .param<double>("eps", 1e-5)
                           .param<bool>("flag", true)
                           .param<std::string>("mode", "it's")
                           .param<std::vector<int64_t>>("dims", {0, -1})
                           .param<std::vector<double>>("scales", {0.5, 2.0})
                           .output("y", opforge::like("x"))
                           .reference(all_params)
                           .release());
  EXPECT_EQ(opforge::core::schema(*def->spec()),
            "everything(Tensor x, int n=3, float eps=1e-05, bool flag=True, str mode='it\\'s', int[] dims=[0, -1], "
            "float[] scales=[0.5, 2.0]) -> Tensor");
  EXPECT_EQ(opforge::core::qualified_name(*def->spec()), "ns::everything");
}

TEST(Schema, RequiredParametersHaveNoDefault) {
  auto def = finalized(opforge::detail::make_op("ns", "req", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<double>("alpha")
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  EXPECT_EQ(opforge::core::qualified_schema(*def->spec()), "ns::req(Tensor x, float alpha) -> Tensor");
}

TEST(Schema, FloatDefaultsStayFloatLiterals) {
  auto def = finalized(opforge::detail::make_op("ns", "f", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<double>("alpha", 1.0)
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  EXPECT_EQ(opforge::core::schema(*def->spec()), "f(Tensor x, float alpha=1.0) -> Tensor");
}

TEST(Schema, SeveralOutputsReturnATuple) {
  auto def = finalized(opforge::detail::make_op("ns", "split", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .output("a", opforge::like("x"))
                           .output("b", opforge::like("x").with_dtype(opforge::kFloat32))
                           .reference(two_outputs)
                           .release());
  EXPECT_EQ(opforge::core::schema(*def->spec()), "split(Tensor x) -> (Tensor, Tensor)");
  // The out= overload takes the outputs as keyword arguments, written and returned.
  EXPECT_EQ(opforge::core::out_schema(*def->spec()),
            "split.out(Tensor x, *, Tensor(a!) a, Tensor(b!) b) -> (Tensor(a!), Tensor(b!))");
  EXPECT_EQ(opforge::core::qualified_out_schema(*def->spec()),
            "ns::split.out(Tensor x, *, Tensor(a!) a, Tensor(b!) b) -> (Tensor(a!), Tensor(b!))");
}

void two_inputs(Tensor, Tensor, MutableTensor) {}

TEST(Schema, OptionalTensorDefaultsToNone) {
  auto def = finalized(opforge::detail::make_op("ns", "masked", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .input("mask", opforge::optional, opforge::kBool, opforge::rank(2))
                           .output("y", opforge::like("x"))
                           .reference(two_inputs)
                           .release());
  EXPECT_EQ(opforge::core::schema(*def->spec()), "masked(Tensor x, Tensor? mask=None) -> Tensor");
}

void rotary_ref(Tensor, MutableTensor, MutableTensor, int64_t, Tensor, bool, Tensor) {}

TEST(Schema, AnOptionalTensorBeforeARequiredArgumentHasNoDefault) {
  // vLLM's rotary_embedding: the key may be None, and head_size, cos_sin_cache follow it.
  auto def = finalized(opforge::detail::make_op("ns", "rotary", "f.cpp", 1)
                           .input("positions", opforge::kInt64)
                           .input("query", opforge::floating, opforge::mutated)
                           .input("key", opforge::same_dtype("query"), opforge::optional, opforge::mutated)
                           .param<int64_t>("head_size")
                           .input("cos_sin_cache", opforge::same_dtype("query"))
                           .param<bool>("is_neox", true)
                           .input("bias", opforge::same_dtype("query"), opforge::optional)
                           .reference(rotary_ref)
                           .release());
  EXPECT_EQ(opforge::core::schema(*def->spec()),
            "rotary(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, Tensor cos_sin_cache, "
            "bool is_neox=True, Tensor? bias=None) -> ()");
  EXPECT_FALSE(opforge::core::has_schema_default(*def->spec(), 2));
  EXPECT_TRUE(opforge::core::has_schema_default(*def->spec(), 6));
}

void writes_two(MutableTensor, Tensor, MutableTensor, double) {}
void writes_and_returns(Tensor, MutableTensor, MutableTensor, MutableTensor) {}

TEST(Schema, MutatedInputsCarryWriteAnnotations) {
  auto def = finalized(opforge::detail::make_op("ns", "both_", "f.cpp", 1)
                           .input("x", opforge::floating, opforge::mutated)
                           .input("w", opforge::floating)
                           .input("r", opforge::floating, opforge::optional, opforge::mutated)
                           .param<double>("eps", 1e-6)
                           .reference(writes_two)
                           .release());
  EXPECT_EQ(opforge::core::schema(*def->spec()),
            "both_(Tensor(a!) x, Tensor w, Tensor(b!)? r=None, float eps=1e-06) -> ()");
  EXPECT_FALSE(opforge::core::has_out_overload(*def->spec()));
  auto mixed = finalized(opforge::detail::make_op("ns", "mixed", "f.cpp", 1)
                             .input("x", opforge::floating)
                             .input("acc", opforge::floating, opforge::mutated)
                             .output("y", opforge::like("x"))
                             .output("z", opforge::like("x"))
                             .reference(writes_and_returns)
                             .release());
  EXPECT_EQ(opforge::core::schema(*mixed->spec()), "mixed(Tensor x, Tensor(a!) acc) -> (Tensor, Tensor)");
}

TEST(Schema, StringDefaultsAreEscapedAsTorchsParserReadsThem) {
  auto def = finalized(opforge::detail::make_op("ns", "s", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<std::string>("tag", "it's \\ \"q\"\n\t\x01")
                           .output("y", opforge::like("x"))
                           .reference(with_tag)
                           .release());
  EXPECT_EQ(opforge::core::schema(*def->spec()), "s(Tensor x, str tag='it\\'s \\\\ \"q\"\\n\\t\\x01') -> Tensor");
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

}  // namespace
