// opforge/op_builder.h -- OPFORGE_OP and its builder: the op's arguments in order, its kernels,
// its backward op and how it runs under autocast and sharding (part of opforge/op.h).
//
//   OPFORGE_OP(examples, softshrink)
//       .doc("x - lambd where x > lambd, x + lambd where x < -lambd, else 0")
//       .input("x", opforge::floating)
//       .param<double>("lambd", 0.5, opforge::at_least(0.0))
//       .output("y", opforge::like("x"))
//       .backward("softshrink_backward")
//       .reference(softshrink_cpu)
//       .cuda(softshrink_cuda);
//
// The declaration is ordered and typed: inputs and parameters in schema order, then outputs.
// Kernels take exactly those arguments in that order, optionally preceded by
// `const opforge::Context&`: opforge::Tensor for an input (opforge::MutableTensor for an
// opforge::mutated one), the C++ type of each parameter (below), opforge::MutableTensor for an
// output. A mismatch is a compile error that says so.
//
//   .param<T>             passed to kernels as          schema type
//   int64_t               int64_t                       int
//   double                double                        float
//   bool                  bool                          bool
//   std::string           std::string_view              str
//   std::vector<int64_t>  std::span<const int64_t>      int[]
//   std::vector<double>   std::span<const double>       float[]
//
// An int64_t parameter that a shape rule, value domain or .require() reads is a size: its schema
// type is SymInt, so torch.compile and torch.export keep a value derived from a dynamic dim
// symbolic (see opforge::int_param).
//
// Note [Kernel dtypes]
// --------------------
// The CPU reference takes every dtype the declaration admits; a device kernel may take fewer, as
// PyTorch's flash attention takes only 16-bit inputs while its math fallback takes all:
// `.cuda_source(...).launch_grid(fn).kernel_dtypes("q", opforge::half_precision)`. The input named
// must be a required tensor input, named once per kernel.
//
// A call on that device with another dtype of `q` is refused before any launch, as any other
// invalid argument ("q: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no
// other), got float32"), in eager calls and when a compiled, exported or AOTInductor graph runs. A
// trace is not refused: tracing runs the Meta kernel on meta tensors, which do not say which device
// they stand for.
//
// opforge verify and ahead-of-time compiles of run-time kernels use only the combinations the
// kernel takes; the reference keeps the others (float64 for gradcheck).
//
// Note [Equivalent-only ops]
// ---------------------------
// A kernel author who writes Triton (or any device kernel) tests against a torch expression, not a
// C++ loop. An op may therefore declare no `.reference()`: only `.equivalent("torch expression")`
// and device kernels. It then has no CPU kernel: a CPU call is refused before anything runs,
// naming the op and what it lacks (never a silent fallback), and `opforge verify` compares the
// device kernels with the expression evaluated in float64 on the CPU. Everything else (the
// schema, checks, Meta kernel, autograd through a backward op, compile, export, AOTInductor on
// the device) is as for any op; the C++ runner runs such an op on its device only.
//
// Note [Backward ops]
// -------------------
// `.backward("softshrink_backward")` names another op of the same library (declared like any other,
// usually in the same file) that computes this op's input gradients. The torch adapter runs it from
// the op's Autograd kernel, so `loss.backward()`, torch.autograd.grad and torch.compile's backward
// graph use it. The two ops meet by argument names, as in PyTorch's derivatives.yaml:
// - Each input of the backward op is `grad_<output>`, the gradient of one of this op's outputs
//   (zeros when that output did not reach the loss), or has the name (and type) of one of this op's
//   inputs, parameters or outputs, whose value is saved for it. An output whose gradient the
//   backward op does not take is not differentiable (torch's `output_differentiability: False`, as
//   the logsumexp of _scaled_dot_product_flash_attention): autograd records no history for it and
//   JAX stops its cotangent, so a loss through it alone raises in torch rather than losing its
//   gradient (examples::attention's lse).
// - Each output of the backward op is `grad_<input>`, the gradient of one of this op's tensor
//   inputs, with that input's shape and dtype (checked when it runs), or `grad_<a>_and_<b>` (any
//   number of `_and_`), one gradient of several inputs that is given to each of them, as torch's
//   AddBackward does (x and residual of a residual add: the kernel writes it once). A name that
//   reads two ways, as with inputs a, b and a_and_b, is refused at load. Optional inputs left out
//   get no gradient; an input that needs a gradient the backward op does not return raises
//   NotImplementedError, as torch's own ops do ("the derivative ... is not implemented").
//
// A backward op takes at least one gradient and writes none of its inputs (no opforge::mutated:
// they are the forward call's saved values and the caller's gradients). Loading checks these rules
// and, on a mismatch, raises naming each argument and what it may be called, and registers nothing.
//
// The backward op is an op of its own: CPU reference, device kernels, verify and sanitize apply to
// it as to any op, and it may name a backward op in turn (double backward; without one, a second
// derivative raises "derivative for ... is not implemented" when it is taken). Forward-mode AD
// (jvp, jacfwd) and compiled autograd are not supported.
//
// An op that names no backward op is forward only, as torch's own ops without a derivative formula:
// a backward that must pass a gradient through it into an input that requires grad raises
// "derivative for ns::op is not implemented" (in eager, and in torch.compile of a call that needs
// it), while calls under no_grad or inference_mode, or whose inputs do not require grad, are free.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/op_detail.h"
#include "opforge/dtype.h"
#include "opforge/expr.h"
#include "opforge/tensor.h"

namespace opforge {

/// How a sharded tensor framework (torch.distributed.tensor) may split the op's work.
///   kPointwise: each output element depends only on the input elements at the same index
///     (inputs of lower rank broadcast from the right, like a bias over the last dim): any dim
///     of the output may be sharded, and the inputs are sharded the same way.
///   kRowwise: like kPointwise, but each row (the last dim) is computed as a whole (norms,
///     softmax): any dim but the last may be sharded; lower-rank inputs are replicated.
/// Ops with a run-time kernel launched by opforge::elementwise or opforge::rows get kPointwise
/// or kRowwise unless they declare otherwise. See also opforge::shard_dims.
enum class Sharding : int32_t {
  kNone = OPFORGE_SHARDING_NONE,
  kPointwise = OPFORGE_SHARDING_POINTWISE,
  kRowwise = OPFORGE_SHARDING_ROWWISE,
};

/// The op computes each index of these dims of its first tensor input independently (and its
/// outputs have them at the same positions), e.g. batch and heads of attention:
/// `.sharding(opforge::shard_dims({0, 1}))`. A sharded tensor framework may shard any one of
/// them; every other input follows through its shape rule (a dim declared
/// `opforge::dim("q", d)`, or `same_shape` of such an input, is sharded with d) and is
/// replicated otherwise. Dims in [0, 32).
inline detail::ShardDims shard_dims(std::initializer_list<int32_t> dims) { return {std::vector<int32_t>(dims)}; }

/// How the op runs under automatic mixed precision (`torch.autocast`), the categories of torch's
/// own ops (torch.library.register_autocast for Python ops): the framework casts the op's
/// floating tensor inputs (not opforge::mutated ones, which are written in place, and not those on
/// another device) before the call, as for its own ops.
///   kNone: no cast; the op runs in the dtypes it is given (the default).
///   kFloat32: to float32, for ops that need the range or precision (norms, reductions, softmax).
///   kLowerPrecision: to the autocast dtype (float16 or bfloat16), for matmul-like ops.
///   kPromote: to the widest dtype among them (float32 beside bfloat16), for ops that combine
///     inputs (a bf16 activation with its float32 bias).
/// Loading refuses a policy the op's dtype rules cannot take (kFloat32 without an all-float32
/// combination, kLowerPrecision without an all-float16 or all-bfloat16 one).
enum class Autocast : int32_t {
  kNone = OPFORGE_AUTOCAST_NONE,
  kFloat32 = OPFORGE_AUTOCAST_FLOAT32,
  kLowerPrecision = OPFORGE_AUTOCAST_LOWER_PRECISION,
  kPromote = OPFORGE_AUTOCAST_PROMOTE,
};

/// Builds an op declaration; see this file's comment. Each call returns a builder whose type
/// records the declared argument types, so that `.reference()` and `.cuda()` can check the
/// kernels' signatures at compile time. Produced by OPFORGE_OP; not constructed directly.
template <bool HasOutputs, class... Sig>
class OpBuilder {
 public:
  explicit OpBuilder(std::unique_ptr<detail::OpDef> def) : def_(std::move(def)) {}

  /// One-line description, shown in docs and in error messages.
  OpBuilder doc(std::string text) && {
    def_->set_doc(std::move(text));
    return std::move(*this);
  }

  /// The same computation as a Python expression over torch and the argument names, e.g.
  /// "torch.nn.functional.softshrink(x, lambd)". Not used by kernels: `opforge verify` checks
  /// the CPU reference against it (in float64) where no device kernel can be compared, and an op
  /// without a `.reference()` is verified against it (Note [Equivalent-only ops]).
  OpBuilder equivalent(std::string python_expression) && {
    def_->set_equivalent(std::move(python_expression));
    return std::move(*this);
  }

  /// The op that computes this op's input gradients, "name" (same namespace) or "ns::name";
  /// see Note [Backward ops]. Loading registers it as the op's autograd formula in torch.
  OpBuilder backward(std::string op) && {
    def_->set_backward(std::move(op));
    return std::move(*this);
  }

  /// A rule over several arguments, checked on every call before any launch with the same
  /// message shape as the arguments' own constraints ("expected rotary_dim <= head_size, got 96
  /// <= 64"), symbolically under torch.compile, and respected by opforge verify when it picks
  /// sizes: `.require(opforge::dim("cos_sin_cache", 1) <= opforge::dim("query", -1))`.
  OpBuilder require(Condition rule) && {
    def_->add_rule(std::move(rule));
    return std::move(*this);
  }
  /// Rules by an opforge::optional input's presence (opforge::when_given, opforge::unless_given):
  /// each is checked only on the calls its presence covers.
  OpBuilder require(PresenceRules rules) && {
    for (Condition& rule : rules.rules) def_->add_rule(std::move(rule));
    return std::move(*this);
  }

  /// The tolerance `opforge verify` compares this op's results in `dtype` with, against float64
  /// (|got - want| <= atol + rtol |want|), where the op's arithmetic is looser than the dtype's
  /// defaults (opforge.verify.TOLERANCES): the counterpart of toleranceOverride in torch's
  /// OpInfo tests. State the reason beside it (the rounding the kernels do, a published
  /// criterion). `dtype` must be floating or float8 (whose results are otherwise compared bit for
  /// bit: Note [Float8 dtypes] in opforge/dtype.h), atol and rtol finite and >= 0, each dtype
  /// declared once; otherwise loading the library fails, naming the op.
  OpBuilder tolerance(Dtype dtype, double atol, double rtol) && {
    def_->tolerances.push_back({static_cast<int32_t>(dtype), atol, rtol});
    return std::move(*this);
  }

  /// For kernels whose rounding differs from a float64 reference by design (FlashAttention's
  /// 16-bit P and dS, whose rounding a gradient's sum can leave larger than the sum itself):
  /// where a device kernel's result misses the dtype's tolerance (or `.tolerance()`), `opforge
  /// verify` still passes it if, for every output, max |kernel - float64 reference| <= `factor`
  /// x max |equivalent - float64 reference|, with the `.equivalent()` expression run in the
  /// case's own dtypes on the same device. That is FlashAttention's own test criterion
  /// (tests/test_flash_attn.py: `(dq - dq_ref).abs().max() <= 2 * (dq_pt - dq_ref).abs().max()`,
  /// factor 2), as PyTorch's SDPA tests scale theirs by the error of the math backend in the
  /// same dtype. Only floating outputs, against a float64 reference, whose equivalent result
  /// has their dtype. `factor` must be finite and >= 0 (0 declares none), and a factor > 0
  /// needs an `.equivalent()` that runs in the op's dtypes; otherwise loading the library
  /// fails, naming the op.
  OpBuilder tolerance_vs_equivalent(double factor) && {
    def_->tolerance_vs_equivalent = factor;
    return std::move(*this);
  }

  /// How the op runs under torch.autocast (see opforge::Autocast).
  OpBuilder autocast(Autocast policy) && {
    def_->autocast = static_cast<int32_t>(policy);
    return std::move(*this);
  }

  /// How the op may be sharded (see opforge::Sharding).
  OpBuilder sharding(Sharding s) && {
    def_->set_sharding(static_cast<int32_t>(s), {});
    return std::move(*this);
  }

  /// Independent dims of the first tensor input (see opforge::shard_dims).
  OpBuilder sharding(const detail::ShardDims& s) && {
    def_->set_sharding(OPFORGE_SHARDING_DIMS, s.dims);
    return std::move(*this);
  }

  /// A tensor input. Constraints (opforge/op_constraints.h): a dtype set (`opforge::floating`,
  /// `opforge::kFloat16 | opforge::kBFloat16`), `same_dtype("x")` (`| kFloat32` for
  /// alternatives), `same_shape("x")`, `rank(n)`, `min_rank(n)`, `shape({...})`
  /// (`shape({opforge::leading_dims, ...})` for any number of leading dims), `strided`,
  /// `contiguous_last_dim`, `optional`, `mutated`, `values_in(lo, hi)`, and a dtype rule that
  /// follows a parameter, `when(param, value, rule).otherwise(rule)`.
  template <class... C>
  auto input(std::string name, const C&... constraints) && {
    static_assert(!HasOutputs, "opforge: declare every .input() and .param() before the first .output()");
    static_assert(!(std::is_same_v<C, detail::DtypeWhen> || ...),
                  "opforge: opforge::when(...) needs .otherwise(rule): the dtype rule of the values no case names");
    static_assert(!(std::is_same_v<C, detail::ShapeWhen> || ...),
                  "opforge: opforge::when(...) needs .otherwise(shape): the shape rule of the values no case names");
    static_assert((detail::TensorConstraint<C> && ...),
                  "opforge: .input() takes dtype sets, opforge::same_dtype, opforge::same_shape, opforge::rank, "
                  "opforge::min_rank, opforge::shape, opforge::strided, opforge::contiguous_last_dim, "
                  "opforge::optional, opforge::mutated, opforge::values_in and opforge::when(...).otherwise(...) as "
                  "constraints");
    using Slot = std::conditional_t<(std::is_same_v<C, detail::Mutated> || ...), detail::MutatedInput, Tensor>;
    detail::TensorDecl& t = def_->add_arg(std::move(name), OPFORGE_ARG_TENSOR).tensor;
    (detail::apply(t, constraints), ...);
    return OpBuilder<false, Sig..., Slot>(std::move(def_));
  }

  // (clang-format 14 cannot lay out requires-clauses.)
  // clang-format off
  /// A required parameter of C++ type T (see the table in this file's comment), with optional
  /// constraints `at_least`, `at_most`, `in_range`, `one_of`, `compile_time`
  /// (opforge/op_constraints.h).
  template <class T, class... C>
    requires(detail::ParamConstraint<C> && ...)
  auto param(std::string name, const C&... constraints) && {
    return std::move(*this).template add_param<T>(std::move(name), detail::ParamDefault{}, constraints...);
  }

  /// A parameter with a default value.
  template <class T, class... C>
    requires(detail::ParamConstraint<C> && ...)
  auto param(std::string name, std::type_identity_t<T> default_value, const C&... constraints) && {
    return std::move(*this).template add_param<T>(std::move(name), detail::ParamDefault(std::move(default_value)),
                                                  constraints...);
  }
  // clang-format on

  /// An output with the shape and dtype of an input, possibly modified: `like("x")`.
  OpBuilder<true, Sig..., MutableTensor> output(std::string name, const Like& rule) && {
    detail::set_output(def_->add_output(std::move(name)), rule);
    return std::move(*this).outputs_declared();
  }

  /// An output with an explicit shape (`shape({...})`, or one that follows a parameter:
  /// `when(param, value, shape({...})).otherwise(shape({...}))`) and a dtype: a fixed one
  /// (`opforge::kFloat32`), the dtype of an input (`dtype_of("x")`), or one that follows a
  /// parameter (`when(param, value, opforge::kFloat8_e4m3fn).otherwise(opforge::same_dtype("x"))`).
  template <class S, class D>
  OpBuilder<true, Sig..., MutableTensor> output(std::string name, const S& shape, const D& dtype) && {
    static_assert(!std::is_same_v<S, detail::ShapeWhen>,
                  "opforge: opforge::when(...) needs .otherwise(shape): the shape rule of the values no case names");
    static_assert(!std::is_same_v<D, detail::DtypeWhen>,
                  "opforge: opforge::when(...) needs .otherwise(rule): the dtype rule of the values no case names");
    static_assert(detail::OutputShapeRule<S> || std::is_same_v<S, detail::ShapeWhen>,
                  "opforge: .output()'s shape rule is opforge::shape({...}) or "
                  "opforge::when(param, value, shape).otherwise(shape)");
    static_assert(detail::OutputDtypeRule<D> || std::is_same_v<D, detail::DtypeWhen>,
                  "opforge: .output()'s dtype rule is a dtype, opforge::dtype_of or "
                  "opforge::when(param, value, dtype).otherwise(dtype)");
    if constexpr (detail::OutputShapeRule<S> && detail::OutputDtypeRule<D>) {
      detail::OutputDecl& o = def_->add_output(std::move(name));
      detail::set_output_shape(o, shape);
      detail::set_output_dtype(o, dtype);
    }
    return std::move(*this).outputs_declared();
  }

  /// The CPU reference: the op's CPU kernel and the baseline device kernels are checked against.
  template <class F>
  OpBuilder reference(F* fn) && {
    def_->add_kernel(make_kernel(OPFORGE_DEVICE_CPU, fn), /*reference=*/true);
    return std::move(*this);
  }

  /// A CUDA kernel compiled ahead of time (a host function in a .cu file that launches on
  /// `ctx`'s stream; see opforge/cuda.h).
  template <class F>
  OpBuilder cuda(F* fn) && {
    def_->add_kernel(make_kernel(OPFORGE_DEVICE_CUDA, fn), /*reference=*/false);
    return std::move(*this);
  }

  /// A CUDA kernel compiled at run time (Note [Run-time kernels] in opforge/op_launch.h): `file`
  /// is shipped in the library's kernel folder, `name` names the kernel, with `{T}` (the first
  /// tensor input's CUDA type), `{T_<tensor>}` and `{<param>}` (a compile_time parameter) filled
  /// in per call, e.g. "softshrink<{T}>". Follow with `.launch(rule)` or `.launch_grid(fn)`.
  OpBuilder cuda_source(std::string file, std::string name) && {
    def_->add_cuda_source(std::move(file), std::move(name));
    return std::move(*this);
  }

  /// How the last `.cuda_source()`, `.cuda_binary()` or `.triton_source()` kernel is launched:
  /// opforge::elementwise("y") or opforge::rows("x") (opforge/op_launch.h); see also launch_grid().
  OpBuilder launch(detail::LaunchRule rule) && {
    def_->set_launch(std::move(rule));
    return std::move(*this);
  }

  /// The dtypes the last declared device kernel (.cuda(), .cuda_source(), .cuda_binary() or
  /// .triton_source()) takes for tensor input `input`, where it covers fewer than the
  /// declaration admits (the CPU reference covers them all): `.kernel_dtypes("q",
  /// opforge::half_precision)`. See Note [Kernel dtypes].
  OpBuilder kernel_dtypes(std::string input, DtypeSet dtypes) && {
    def_->set_kernel_dtypes(std::move(input), dtypes.bits);
    return std::move(*this);
  }

  /// The last `.cuda_source()` or `.cuda_binary()` kernel calls
  /// opforge::kernel::wait_for_value_checks() (opforge/kernel.cuh) before its first load or store
  /// through an input declared with opforge::values_in(...), and touches no memory through those
  /// values before it. opforge then launches it, on sm_90 or newer with device value checks on, as
  /// the check kernel's programmatic dependent: its launch and its other loads overlap the check
  /// (Note [Device value checks] in src/core/device_checks.h), which otherwise runs before it
  /// alone. A kernel that reaches through an index before the wait could write where the check
  /// would have stopped it. Declaration errors: no such kernel before it; no input with a value
  /// domain.
  OpBuilder waits_for_value_checks() && {
    def_->set_waits_for_value_checks();
    return std::move(*this);
  }

  /// The last `.cuda_source()` or `.cuda_binary()` kernel checks every element of each input
  /// declared with opforge::values_in(...) itself, with opforge::kernel::check_value (opforge/
  /// kernel.cuh), before its first use of it, as torch's index kernels assert their indices
  /// (CUDA_KERNEL_ASSERT). It takes one `const __grid_constant__ opforge::kernel::ValueDomain` per
  /// such input, in argument order, after the op's parameters; CUDA calls then launch no
  /// separate value check (Note [Device value checks] in src/core/device_checks.h): one launch
  /// instead of two, where the check's own launch is a visible part of a small call. A value
  /// outside its domain prints the same message as the separate check and fails a device-side
  /// assertion. A kernel that skips an element, or uses one before checking it, lets a bad index
  /// through: what the separate check exists to prevent. Declaration errors: no such kernel
  /// before it; no input with a value domain; `.waits_for_value_checks()` on the same kernel.
  OpBuilder checks_values_in_kernel() && {
    def_->set_checks_values_in_kernel();
    return std::move(*this);
  }

  /// A Triton kernel (Note [Triton kernels] in opforge/op_launch.h): `file` is a Python file
  /// shipped in the library's kernel folder, `function` the name of an unmodified `@triton.jit`
  /// function in it (under `@triton.autotune` or not), e.g. `.triton_source("rms_norm.py",
  /// "_rms_norm_forward_kernel")`. Follow with `.launch(rule)` or `.launch_grid(fn)` (a grid
  /// function returning opforge::TritonLaunch).
  OpBuilder triton_source(std::string file, std::string function) && {
    def_->add_triton_source(std::move(file), std::move(function));
    return std::move(*this);
  }

  /// A prebuilt kernel (Note [Prebuilt kernels] in opforge/op_launch.h): `file` is a cubin, fatbin
  /// or PTX file shipped in the library's kernel folder (which of them is read from its content;
  /// the driver compiles PTX when it loads it), made by any compiler (nvcc -cubin, CuTe DSL,
  /// TileLang), and `symbol` the kernel's name in it, with `{T}`, `{T_<tensor>}` and `{<param>}`
  /// filled in per call as dtype names and values (`"scale_{T}"` is scale_float32 for a float32
  /// input). It takes the arguments of a `.cuda_source()` kernel, in the same order; their sizes
  /// are checked against the sizes the binary records, and their types against a C++-mangled
  /// symbol's. Follow with `.launch(rule)` or `.launch_grid(fn)`:
  /// `.cuda_binary("scale.cubin", "scale_kernel").launch(opforge::elementwise("y"))`.
  OpBuilder cuda_binary(std::string file, std::string symbol) && {
    def_->add_cuda_binary(std::move(file), std::move(symbol));
    return std::move(*this);
  }

  /// An explicit grid for the last `.cuda_source()`, `.cuda_binary()` or `.triton_source()`
  /// kernel: a grid function takes the op's arguments like a kernel does. For a CUDA kernel it is
  /// `opforge::LaunchConfig fn(args...)`, returning grid, block, dynamic shared memory, extra
  /// int64 kernel arguments (passed after the tensor pointers) and tensor maps
  /// (opforge/op_cuda.h); for a Triton kernel `opforge::TritonLaunch fn(args...)`, returning the
  /// grid in programs, launch options and values of the function's parameters by name.
  template <class F>
  OpBuilder launch_grid(F* fn) && {
    constexpr bool cuda = std::is_same_v<F, detail::LaunchConfig(detail::KernelType<Sig>...)>;
    constexpr bool triton = std::is_same_v<F, detail::TritonLaunch(detail::KernelType<Sig>...)>;
    static_assert(cuda || triton,
                  "opforge: a grid function must be `opforge::LaunchConfig fn(args...)` (a .cuda_source() or "
                  ".cuda_binary() kernel) or `opforge::TritonLaunch fn(args...)` (a .triton_source() kernel) taking "
                  "the declared inputs, parameters and outputs in declaration order");
    detail::LaunchRule r;
    r.kind = detail::LaunchRule::kGrid;
    if constexpr (cuda) {
      r.grid_entry = &detail::GridEntry<detail::LaunchConfig, Sig...>::run;
    } else {
      r.triton_grid_entry = &detail::GridEntry<detail::TritonLaunch, Sig...>::run;
    }
    r.grid_fn = reinterpret_cast<const void*>(fn);
    return std::move(*this).launch(std::move(r));
  }

  /// \private Hands the finished declaration to the registry (used by OPFORGE_OP).
  std::unique_ptr<detail::OpDef> release() && { return std::move(def_); }

 private:
  template <bool, class...>
  friend class OpBuilder;

  template <class T, class... C>
  OpBuilder<false, Sig..., typename detail::ParamTraits<T>::arg_type> add_param(std::string name,
                                                                                detail::ParamDefault dflt,
                                                                                const C&... constraints) && {
    static_assert(!HasOutputs, "opforge: declare every .input() and .param() before the first .output()");
    detail::ParamDecl& p = def_->add_arg(std::move(name), detail::ParamTraits<T>::kind).param;
    p.default_value = std::move(dflt);
    (detail::apply(p, constraints), ...);
    return OpBuilder<false, Sig..., typename detail::ParamTraits<T>::arg_type>(std::move(def_));
  }

  OpBuilder<true, Sig..., MutableTensor> outputs_declared() && {
    return OpBuilder<true, Sig..., MutableTensor>(std::move(def_));
  }

  template <class F>
  OpforgeKernel make_kernel(OpforgeDeviceType device, F* fn) {
    using E = detail::EntryFor<F, Sig...>;
    static_assert(E::ok,
                  "opforge: a kernel must be `void fn([const opforge::Context&,] args...)` where args are the "
                  "declared inputs (opforge::Tensor; opforge::MutableTensor for an opforge::mutated one), "
                  "parameters (int64_t, double, bool, std::string_view, std::span<const int64_t>, "
                  "std::span<const double>) and outputs (opforge::MutableTensor), in declaration order");
    OpforgeKernel k{};
    k.struct_size = sizeof(OpforgeKernel);
    k.device_type = device;
    k.fn = &detail::Entry<E::with_context, Sig...>::run;
    k.user = reinterpret_cast<const void*>(fn);
    return k;
  }

  std::unique_ptr<detail::OpDef> def_;
};

namespace detail {
inline OpBuilder<false> make_op(const char* ns, const char* name, const char* file, int line) {
  return OpBuilder<false>(std::make_unique<OpDef>(ns, name, file, line));
}

struct Registration {
  template <bool HasOutputs, class... S>
  Registration(OpBuilder<HasOutputs, S...>&& b) {  // NOLINT: implicit by design
    static_assert(HasOutputs || (std::is_same_v<S, MutatedInput> || ...),
                  "opforge: an op declares at least one .output() or opforge::mutated input (what it writes)");
    registry().add(std::move(b).release());
  }
};
}  // namespace detail

}  // namespace opforge

/// Declares the op `ns::name` in the enclosing op library; follow it with the builder chain
/// (see this file's comment) and a semicolon. At namespace scope only.
#define OPFORGE_OP(ns, name)                                                                               \
  [[maybe_unused]] static const ::opforge::detail::Registration OPFORGE_CONCAT(opforge_op_, __COUNTER__) = \
      ::opforge::detail::make_op(#ns, #name, __FILE__, __LINE__)
