// opforge/op.h -- describe an operator once; every framework adapter derives the rest.
//
// The one header an op file includes. It pulls in no framework and no CUDA header.
//
//   #include <opforge/op.h>
//
//   void softshrink_cpu(opforge::Tensor x, double lambd, opforge::MutableTensor y);
//   void softshrink_cuda(const opforge::Context& ctx, opforge::Tensor x, double lambd,
//                        opforge::MutableTensor y);  // in softshrink.cu
//
//   OPFORGE_OP(examples, softshrink)
//       .doc("x - lambd where x > lambd, x + lambd where x < -lambd, else 0")
//       .input("x", opforge::floating)
//       .param<double>("lambd", 0.5, opforge::at_least(0.0))
//       .output("y", opforge::like("x"))
//       .reference(softshrink_cpu)
//       .cuda(softshrink_cuda);
//
// Loaded through the torch adapter this becomes `torch.ops.examples.softshrink(Tensor x,
// float lambd=0.5) -> Tensor` with CPU, CUDA and Meta kernels, checked inputs, and support for
// torch.compile, torch.export and AOTInductor.
//
// The declaration is ordered and typed: inputs and parameters in schema order, then outputs.
// Kernels take exactly those arguments in that order -- opforge::Tensor for an input
// (opforge::MutableTensor for an opforge::mutated one), the C++ type of each parameter (see
// below), opforge::MutableTensor for an output -- optionally preceded by
// `const opforge::Context&`; a mismatch is a compile error that says so.
//
//   .param<T>    passed to kernels as   schema type
//   int64_t      int64_t                int
//   double       double                 float
//   bool         bool                   bool
//   std::string  std::string_view       str
//   std::vector<int64_t>  std::span<const int64_t>   int[]
//   std::vector<double>   std::span<const double>    float[]
//
// An int64_t parameter that a shape rule, value domain or .require() reads is a size: its schema
// type is SymInt, so torch.compile and torch.export keep a value derived from a dynamic dim
// symbolic (see opforge::int_param).
//
// Note [Run-time kernels]
// -----------------------
// `.cuda_source("softshrink.cu", "softshrink<{T}>").launch(opforge::elementwise("y"))` names a
// CUDA source that is not compiled with the library: it ships in the library's kernel folder
// (lib<name>.kernels/ beside lib<name>.so; opforge_add_library(... KERNELS ...) links it there)
// and is compiled by NVRTC for the GPU in use on first call, per instantiation: `{T}` becomes
// the first tensor input's CUDA type (float, double, __half, __nv_bfloat16, ...),
// `{T_<tensor>}` another tensor's, `{<param>}` the value of an opforge::compile_time parameter.
// The kernel receives the tensors' data pointers (inputs, then outputs), the launch rule's
// int64 values (elementwise: n; rows: rows, cols; grid: the LaunchConfig's args), a grid
// function's tensor maps (`const __grid_constant__ opforge::kernel::TensorMap`, for Hopper's
// bulk tensor copies: opforge::tensor_map and opforge/tma.cuh), then the
// other parameters with their declared C types (int64_t, double, bool); a kernel whose parameter
// list differs (an `int` for an int64_t, a pointer to another element type, a const pointer to an
// output, a missing parameter) is refused when it is compiled or loaded from the cache, naming
// each parameter (`void*` takes any tensor; extern "C" kernels carry no types and are not
// checked). An opforge::optional
// input keeps its place among the pointers and is a null pointer when the caller left it out,
// so the kernel tests `mask != nullptr` (an empty tensor that was given may have a null pointer
// too; pass its size through the grid function's args if that matters); a grid function gets
// it as an opforge::Tensor whose defined() is false. Binaries are cached
// on disk ($OPFORGE_CACHE_DIR/kernels, default ~/.cache/opforge/kernels) under a key made of
// the source text, the kernel name, the options, the architecture and the NVRTC version;
// entries carry their key and a checksum, are written atomically, and a damaged one is
// recompiled. An edited source is picked up by the next process, or in this process after
// opforge.reload(); the op's name and schema do not change. opforge.aoti.package compiles the
// instantiations a graph uses into the package (lib<name>.kernels/cache/) so a deployed model
// compiles nothing on its first inference. The source may `#include <opforge/kernel.cuh>`
// (device helpers), <opforge/tma.cuh> (mbarriers and bulk tensor copies), cuda_fp16.h and
// cuda_bf16.h.
//
// Note [Kernel dtypes]
// --------------------
// The CPU reference takes every dtype the declaration admits; a device kernel may take fewer,
// as PyTorch's flash attention takes only 16-bit inputs while its math fallback takes all:
// `.cuda_source(...).launch_grid(fn).kernel_dtypes("q", opforge::half_precision)`. A call on
// that device with another dtype of `q` is refused before any launch as any other invalid
// argument ("q: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no
// other), got float32"): in eager calls and when a compiled, exported or AOTInductor graph runs
// (tracing runs the Meta kernel on meta tensors, which do not say which device they stand for,
// so a trace is not refused). opforge verify and ahead-of-time compiles of run-time kernels use
// only the combinations the kernel takes; the reference keeps the others (float64 for gradcheck).
// `input` must be a required tensor input, named once per kernel.
//
// Note [Backward ops]
// -------------------
// `.backward("softshrink_backward")` names another op of the same library (declared like any
// other, usually in the same file) that computes this op's input gradients. The torch adapter
// runs it from the op's Autograd kernel, so `loss.backward()`, torch.autograd.grad and
// torch.compile's backward graph use it. The two ops meet by argument names, as in PyTorch's
// derivatives.yaml:
//   - each input of the backward op is `grad_<output>`, the gradient of one of this op's
//     outputs (zeros when that output did not reach the loss), or has the name (and type) of
//     one of this op's inputs, parameters or outputs, whose value is saved for it; an output
//     whose gradient the backward op does not take is not differentiable (torch's
//     `output_differentiability: False`, as the logsumexp of _scaled_dot_product_flash_attention):
//     autograd records no history for it and JAX stops its cotangent, so a loss through it alone
//     raises in torch rather than losing its gradient (examples::attention's lse);
//   - each output of the backward op is `grad_<input>`, the gradient of one of this op's tensor
//     inputs, with that input's shape and dtype (checked when it runs), or `grad_<a>_and_<b>`
//     (any number of `_and_`), one gradient of several inputs that is given to each of them, as
//     torch's AddBackward does (x and residual of a residual add: the kernel writes it once;
//     a name that reads two ways, as with inputs a, b and a_and_b, is refused at load);
//     optional inputs left out get none, and an input without one that needs a gradient raises
//     NotImplementedError, as torch's own ops do ("the derivative ... is not implemented").
// A backward op takes at least one gradient and writes none of its inputs (no opforge::mutated:
// they are the forward call's saved values and the caller's gradients). Loading checks these rules and, on a mismatch,
// raises naming each argument and what it may be called, and registers nothing. The backward op is an op of its own:
// CPU reference, device kernels, verify and sanitize apply to it as to any op, and it may name a backward op in turn
// (double backward; without one, a second derivative raises "derivative for ... is not
// implemented" when it is taken). Forward-mode AD (jvp, jacfwd) and compiled autograd are not
// supported. An op that names no backward op is forward only, as torch's own ops without a
// derivative formula: a backward that must pass a gradient through it into an input that
// requires grad raises "derivative for ns::op is not implemented" (eager, and torch.compile of a
// call that needs it), while calls under no_grad or inference_mode, or whose inputs do not
// require grad, are free.
//
// Note [Mutated inputs]
// ---------------------
// `.input("residual", opforge::same_dtype("x"), opforge::mutated)` declares an input the kernel
// writes in place (read or not): the schema says `Tensor(a!) residual` (letters a, b, ... in
// declaration order), the reference and every kernel take it as an opforge::MutableTensor, and
// it is not returned. An op may write only its inputs (`-> ()`, at least one mutated input) or
// also have fresh outputs. Under torch.compile and torch.export such ops are functionalised
// (auto_functionalized) and Inductor writes into the caller's buffers again, so compiled and
// AOTInductor code mutates in place as eager does.
//
// Mutation and the dense-copy rule: an input that is not declared opforge::strided reaches a
// kernel dense and 16-byte aligned, which the adapter arranges by copying a view that is not.
// A mutated input is never copied, since the kernel's writes into a copy would be lost: an
// opforge::strided one is passed as it is, any other must already have the layout its rule
// asks for (dense and 16-byte aligned, or with opforge::contiguous_last_dim rows of adjacent
// elements at 16-byte aligned strides), and a call that passes another layout is refused
// before any launch with an error that names the layout it needs. A mutated input whose
// elements overlap in memory (an expanded view, stride 0) is refused in every layout, and so is
// one that shares memory with another tensor argument (the same tensor twice, overlapping
// slices of one: as ATen's assert_no_overlap, for dense views), whose result would depend on
// the kernel's order of reads and writes.
// An op with mutated inputs may name a backward op (Note [Backward ops]); the backward op sees
// each mutated input `x` as a result `x_out`, its value after the op: `grad_x_out` is its
// gradient, `x_out` the value itself (the value before is overwritten, so the backward op
// cannot name `x`), and its output `grad_x` is the gradient of x as given. As torch's in-place
// ops: a write into a leaf that requires grad is refused, and a tensor that was saved for a
// backward and then written makes that backward raise. Without a backward op, a backward
// through such an op raises "derivative for ns::op is not implemented".
//
// Note [Value domains]
// --------------------
// An integer input that indexes something (positions into a table, slots of a cache) declares
// which values it takes: `.input("slots", opforge::kInt64, opforge::rank(1),
// opforge::values_in(0, opforge::dim("cache", 0) * opforge::dim("cache", 1)).unique_values()
// .or_value(-1))`. opforge verify draws such inputs inside their domain (a correct kernel is
// never fed an index it cannot take, and a wrong one is caught within it), and the CPU kernel
// of a call checks them before the reference runs (on the host the check is cheap, and an
// out-of-range index would read outside the table); device calls are not checked, as reading
// the values would cost a synchronisation.
//
// Note [Data-dependent sizes]
// ---------------------------
// An output whose length only the kernel knows (a compaction, as torch.nonzero and
// masked_select) declares its first dim `opforge::size_of("count", bound)`: `count` is a 0-dim
// int64 output of the same op that the kernel writes, `bound` the most it may be. Kernels get the
// output with `bound` rows; the call reads `count` (on a GPU a synchronisation, as nonzero's),
// checks it is in [0, bound] (a kernel that reports more raises, naming both outputs) and returns
// the first `count` rows. Under torch.compile and torch.export the size is an unbacked symbol
// (u0): the torch adapter registers a fake kernel that creates it and has the core evaluate the
// op's other rules with it. A rule of any opforge op over an unbacked size (a same_shape, a
// shape rule, a .require) is not turned into one of torch's deferred assertions, which would
// fail with only "Runtime assertion failed for expression Eq(u0, s1)": the op's own check runs
// when the graph runs (eager, compiled, exported, AOTInductor) and names the op and the
// argument. Such an op has no out= overload and names no backward op.
//
// Note [Custom classes]
// ---------------------
// State kept between calls -- packed or quantised weights, a table, a configuration -- is a
// custom class, declared beside the ops that use it:
//
//   OPFORGE_CLASS(examples, Int8Linear)
//       .doc("y = x W^T + b with W stored as int8 per output channel")
//       .constructor("int8_linear_pack")  // (Tensor weight, Tensor? bias) -> (qweight, scales)
//       .method("forward", "int8_linear");  // (Tensor x, Tensor qweight, Tensor scales, Tensor? bias)
//
// With a constructor op, the class's `__init__` takes that op's arguments, runs it, and the
// object keeps its outputs, then those of its arguments that a method takes (bias above); with
// `.field<T>(name)` declarations instead (parameter types of .param<T>), `__init__` takes those
// fields and the object keeps them as given. A method runs its op with the object's fields as
// the op's arguments of the same names, and the caller's arguments as the op's other ones, in
// order: `forward(Tensor x) -> Tensor` above. Methods are ops like any other (checks before any
// launch, CPU reference, CUDA kernels, verify, backward ops); errors raised in a method name the
// class and method. A declared field's value is checked at construction against the parameter
// constraints of every method op that takes it.
//
// Loaded through the torch adapter this becomes the torchbind class `torch.classes.examples.
// Int8Linear`: fields readable as attributes, `__getstate__`/`__setstate__` (torch.save and
// torch.load of a module holding an instance, in a process that loaded the library), and
// `__obj_flatten__` with a fake class registered for it, so torch.compile(fullgraph=True),
// torch.export and AOTInductor packages trace modules that hold an instance (the package
// carries the object; the C++ runner loads the library that defines the class first).
// Load errors: a constructor or method op that is missing, a method op argument named after a
// field with another type, a method op that writes a field, method names twice or reserved.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "opforge/detail/op_detail.h"
#include "opforge/dtype.h"
#include "opforge/error.h"
#include "opforge/expr.h"
#include "opforge/tensor.h"

namespace opforge {

// ---- input constraints ----------------------------------------------------------------------

/// The input's dtype must equal that of the earlier tensor input `tensor`; `| opforge::kFloat32`
/// (or any dtype set) also accepts those dtypes whatever that input's, e.g. a norm weight kept in
/// float32 beside 16-bit activations: `opforge::same_dtype("x") | opforge::kFloat32`.
inline detail::SameDtype same_dtype(std::string tensor) { return {std::move(tensor)}; }
/// The input's shape must equal that of the earlier tensor input `tensor` (any rank).
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
/// The input's other constraints apply only when it is given. Nothing but output rules may refer
/// to it (not another input's same_dtype/same_shape/shape rule, a launch rule or a `{T_name}`
/// placeholder): an output whose rules read it (`like("key")`) exists only when it is given
/// (schema `Tensor?`, None otherwise). The first tensor input cannot be optional, and every input
/// and parameter declared after it needs a default (is optional, or has a default value).
inline constexpr detail::Optional optional{};
/// The elements of an integer input index something: each is in [low, high), expressions over
/// dims and integer parameters, e.g. token positions into a table of `cos_sin_cache.size(0)` rows:
/// `opforge::values_in(0, opforge::dim("cos_sin_cache", 0))`. Chain `.unique_values()` for
/// elements that must be distinct and `.or_value(-1)` for a marker outside the range. See Note
/// [Value domains].
inline detail::Values values_in(Expr low, Expr high) { return {std::move(low), std::move(high)}; }
/// The kernel writes this input in place (read it or not), as torch.library's `mutates_args`: the
/// schema says `Tensor(a!) name`, the reference and kernels take it as an opforge::MutableTensor,
/// and it is not among the op's returns. See Note [Mutated inputs].
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

// ---- sharding --------------------------------------------------------------------------------

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

// ---- automatic mixed precision ----------------------------------------------------------------

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

// ---- launch rules of run-time kernels -------------------------------------------------------

using detail::LaunchConfig;
using detail::TensorMap;

/// How a tensor map's box is laid out in shared memory: rows as they are, or with their 16-byte
/// chunks XOR-swizzled over spans of 32, 64 or 128 bytes (CU_TENSOR_MAP_SWIZZLE_*; the 128-byte
/// swizzle is the layout wgmma's descriptors of layout type 1 read).
enum class TensorMapSwizzle : int32_t { kNone = 0, k32B = 1, k64B = 2, k128B = 3 };

/// The tensor map of CUDA tensor `t` for a run-time kernel's bulk tensor copies (TMA: PTX's
/// cp.async.bulk.tensor), for a grid function to put in LaunchConfig::tensor_maps. The map's
/// dims are t's, innermost first (a [B, H, S, D] tensor gives coordinates (d, s, h, b)), with
/// t's strides, so a strided view is copied in place; `box` gives the box a copy moves, one
/// size (1 to 256) per dim, innermost first. Elements a box reads past a dim's end arrive as
/// zeros. The kernel takes the map as `const __grid_constant__ opforge::kernel::TensorMap`,
/// after the grid function's int64 args and before the op's parameters (Note [Run-time
/// kernels]), and copies through it with opforge/tma.cuh under `#if __CUDA_ARCH__ >= 900`.
/// Requires: rank 1 to 5; the last dim contiguous; t's data and its other strides 16-byte
/// aligned; the box's innermost bytes a multiple of 16, and at most the swizzle's span when
/// swizzled. Throws InvalidArgument naming what is off, InternalError where the CUDA driver
/// cannot encode the map (cuTensorMapEncodeTiled; it needs a CUDA 12 driver).
TensorMap tensor_map(const Tensor& t, std::initializer_list<uint32_t> box,
                     TensorMapSwizzle swizzle = TensorMapSwizzle::kNone);

/// The NVRTC target opforge compiles run-time kernels for on the CUDA device holding `t`:
/// "sm_90a" on a compute capability 9.0 GPU (an H100 or H200; NVRTC 12.0 or newer), "sm_XY"
/// machine code for other GPUs NVRTC knows, "compute_XY" PTX for newer ones; "" for a tensor on
/// the CPU. For grid functions of kernels that take another path on some architectures: code
/// under `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)` (wgmma, setmaxnreg) runs exactly when this
/// returns "sm_90a". Throws InternalError if the CUDA runtime or NVRTC cannot answer.
const std::string& kernel_target(const Tensor& t);

/// One thread per element of `tensor` (an input or output): the kernel receives the tensors'
/// pointers, then `int64_t n` (the element count), then the runtime parameters. Chain
/// `.items_per_thread(k)` or `.bytes_per_thread(16)` for vectorised kernels (each thread then
/// handles that many consecutive elements) and `.threads_per_block(t)` for the block size.
class Elementwise {
 public:
  explicit Elementwise(std::string tensor) {
    rule_.kind = detail::LaunchRule::kElementwise;
    rule_.tensor = std::move(tensor);
  }
  Elementwise items_per_thread(int32_t k) const {
    Elementwise e = *this;
    e.rule_.items_per_thread = k;
    return e;
  }
  Elementwise bytes_per_thread(int32_t b) const {
    Elementwise e = *this;
    e.rule_.bytes_per_thread = b;
    return e;
  }
  Elementwise threads_per_block(int32_t t) const {
    Elementwise e = *this;
    e.rule_.threads = t;
    return e;
  }
  operator detail::LaunchRule() const { return rule_; }  // NOLINT: implicit by design

 private:
  detail::LaunchRule rule_;
};
inline Elementwise elementwise(std::string tensor) { return Elementwise(std::move(tensor)); }

/// One block per row of `tensor` (rows = numel / size(-1)): the kernel receives the pointers,
/// then `int64_t rows, int64_t cols`, then the runtime parameters. `threads` is the block size
/// (a multiple of 32, at most 1024); 0 (the default) picks it per call from the row's bytes:
/// enough warps that each thread holds at most four 16-byte vectors of the row (see
/// opforge::kernel::RowRegisters), between 32 and 1024 threads.
inline detail::LaunchRule rows(std::string tensor, int32_t threads = 0) {
  detail::LaunchRule r;
  r.kind = detail::LaunchRule::kRows;
  r.tensor = std::move(tensor);
  r.threads = threads;
  return r;
}

namespace detail {
inline constexpr const char* kOrderMessage =
    "opforge: declare every .input() and .param() before the first .output(); kernels take them in that order";
}

/// Builds an op declaration; see the file comment. Each call returns a builder whose type
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
  /// the CPU reference against it (in float64) where no device kernel can be compared.
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

  /// The tolerance `opforge verify` compares this op's results in `dtype` with, against float64
  /// (|got - want| <= atol + rtol |want|), where the op's arithmetic is looser than the dtype's
  /// defaults (opforge.verify.TOLERANCES): the counterpart of toleranceOverride in torch's
  /// OpInfo tests. State the reason beside it (the rounding the kernels do, a published
  /// criterion). `dtype` must be floating, atol and rtol finite and >= 0, each dtype declared
  /// once; otherwise loading the library fails, naming the op.
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

  /// A tensor input. Constraints: a dtype set (`opforge::floating`, `opforge::kFloat16 |
  /// opforge::kBFloat16`), `same_dtype("x")` (`| kFloat32` for alternatives), `same_shape("x")`,
  /// `rank(n)`, `min_rank(n)`, `shape({...})` (`shape({opforge::leading_dims, ...})` for any
  /// number of leading dims), `strided`, `contiguous_last_dim`, `optional`, `mutated`,
  /// `values_in(lo, hi)`.
  template <class... C>
  auto input(std::string name, const C&... constraints) && {
    static_assert(!HasOutputs, "opforge: declare every .input() and .param() before the first .output()");
    static_assert((detail::TensorConstraint<C> && ...),
                  "opforge: .input() takes dtype sets, opforge::same_dtype, opforge::same_shape, opforge::rank, "
                  "opforge::min_rank, opforge::shape, opforge::strided, opforge::contiguous_last_dim, "
                  "opforge::optional, opforge::mutated and opforge::values_in as constraints");
    using Slot = std::conditional_t<(std::is_same_v<C, detail::Mutated> || ...), detail::MutatedInput, Tensor>;
    detail::TensorDecl& t = def_->add_arg(std::move(name), OPFORGE_ARG_TENSOR).tensor;
    (detail::apply(t, constraints), ...);
    return OpBuilder<false, Sig..., Slot>(std::move(def_));
  }

  // (clang-format 14 cannot lay out requires-clauses.)
  // clang-format off
  /// A required parameter of C++ type T (see the table in the file comment), with optional
  /// constraints `at_least`, `at_most`, `in_range`, `one_of`.
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

  /// An output with an explicit shape and the dtype of an input.
  OpBuilder<true, Sig..., MutableTensor> output(std::string name, const Shape& shape, const DtypeOf& dtype) && {
    detail::set_output(def_->add_output(std::move(name)), shape, dtype.tensor, -1);
    return std::move(*this).outputs_declared();
  }

  /// An output with an explicit shape and a fixed dtype.
  OpBuilder<true, Sig..., MutableTensor> output(std::string name, const Shape& shape, Dtype dtype) && {
    detail::set_output(def_->add_output(std::move(name)), shape, {}, static_cast<int32_t>(dtype));
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

  /// A CUDA kernel compiled at run time (see Note [Run-time kernels]): `file` is shipped in the
  /// library's kernel folder, `name` names the kernel, with `{T}` (the first tensor input's
  /// CUDA type), `{T_<tensor>}` and `{<param>}` (a compile_time parameter) filled in per call,
  /// e.g. "softshrink<{T}>". Follow with `.launch(rule)`.
  OpBuilder cuda_source(std::string file, std::string name) && {
    def_->add_cuda_source(std::move(file), std::move(name));
    return std::move(*this);
  }

  /// How the last `.cuda_source()` kernel is launched: opforge::elementwise("y") or
  /// opforge::rows("x"); see also launch_grid().
  OpBuilder launch(detail::LaunchRule rule) && {
    def_->set_launch(std::move(rule));
    return std::move(*this);
  }

  /// The dtypes the last declared device kernel (.cuda() or .cuda_source()) takes for tensor
  /// input `input`, where it covers fewer than the declaration admits (the CPU reference covers
  /// them all): `.kernel_dtypes("q", opforge::half_precision)`. See Note [Kernel dtypes].
  OpBuilder kernel_dtypes(std::string input, DtypeSet dtypes) && {
    def_->set_kernel_dtypes(std::move(input), dtypes.bits);
    return std::move(*this);
  }

  /// An explicit grid: `opforge::LaunchConfig fn(args...)` takes the op's arguments like a
  /// kernel does and returns grid, block, dynamic shared memory and extra int64 kernel
  /// arguments (passed after the tensor pointers).
  template <class F>
  OpBuilder launch_grid(F* fn) && {
    static_assert(std::is_same_v<F, detail::LaunchConfig(detail::KernelType<Sig>...)>,
                  "opforge: a grid function must be `opforge::LaunchConfig fn(args...)` taking the declared "
                  "inputs, parameters and outputs in declaration order");
    detail::LaunchRule r;
    r.kind = detail::LaunchRule::kGrid;
    r.grid_entry = &detail::GridEntry<Sig...>::run;
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

namespace opforge {

/// Builds a custom class declaration; see Note [Custom classes]. Produced by OPFORGE_CLASS.
class ClassBuilder {
 public:
  explicit ClassBuilder(std::unique_ptr<detail::ClassDef> def) : def_(std::move(def)) {}

  /// One-line description, shown in docs.
  ClassBuilder doc(std::string text) && {
    def_->doc = std::move(text);
    return std::move(*this);
  }

  /// A field that `__init__` takes and the object keeps as given, of C++ type T (the parameter
  /// types of OpBuilder::param). Not with .constructor().
  template <class T>
  ClassBuilder field(std::string name) && {
    def_->field_names.push_back(std::move(name));
    def_->field_kinds.push_back(detail::ParamTraits<T>::kind);
    return std::move(*this);
  }

  /// The op `__init__` runs ("name" in the class's namespace, or "ns::name"): `__init__` takes
  /// its arguments, and the object keeps its outputs and those of its arguments a method takes.
  ClassBuilder constructor(std::string op) && {
    def_->constructor = std::move(op);
    return std::move(*this);
  }

  /// A method `name` that runs `op` with the object's fields as its arguments of the same names.
  ClassBuilder method(std::string name, std::string op) && {
    def_->methods.emplace_back(std::move(name), std::move(op));
    return std::move(*this);
  }

  /// \private Hands the finished declaration to the registry (used by OPFORGE_CLASS).
  std::unique_ptr<detail::ClassDef> release() && { return std::move(def_); }

 private:
  std::unique_ptr<detail::ClassDef> def_;
};

namespace detail {
inline ClassBuilder make_class(const char* ns, const char* name, const char* file, int line) {
  return ClassBuilder(std::make_unique<ClassDef>(ns, name, file, line));
}
struct ClassRegistration {
  ClassRegistration(ClassBuilder&& b) { registry().add(std::move(b).release()); }  // NOLINT: implicit by design
};
}  // namespace detail

}  // namespace opforge

#define OPFORGE_CONCAT_INNER(a, b) a##b
#define OPFORGE_CONCAT(a, b) OPFORGE_CONCAT_INNER(a, b)

/// Declares the op `ns::name` in the enclosing op library; follow it with the builder chain
/// (see the file comment) and a semicolon. At namespace scope only.
#define OPFORGE_OP(ns, name)                                                                               \
  [[maybe_unused]] static const ::opforge::detail::Registration OPFORGE_CONCAT(opforge_op_, __COUNTER__) = \
      ::opforge::detail::make_op(#ns, #name, __FILE__, __LINE__)

/// Declares the custom class `ns::Name` in the enclosing op library (Note [Custom classes]);
/// follow it with the builder chain and a semicolon. At namespace scope only.
#define OPFORGE_CLASS(ns, name)                                                                                    \
  [[maybe_unused]] static const ::opforge::detail::ClassRegistration OPFORGE_CONCAT(opforge_class_, __COUNTER__) = \
      ::opforge::detail::make_class(#ns, #name, __FILE__, __LINE__)
