// opforge/op_constraints.h -- what an input or a parameter accepts: the constraints `.input()` and
// `.param()` take (part of opforge/op.h).
//
//   .input("x", opforge::floating, opforge::min_rank(1))
//   .input("bias", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
//   .input("residual", opforge::same_dtype("x"), opforge::same_shape("x"), opforge::mutated)
//   .input("slots", opforge::kInt64, opforge::rank(1), opforge::values_in(0, opforge::dim("cache", 0)))
//   .param<double>("eps", 1e-6, opforge::at_least(0.0))
//
// Dtype sets (opforge::floating, opforge::kFloat16 | opforge::kBFloat16) are in opforge/dtype.h,
// shape rules (opforge::shape, opforge::dim, opforge::any) in opforge/expr.h. A call is checked
// against every constraint before any launch and refused with one line per bad argument (value
// domains on the host only: Note [Value domains]).
//
// Note [Mutated inputs]
// ---------------------
// `.input("residual", opforge::same_dtype("x"), opforge::mutated)` declares an input the kernel
// writes in place (read or not): the schema says `Tensor(a!) residual` (letters a, b, ... in
// declaration order), the reference and every kernel take it as an opforge::MutableTensor, and it
// is not returned. An op may write only its inputs (`-> ()`, at least one mutated input) or also
// have fresh outputs. Under torch.compile and torch.export such ops are functionalised
// (auto_functionalized) and Inductor writes into the caller's buffers again, so compiled and
// AOTInductor code mutates in place as eager does.
//
// An input not declared opforge::strided reaches a kernel with the layout its rule asks for (dense
// and 16-byte aligned, or with opforge::contiguous_last_dim rows of adjacent elements at 16-byte
// aligned strides), which the adapter arranges by copying a view that does not have it. A mutated
// input is never copied, since the kernel's writes into a copy would be lost: one declared
// opforge::strided is passed as it is, any other must already have its layout, and a call that
// passes another layout is refused before any launch with an error that names the layout it needs.
//
// A mutated input whose elements overlap in memory (an expanded view, stride 0) is refused in every
// layout, and so is one that shares memory with another tensor argument (the same tensor twice,
// overlapping slices of one: as ATen's assert_no_overlap, for dense views), whose result would
// depend on the kernel's order of reads and writes.
//
// An op with mutated inputs may name a backward op (Note [Backward ops] in opforge/op_builder.h).
// The backward op sees each mutated input `x` as a result `x_out`, its value after the op:
// `grad_x_out` is its gradient, `x_out` the value itself (the value before is overwritten, so the
// backward op cannot name `x`), and its output `grad_x` is the gradient of x as given. As for
// torch's in-place ops, a write into a leaf that requires grad is refused, and a tensor that was
// saved for a backward and then written makes that backward raise. Without a backward op, a
// backward through such an op raises "derivative for ns::op is not implemented".
//
// Note [Value domains]
// --------------------
// An integer input that indexes something (positions into a table, slots of a cache) declares which
// values it takes:
//
//   .input("slots", opforge::kInt64, opforge::rank(1),
//          opforge::values_in(0, opforge::dim("cache", 0) * opforge::dim("cache", 1)).unique_values().or_value(-1))
//
// opforge verify draws such inputs inside their domain, so a correct kernel is never fed an index
// it cannot take and a wrong one is caught within it. The CPU kernel of a call checks them before
// the reference runs: on the host the check is cheap, and an out-of-range index would read outside
// the table. Device calls are not checked, as reading the values would cost a synchronisation.
//
// Note [Rules that follow a parameter]
// ------------------------------------
// An input's dtype may depend on the value of a string, int or bool parameter, as vLLM's cache
// write stores its caches in the key's dtype under kv_cache_dtype "auto" and in float8 otherwise:
//
//   .input("key_cache",
//          opforge::when("kv_cache_dtype", "auto", opforge::same_dtype("key"))
//              .when("fp8_e5m2", opforge::kFloat8_e5m2)
//              .otherwise(opforge::kFloat8_e4m3fn), opforge::mutated)
//   .param<std::string>("kv_cache_dtype", opforge::one_of({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}),
//                       opforge::compile_time)
//
// Each `when` names a value and its rule (a dtype, a dtype set or a same_dtype); `otherwise` is
// the rule of every value no case names, so the rule is total. A shape rule (of an input or an
// output) and an output's dtype rule may follow a parameter the same way, as vLLM's
// scaled_fp8_quant returns one scale per token under use_per_token_if_dynamic and one for the
// tensor otherwise:
//
//   .output("output_scale",
//           opforge::when("use_per_token_if_dynamic", true, opforge::shape({opforge::dim("input", 0), 1}))
//               .otherwise(opforge::shape({1})),
//           opforge::kFloat32)
//
// An output's dtype case is one dtype or a same_dtype (the dtype of that input). The parameter
// may come later in the signature; a value must be one of its one_of choices when it has them (an
// int's in decimal, a bool's true or false). A call is checked against the rules its parameter's
// value selects ("key_cache: expected dtype float8_e4m3fn where kv_cache_dtype is 'fp8', got
// bfloat16"; "scale: expected shape [input.size(0), 1] = [4, 1] where use_per_token_if_dynamic is
// true, got [1, 1]") and its outputs are allocated by them, in torch's Meta kernel and JAX's
// abstract evaluation too, where parameters are constants (dims stay symbolic); opforge verify
// draws for each value only the dtypes and shapes its rules admit. A run-time kernel takes a
// std::string parameter only as opforge::compile_time (each value its own instantiation), which
// the rule's parameter then is.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "opforge/detail/op_detail.h"
#include "opforge/expr.h"

namespace opforge {

// ---- input constraints ----------------------------------------------------------------------

/// The input's dtype must equal that of tensor input `tensor` (declared before or after it); `| opforge::kFloat32`
/// (or any dtype set) also accepts those dtypes whatever that input's, e.g. a norm weight kept in
/// float32 beside 16-bit activations: `opforge::same_dtype("x") | opforge::kFloat32`.
inline detail::SameDtype same_dtype(std::string tensor) { return {std::move(tensor)}; }
/// The input's dtype rule follows the value of parameter `param` (a std::string, int64_t or bool
/// one): `rule` (a dtype, a dtype set or a same_dtype) where it equals `value`; chain
/// `.when(value, rule)` for other values and end with `.otherwise(rule)`, the rule of every value
/// no case names. See Note [Rules that follow a parameter] above.
template <class V, detail::DtypeRule R>
detail::DtypeWhen when(std::string param, const V& value, const R& rule) {
  detail::DtypeWhen w;
  detail::DtypeCaseDecl& c = w.cases.emplace_back();
  c.param = std::move(param);
  c.value = detail::param_value_string(value);
  detail::set_dtype_rule(c, rule);
  return w;
}
/// The input's (or an output's) shape rule follows the value of parameter `param` (a std::string,
/// int64_t or bool one): `shape` where it equals `value`; chain `.when(value, shape)` for other
/// values and end with `.otherwise(shape)`, e.g. a scale of one float per row or per tensor:
/// `opforge::when("per_token", true, opforge::shape({opforge::dim("x", 0), 1})).otherwise(opforge::shape({1}))`.
/// See Note [Rules that follow a parameter] above.
template <class V>
detail::ShapeWhen when(std::string param, const V& value, const Shape& shape) {
  return detail::ShapeWhen{{{std::move(param), detail::param_value_string(value), shape.dims}}};
}
/// The input's shape must equal that of tensor input `tensor` (any rank; declared before or after it).
inline detail::SameShape same_shape(std::string tensor) { return {std::move(tensor)}; }
/// The input has exactly `n` dims.
inline detail::RankRange rank(int32_t n) { return {n, n}; }
/// The input has at least `n` dims.
inline detail::RankRange min_rank(int32_t n) { return {n, -1}; }
/// The input has between `lo` and `hi` dims (inclusive).
inline detail::RankRange rank_between(int32_t lo, int32_t hi) { return {lo, hi}; }
/// The kernel reads strides, so the adapter passes any layout (permuted, sliced, expanded)
/// as it is. Without this, inputs reach kernels dense, row-major and 16-byte aligned (a
/// misaligned view is copied), so kernels may use 16-byte vector loads unconditionally.
inline constexpr detail::Strided strided{};
/// The kernel reads the strides of every dim but the last, whose elements are adjacent (the
/// layout of a head split `x.view(b, s, h, d).transpose(1, 2)`, or of a slice of rows): such a
/// view is passed as is when its data pointer and its other strides are multiples of 16 bytes,
/// so 16-byte vector loads along a row stay valid; any other layout reaches the kernel as a
/// dense, 16-byte aligned copy. (PyTorch's fused attention kernels ask the same of q, k and v.)
inline constexpr detail::ContiguousLastDim contiguous_last_dim{};
/// The caller may leave the input out: the schema says `Tensor? name=None`, and the kernel
/// then gets an opforge::Tensor whose defined() is false (run-time kernels: a null pointer).
/// The input's other constraints apply only when it is given. Nothing but output rules and rules
/// gated on its presence (opforge::when_given, opforge::unless_given) may refer to it (not another
/// input's same_dtype/same_shape/shape rule, a launch rule or a `{T_name}` placeholder): an output whose rules read it
/// (`like("key")`) exists only when it is given (schema `Tensor?`, None otherwise). The first tensor input cannot be
/// optional, and every input and parameter declared after it needs a default (is optional, or has a default value).
inline constexpr detail::Optional optional{};
/// The elements of an integer input index something: each is in [low, high), expressions over
/// dims and integer parameters, e.g. token positions into a table of `cos_sin_cache.size(0)` rows:
/// `opforge::values_in(0, opforge::dim("cos_sin_cache", 0))`. Chain `.unique_values()` for
/// elements that must be distinct and `.or_value(-1)` for a marker outside the range. See
/// Note [Value domains] above.
inline detail::Values values_in(Expr low, Expr high) { return {std::move(low), std::move(high)}; }
/// The kernel writes this input in place (read it or not), as torch.library's `mutates_args`: the
/// schema says `Tensor(a!) name`, the reference and kernels take it as an opforge::MutableTensor,
/// and it is not among the op's returns. See Note [Mutated inputs] above.
inline constexpr detail::Mutated mutated{};

// ---- parameter constraints ------------------------------------------------------------------

/// Parameter (or each element of a list parameter) >= `v`.
inline detail::ParamRange at_least(double v) { return {true, false, v, 0}; }
/// Parameter (or each element) <= `v`.
inline detail::ParamRange at_most(double v) { return {false, true, 0, v}; }
/// `lo` <= parameter <= `hi`.
inline detail::ParamRange in_range(double lo, double hi) { return {true, true, lo, hi}; }
/// A string parameter restricted to these values (an enum).
inline detail::Choices one_of(std::vector<std::string> values) { return {std::move(values), false}; }
/// An int64_t parameter restricted to these values, e.g. a head dim `one_of({64, 128})`.
inline detail::Choices one_of(std::initializer_list<int64_t> values) {
  detail::Choices c{{}, true};
  for (int64_t v : values) c.values.push_back(std::to_string(v));
  return c;
}
/// The parameter is a template argument of the op's run-time kernels (`{name}` in the kernel
/// name), so each value gets its own compiled instantiation; int64_t, bool and std::string only.
inline constexpr detail::CompileTime compile_time{};

}  // namespace opforge
