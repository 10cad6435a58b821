// Pins the layout of every struct of the C ABI (opforge/c_api.h), so that Note [ABI versioning]
// is enforced: a change that moves a field or grows a struct embedded by value or laid out in an
// array fails here, and must come with a new OPFORGE_ABI_VERSION (and these numbers updated).
// Structs reached through a pointer may grow at their end (a new field after the last one pinned
// here), read past struct_size by newer adapters only. The figures hold on LP64 platforms
// (x86-64 and AArch64 Linux), the ones opforge builds for.
#include <gtest/gtest.h>

#include <cstddef>

#include "opforge/c_api.h"

static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8, "the pinned C ABI layout is that of LP64 platforms");

namespace {

TEST(AbiLayout, Version) { EXPECT_EQ(OPFORGE_ABI_VERSION, 11); }

TEST(AbiLayout, DtypeCodes) {  // opforge's own numbering, stable across versions
  EXPECT_EQ(OPFORGE_DTYPE_BOOL, 9);
  EXPECT_EQ(OPFORGE_DTYPE_FLOAT8_E4M3FN, 10);
  EXPECT_EQ(OPFORGE_DTYPE_FLOAT8_E5M2, 11);
  EXPECT_EQ(OPFORGE_DTYPE_FLOAT8_E8M0FNU, 12);
  EXPECT_EQ(OPFORGE_NUM_DTYPES, 13);  // a dtype set is a uint32_t of bits
}

TEST(AbiLayout, Tensor) {
  EXPECT_EQ(sizeof(OpforgeTensor), 40u);
  EXPECT_EQ(offsetof(OpforgeTensor, data), 0u);
  EXPECT_EQ(offsetof(OpforgeTensor, dtype), 8u);
  EXPECT_EQ(offsetof(OpforgeTensor, device_type), 12u);
  EXPECT_EQ(offsetof(OpforgeTensor, device_index), 16u);
  EXPECT_EQ(offsetof(OpforgeTensor, ndim), 20u);
  EXPECT_EQ(offsetof(OpforgeTensor, sizes), 24u);
  EXPECT_EQ(offsetof(OpforgeTensor, strides), 32u);
}

TEST(AbiLayout, Value) {
  EXPECT_EQ(sizeof(OpforgeValue), 56u);
  EXPECT_EQ(offsetof(OpforgeValue, kind), 0u);
  EXPECT_EQ(offsetof(OpforgeValue, i), 8u);
  EXPECT_EQ(offsetof(OpforgeValue, f), 16u);
  EXPECT_EQ(offsetof(OpforgeValue, s), 24u);
  EXPECT_EQ(offsetof(OpforgeValue, ints), 32u);
  EXPECT_EQ(offsetof(OpforgeValue, floats), 40u);
  EXPECT_EQ(offsetof(OpforgeValue, len), 48u);
}

TEST(AbiLayout, ExprNode) {
  EXPECT_EQ(sizeof(OpforgeExprNode), 16u);
  EXPECT_EQ(offsetof(OpforgeExprNode, op), 0u);
  EXPECT_EQ(offsetof(OpforgeExprNode, arg), 4u);
  EXPECT_EQ(offsetof(OpforgeExprNode, value), 8u);
}

TEST(AbiLayout, Expr) {
  EXPECT_EQ(sizeof(OpforgeExpr), 16u);
  EXPECT_EQ(offsetof(OpforgeExpr, num_nodes), 0u);
  EXPECT_EQ(offsetof(OpforgeExpr, nodes), 8u);
}

TEST(AbiLayout, TensorSpec) {
  EXPECT_EQ(sizeof(OpforgeTensorSpec), 128u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, dtypes), 8u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, dtype_like), 12u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, min_rank), 16u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, max_rank), 20u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, num_dims), 24u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, dims), 32u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, layout), 40u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, shape_like), 44u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, optional), 48u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, mutated), 52u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, has_values), 56u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, values_unique), 60u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, has_sentinel), 64u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, sentinel), 72u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, values_low), 80u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, values_high), 96u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, dtype_alternatives), 112u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, leading_dims), 116u);
  EXPECT_EQ(offsetof(OpforgeTensorSpec, leading_like), 120u);
}

TEST(AbiLayout, ParamSpec) {
  EXPECT_EQ(sizeof(OpforgeParamSpec), 120u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, has_default), 8u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, default_value), 16u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, has_min), 72u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, has_max), 76u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, min), 80u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, max), 88u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, num_choices), 96u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, choices), 104u);
  EXPECT_EQ(offsetof(OpforgeParamSpec, compile_time), 112u);
}

TEST(AbiLayout, ArgSpec) {
  EXPECT_EQ(sizeof(OpforgeArgSpec), 272u);
  EXPECT_EQ(offsetof(OpforgeArgSpec, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeArgSpec, name), 8u);
  EXPECT_EQ(offsetof(OpforgeArgSpec, kind), 16u);
  EXPECT_EQ(offsetof(OpforgeArgSpec, tensor), 24u);
  EXPECT_EQ(offsetof(OpforgeArgSpec, param), 152u);
}

TEST(AbiLayout, DtypeCase) {
  EXPECT_EQ(sizeof(OpforgeDtypeCase), 40u);
  EXPECT_EQ(offsetof(OpforgeDtypeCase, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeDtypeCase, arg), 8u);
  EXPECT_EQ(offsetof(OpforgeDtypeCase, param), 12u);
  EXPECT_EQ(offsetof(OpforgeDtypeCase, value), 16u);
  EXPECT_EQ(offsetof(OpforgeDtypeCase, dtypes), 24u);
  EXPECT_EQ(offsetof(OpforgeDtypeCase, dtype_like), 28u);
  EXPECT_EQ(offsetof(OpforgeDtypeCase, dtype_alternatives), 32u);
}

TEST(AbiLayout, RuleCase) {
  EXPECT_EQ(sizeof(OpforgeRuleCase), 64u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, arg), 8u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, output), 12u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, param), 16u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, value), 24u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, has_shape), 32u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, num_dims), 36u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, dims), 40u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, leading_dims), 48u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, has_dtype), 52u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, dtype_like), 56u);
  EXPECT_EQ(offsetof(OpforgeRuleCase, dtype), 60u);
}

TEST(AbiLayout, Rule) {
  EXPECT_EQ(sizeof(OpforgeRule), 56u);
  EXPECT_EQ(offsetof(OpforgeRule, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeRule, op), 8u);
  EXPECT_EQ(offsetof(OpforgeRule, lhs), 16u);
  EXPECT_EQ(offsetof(OpforgeRule, rhs), 32u);
  EXPECT_EQ(offsetof(OpforgeRule, when_arg), 48u);
  EXPECT_EQ(offsetof(OpforgeRule, when_given), 52u);
}

TEST(AbiLayout, OutputSpec) {
  EXPECT_EQ(sizeof(OpforgeOutputSpec), 56u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, name), 8u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, dtype_like), 16u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, dtype), 20u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, shape_like), 24u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, num_dims), 28u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, dim_index), 32u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, dims), 40u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, present_with), 48u);
  EXPECT_EQ(offsetof(OpforgeOutputSpec, size_from), 52u);
}

TEST(AbiLayout, Context) {
  EXPECT_EQ(sizeof(OpforgeContext), 64u);
  EXPECT_EQ(offsetof(OpforgeContext, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeContext, device_type), 8u);
  EXPECT_EQ(offsetof(OpforgeContext, device_index), 12u);
  EXPECT_EQ(offsetof(OpforgeContext, stream), 16u);
  EXPECT_EQ(offsetof(OpforgeContext, allocate), 24u);
  EXPECT_EQ(offsetof(OpforgeContext, allocator_state), 32u);
  EXPECT_EQ(offsetof(OpforgeContext, after_value_check), 40u);
  EXPECT_EQ(offsetof(OpforgeContext, value_domains), 48u);
  EXPECT_EQ(offsetof(OpforgeContext, num_value_domains), 56u);
}

// Passed by value to kernels as opforge::kernel::ValueDomain (opforge/kernel.cuh), whose own
// static_asserts hold it to these numbers wherever a kernel is compiled.
TEST(AbiLayout, ValueDomain) {
  EXPECT_EQ(sizeof(OpforgeValueDomain), 224u);
  EXPECT_EQ(alignof(OpforgeValueDomain), 8u);
  EXPECT_EQ(offsetof(OpforgeValueDomain, low), 0u);
  EXPECT_EQ(offsetof(OpforgeValueDomain, high), 8u);
  EXPECT_EQ(offsetof(OpforgeValueDomain, sentinel), 16u);
  EXPECT_EQ(offsetof(OpforgeValueDomain, has_sentinel), 24u);
  EXPECT_EQ(offsetof(OpforgeValueDomain, arg), 28u);
  EXPECT_EQ(offsetof(OpforgeValueDomain, message), 32u);
}

TEST(AbiLayout, Arg) {
  EXPECT_EQ(sizeof(OpforgeArg), 96u);
  EXPECT_EQ(offsetof(OpforgeArg, tensor), 0u);
  EXPECT_EQ(offsetof(OpforgeArg, value), 40u);
}

TEST(AbiLayout, CallFrame) {
  EXPECT_EQ(sizeof(OpforgeCallFrame), 64u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, ctx), 8u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, num_args), 16u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, args), 24u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, num_outputs), 32u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, outputs), 40u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, error), 48u);
  EXPECT_EQ(offsetof(OpforgeCallFrame, error_capacity), 56u);
}

TEST(AbiLayout, PrecompileRequest) {
  EXPECT_EQ(sizeof(OpforgePrecompileRequest), 80u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, dtypes), 8u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, values), 16u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, arch), 24u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, cache_dir), 32u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, error), 40u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, error_capacity), 48u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, cache_hit), 56u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, num_shapes), 60u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, ndims), 64u);
  EXPECT_EQ(offsetof(OpforgePrecompileRequest, sizes), 72u);
}

TEST(AbiLayout, Kernel) {
  EXPECT_EQ(sizeof(OpforgeKernel), 72u);
  EXPECT_EQ(offsetof(OpforgeKernel, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeKernel, device_type), 8u);
  EXPECT_EQ(offsetof(OpforgeKernel, fn), 16u);
  EXPECT_EQ(offsetof(OpforgeKernel, user), 24u);
  EXPECT_EQ(offsetof(OpforgeKernel, source), 32u);
  EXPECT_EQ(offsetof(OpforgeKernel, name), 40u);
  EXPECT_EQ(offsetof(OpforgeKernel, precompile), 48u);
  EXPECT_EQ(offsetof(OpforgeKernel, dtype_arg), 56u);
  EXPECT_EQ(offsetof(OpforgeKernel, dtypes), 60u);
  EXPECT_EQ(offsetof(OpforgeKernel, backend), 64u);
  EXPECT_EQ(offsetof(OpforgeKernel, checks_values), 68u);
}

TEST(AbiLayout, OpSpec) {
  EXPECT_EQ(sizeof(OpforgeOpSpec), 184u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, ns), 8u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, name), 16u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, doc), 24u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, file), 32u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, line), 40u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, num_args), 44u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, args), 48u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, num_outputs), 56u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, outputs), 64u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, num_kernels), 72u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, kernels), 80u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, equivalent), 88u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, sharding), 96u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, sharding_dims), 100u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, backward), 104u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, num_rules), 112u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, rules), 120u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, autocast), 128u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, num_tolerances), 132u);  // in the tail padding of ABI 5's record
  EXPECT_EQ(offsetof(OpforgeOpSpec, tolerances), 136u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, tolerance_vs_equivalent), 144u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, num_dtype_cases), 152u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, dtype_cases), 160u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, num_rule_cases), 168u);
  EXPECT_EQ(offsetof(OpforgeOpSpec, rule_cases), 176u);
}

TEST(AbiLayout, Tolerance) {
  EXPECT_EQ(sizeof(OpforgeTolerance), 24u);
  EXPECT_EQ(offsetof(OpforgeTolerance, dtype), 0u);
  EXPECT_EQ(offsetof(OpforgeTolerance, atol), 8u);
  EXPECT_EQ(offsetof(OpforgeTolerance, rtol), 16u);
}

TEST(AbiLayout, Library) {
  EXPECT_EQ(sizeof(OpforgeLibrary), 64u);
  EXPECT_EQ(offsetof(OpforgeLibrary, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeLibrary, abi_version), 8u);
  EXPECT_EQ(offsetof(OpforgeLibrary, num_ops), 12u);
  EXPECT_EQ(offsetof(OpforgeLibrary, ops), 16u);
  EXPECT_EQ(offsetof(OpforgeLibrary, error), 24u);
  EXPECT_EQ(offsetof(OpforgeLibrary, kernel_dir), 32u);
  EXPECT_EQ(offsetof(OpforgeLibrary, reload), 40u);
  EXPECT_EQ(offsetof(OpforgeLibrary, num_classes), 48u);
  EXPECT_EQ(offsetof(OpforgeLibrary, classes), 56u);
}

TEST(AbiLayout, MethodSpec) {
  EXPECT_EQ(sizeof(OpforgeMethodSpec), 24u);
  EXPECT_EQ(offsetof(OpforgeMethodSpec, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeMethodSpec, name), 8u);
  EXPECT_EQ(offsetof(OpforgeMethodSpec, op), 16u);
}

TEST(AbiLayout, ClassSpec) {
  EXPECT_EQ(sizeof(OpforgeClassSpec), 88u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, struct_size), 0u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, ns), 8u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, name), 16u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, doc), 24u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, file), 32u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, line), 40u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, num_fields), 44u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, field_names), 48u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, field_kinds), 56u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, constructor), 64u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, num_methods), 72u);
  EXPECT_EQ(offsetof(OpforgeClassSpec, methods), 80u);
}

}  // namespace
