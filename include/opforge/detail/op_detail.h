// opforge/detail/op_detail.h -- the record an op declaration builds, the kernel entry
// trampolines and the compile-time signature checks. Not for op authors; see opforge/op.h.
#pragma once

#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "opforge/c_api.h"
#include "opforge/dtype.h"
#include "opforge/error.h"
#include "opforge/expr.h"
#include "opforge/tensor.h"

#define OPFORGE_CONCAT_INNER(a, b) a##b
#define OPFORGE_CONCAT(a, b) OPFORGE_CONCAT_INNER(a, b)

#if defined(_WIN32)
#define OPFORGE_HIDDEN
#else
#define OPFORGE_HIDDEN __attribute__((visibility("hidden")))
#endif

namespace opforge::detail {

/// A dtype rule that holds where parameter `param` has `value` (opforge::when).
struct DtypeCaseDecl {
  std::string param, value;  // value: as the parameter's choices spell it
  DtypeSet dtypes{0xffffffffu >> (32 - OPFORGE_NUM_DTYPES)};
  std::string dtype_like;
  DtypeSet dtype_alternatives;
};

/// A shape rule that holds where parameter `param` has `value` (opforge::when with a shape).
struct ShapeCaseDecl {
  std::string param, value;  // value: as the parameter's choices spell it
  std::vector<Expr> shape;
};

/// Constraints of a tensor input, by name (resolved to indices by OpDef::finalize).
struct TensorDecl {
  DtypeSet dtypes{0xffffffffu >> (32 - OPFORGE_NUM_DTYPES)};
  std::string dtype_like;
  DtypeSet dtype_alternatives;  // with dtype_like: accepted besides that tensor's dtype
  std::string shape_like;
  int32_t min_rank = -1, max_rank = -1;
  bool has_shape = false;
  std::vector<Expr> shape;
  int32_t layout = OPFORGE_LAYOUT_CONTIGUOUS;
  bool optional = false;
  bool mutated = false;
  bool has_values = false;  // opforge::values_in
  Expr values_low, values_high;
  bool values_unique = false, has_sentinel = false;
  int64_t sentinel = 0;
  std::vector<DtypeCaseDecl> dtype_cases;  // opforge::when(...).otherwise(...)
  std::vector<ShapeCaseDecl> shape_cases;  // opforge::when(..., shape({...})).otherwise(...)
};

using ParamDefault =
    std::variant<std::monostate, int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>>;

struct ParamDecl {
  ParamDefault default_value;
  bool has_min = false, has_max = false;
  double min = 0, max = 0;
  std::vector<std::string> choices;
  bool integer_choices = false;
  bool compile_time = false;
};

struct ArgDecl {
  std::string name;
  OpforgeArgKind kind;
  TensorDecl tensor;
  ParamDecl param;
};

struct OutputDecl {
  std::string name;
  std::string dtype_like;  // empty: fixed `dtype`
  int32_t dtype = -1;
  std::string shape_like;  // empty: explicit `dims`
  std::vector<int32_t> dim_index;
  std::vector<Expr> dims;
  std::vector<ShapeCaseDecl> shape_cases;  // opforge::when(..., shape({...})).otherwise(...)
  std::vector<DtypeCaseDecl> dtype_cases;  // opforge::when(..., dtype).otherwise(...)
};

/// Fills an output declared `like(rule.tensor)` (with its dtype and dim overrides).
void set_output(OutputDecl& o, const Like& rule);

/// An encoded tensor map of the tensor-memory accelerator (CUDA's CUtensorMap: 128 opaque
/// bytes, 128-byte aligned), made by opforge::tensor_map (opforge/op_cuda.h) for a run-time
/// kernel's bulk tensor copies. All zeros (the default) is no map: a kernel path that copies
/// nothing through it may be passed one.
struct TensorMap {
  alignas(128) unsigned char bytes[128] = {};
};

/// Grid and block of a kernel launch, extra int64 kernel arguments and tensor maps; returned by
/// a grid function (OpBuilder::launch_grid).
struct LaunchConfig {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {256, 1, 1};
  unsigned shared_bytes = 0;
  std::vector<int64_t> args;
  std::vector<TensorMap> tensor_maps;
};

/// What the grid function of a Triton kernel returns (Note [Triton kernels] in
/// opforge/op_launch.h): the grid in programs, Triton's launch options, and values for the
/// function's parameters by name. Names are string literals (kept as pointers, not copied: the
/// grid function runs on every call).
struct TritonLaunch {
  /// One value for a parameter of the Triton function, by name.
  struct Value {
    enum Kind : int32_t {
      kInt,
      kFloat,
      kBool,
      kConstInt,
      kConstFloat,
      kConstBool,
      kConstDtype,
      kTensor,
      kPartials,
      kCopy
    };
    const char* name = nullptr;
    Kind kind = kInt;
    int64_t i = 0;           // kInt, kConstInt, kConstBool, kBool; kConstDtype: the OpforgeDtype; kPartials: rows
    double f = 0;            // kFloat, kConstFloat
    OpforgeTensor tensor{};  // kTensor: the tensor the pointer points to; kPartials: the output summed into;
                             // kCopy: the output copied into
    OpforgeTensor from{};    // kCopy: the input copied from
  };
  /// Programs in x, y and z (Triton's grid). Where `grid_per[d]` names a tl.constexpr parameter,
  /// dim d is grid[d] divided by that parameter's value, rounded up (the value an autotune config
  /// chose: Triton's `lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)`).
  int64_t grid[3] = {1, 1, 1};
  const char* grid_per[3] = {nullptr, nullptr, nullptr};
  /// Triton's launch options (an autotune config's replace them).
  int32_t num_warps = 4;
  int32_t num_stages = 3;
  std::vector<Value> values;

  /// A runtime (not tl.constexpr) parameter: an integer (i32 or i64 by its value, as Triton's
  /// launcher types it), a floating-point value (fp32) or a bool.
  template <class T>
  TritonLaunch& set(const char* name, T value) {
    static_assert(std::is_arithmetic_v<T>,
                  "opforge: TritonLaunch::set takes an integer, a floating-point value or a bool");
    Value v;
    v.name = name;
    if constexpr (std::is_same_v<T, bool>) {
      v.kind = Value::kBool;
      v.i = value;
    } else if constexpr (std::is_integral_v<T>) {
      v.kind = Value::kInt;
      v.i = static_cast<int64_t>(value);
    } else {
      v.kind = Value::kFloat;
      v.f = static_cast<double>(value);
    }
    values.push_back(v);
    return *this;
  }
  /// A tl.constexpr parameter: an integer, floating-point value, bool, or a dtype (a tl.dtype
  /// such as tl.bfloat16: `constant("X_dtype", x.dtype())`). Each value compiles its own kernel.
  template <class T>
  TritonLaunch& constant(const char* name, T value) {
    Value v;
    v.name = name;
    if constexpr (std::is_same_v<T, Dtype>) {
      v.kind = Value::kConstDtype;
      v.i = static_cast<int32_t>(value);
    } else if constexpr (std::is_same_v<T, bool>) {
      v.kind = Value::kConstBool;
      v.i = value;
    } else if constexpr (std::is_integral_v<T>) {
      v.kind = Value::kConstInt;
      v.i = static_cast<int64_t>(value);
    } else {
      static_assert(std::is_floating_point_v<T>, "opforge: TritonLaunch::constant takes a number, a bool or a Dtype");
      v.kind = Value::kConstFloat;
      v.f = static_cast<double>(value);
    }
    values.push_back(v);
    return *this;
  }
  /// A pointer parameter whose name is not that of the tensor it points to (`dY_ptr` for grad_y).
  TritonLaunch& tensor(const char* name, const Tensor& t) { return bind(name, Value::kTensor, t, 0); }
  /// A pointer parameter the kernel writes `rows` rows of partial results through, one row of
  /// out.numel() float32 values per program (as Liger's RMSNorm backward writes dW), which opforge
  /// then sums over the rows into `out` (in out's dtype) after the kernel: scratch memory from the
  /// call's allocator, of rows x out.numel() float32 values, row-major.
  TritonLaunch& sum_into(const char* name, const Tensor& out, int64_t rows) {
    return bind(name, Value::kPartials, out, rows);
  }
  /// Before the kernel, `out` (an output) gets a copy of `from` (an input of the same shape and
  /// dtype): for a kernel that computes in place through one pointer (Liger's SwiGLU backward reads
  /// a and b and writes their gradients over them), bound to the output, so the op writes none of
  /// its inputs. Both must be dense (outputs are; declare the input without opforge::strided).
  TritonLaunch& copy(const Tensor& from, const Tensor& out) {
    Value v;
    v.kind = Value::kCopy;
    v.tensor = out.c_tensor();
    v.from = from.c_tensor();
    values.push_back(v);
    return *this;
  }

 private:
  TritonLaunch& bind(const char* name, Value::Kind kind, const Tensor& t, int64_t rows) {
    Value v;
    v.name = name;
    v.kind = kind;
    v.tensor = t.c_tensor();
    v.i = rows;
    values.push_back(v);
    return *this;
  }
};

/// How a run-time kernel is launched (opforge::elementwise, opforge::rows or a grid function
/// given to OpBuilder::launch_grid).
struct LaunchRule {
  enum Kind { kNone, kElementwise, kRows, kGrid } kind = kNone;
  std::string tensor;  // elementwise, rows: the tensor whose shape sets the grid
  int32_t items_per_thread = 1;
  int32_t bytes_per_thread = 0;  // > 0: items per thread = bytes / element size
  int32_t threads = 256;
  LaunchConfig (*grid_entry)(const OpforgeCallFrame*, const void*) = nullptr;
  TritonLaunch (*triton_grid_entry)(const OpforgeCallFrame*, const void*) = nullptr;  // a Triton kernel's
  const void* grid_fn = nullptr;
};

struct OpDef;

/// A CUDA kernel loaded at run time from a file shipped beside the op library: CUDA C++ (NVRTC),
/// a Triton function, or a prebuilt cubin, fatbin or PTX file.
struct RuntimeKernel {
  enum Backend { kNvrtc = OPFORGE_BACKEND_NVRTC, kTriton = OPFORGE_BACKEND_TRITON, kBinary = OPFORGE_BACKEND_BINARY };
  const OpDef* def = nullptr;
  Backend backend = kNvrtc;
  std::string file;  // relative to the library's kernel folder
  std::string name;  // NVRTC: a name template, e.g. "softshrink<{T}>"; Triton: the function's name;
                     // binary: the kernel's symbol, e.g. "scale_{T}"
  LaunchRule rule;
  bool waits_for_value_checks = false;  // .waits_for_value_checks(): launched as the value check's dependent
  bool checks_values = false;           // .checks_values_in_kernel(): takes the value domains, no check launched
  // Resolved by OpDef::finalize:
  int32_t rule_tensor = -1;  // argument index, or num_args + output index
};

/// Kernel entry and ahead-of-time compile entry of run-time kernels on CUDA (src/oplib/rtc_cuda.cpp).
int32_t rtc_launch(const OpforgeCallFrame* frame, const void* user);
int32_t rtc_precompile(OpforgePrecompileRequest* request, const void* user);
/// Forgets every compiled run-time kernel of this library (OpforgeLibrary::reload).
void rtc_reload();
/// The folder this library's run-time kernel sources are read from: beside the shared object,
/// `lib<name>.kernels/` (absolute; empty if it cannot be determined). src/oplib/runtime_kernel.cpp.
const std::string& kernel_dir();

/// Everything one OPFORGE_OP declaration says, plus the C ABI view built from it.
struct OpDef {
  std::string ns, name, doc, file, equivalent;
  std::string backward;  // "ns::name" of the backward op, or empty
  int32_t line = 0;
  int32_t sharding = -1;                     // OpforgeSharding; -1: derived from the run-time kernel's launch rule
  std::vector<int32_t> sharding_dims;        // OPFORGE_SHARDING_DIMS
  int32_t autocast = OPFORGE_AUTOCAST_NONE;  // OpforgeAutocast
  std::vector<OpforgeTolerance> tolerances;  // .tolerance(...)
  double tolerance_vs_equivalent = 0;        // .tolerance_vs_equivalent(...); 0: none
  std::vector<ArgDecl> args;
  std::vector<OutputDecl> outputs;
  std::vector<Condition> rules;        // .require(...)
  std::vector<OpforgeKernel> kernels;  // kernels[0]: the CPU reference (fn null until .reference())
  bool kernels_declared = false;       // a .reference() or .cuda() came already
  bool output_after_kernel = false;    // an .output() came after one (kernels take outputs: refused)
  std::vector<std::unique_ptr<RuntimeKernel>> runtime_kernels;
  bool launch_without_source = false;
  bool waits_without_cuda_source = false;   // .waits_for_value_checks() follows no .cuda_source()/.cuda_binary()
  bool checks_without_cuda_source = false;  // .checks_values_in_kernel() follows no .cuda_source()/.cuda_binary()
  /// .kernel_dtypes() declarations: the device kernel (index into kernels) they follow, -1 if
  /// none came before; resolved into OpforgeKernel::dtype_arg and dtypes by finalize.
  struct KernelDtypes {
    int32_t kernel = -1;
    std::string input;
    uint32_t dtypes = 0;
  };
  std::vector<KernelDtypes> kernel_dtypes;

  // The builder's steps (opforge::OpBuilder), out of line in src/oplib/op_library.cpp so that
  // an op file compiles only the typed shell of its builder chain.
  OpDef(const char* ns, const char* name, const char* file, int line);
  ~OpDef();
  OpDef(const OpDef&) = delete;
  OpDef& operator=(const OpDef&) = delete;
  /// Appends a declared input or parameter and returns it, for its constraints to be applied.
  ArgDecl& add_arg(std::string name, OpforgeArgKind kind);
  /// Appends a declared output (with only its name set) and returns it.
  OutputDecl& add_output(std::string name);
  void set_doc(std::string text);
  void set_equivalent(std::string python_expression);
  void set_backward(std::string op);
  void add_rule(Condition rule);
  void set_sharding(int32_t sharding, std::vector<int32_t> dims);
  /// Sets the CPU reference (kernels[0]) or appends a device kernel.
  void add_kernel(const OpforgeKernel& kernel, bool reference);
  /// Appends a run-time kernel of `backend` and its CUDA kernel record, launched by `launch`
  /// and compiled ahead of time by `precompile`, and adds the backend's `reload` to the
  /// library's; the backends' builder steps below call it.
  void add_runtime_kernel(RuntimeKernel::Backend backend, std::string file, std::string name, OpforgeKernelFn launch,
                          OpforgePrecompileFn precompile, void (*reload)());
  void add_cuda_source(std::string file, std::string name);
  /// OpBuilder::triton_source's step (src/oplib/triton.cpp).
  void add_triton_source(std::string file, std::string function);
  /// OpBuilder::cuda_binary's step (src/oplib/binary_cuda.cpp).
  void add_cuda_binary(std::string file, std::string symbol);
  void set_launch(LaunchRule rule);
  void set_kernel_dtypes(std::string input, uint32_t dtypes);
  void set_waits_for_value_checks();
  void set_checks_values_in_kernel();

  /// Resolves names and builds the C ABI structs; returns what kept a record from saying what
  /// was declared (each one line, with this declaration's file:line). The records' meaning is
  /// checked at load (src/core/declaration_checks.h). Defined in src/oplib/op_library.cpp.
  std::vector<std::string> finalize();
  const OpforgeOpSpec* spec() const { return &spec_; }

  struct Storage;  // owns every array the C ABI structs point into
  std::shared_ptr<Storage> storage_;
  OpforgeOpSpec spec_{};
};

/// Everything one OPFORGE_CLASS declaration says, plus the C ABI view built from it.
struct ClassDef {
  std::string ns, name, doc, file, constructor;
  int32_t line = 0;
  std::vector<std::string> field_names;
  std::vector<int32_t> field_kinds;
  std::vector<std::pair<std::string, std::string>> methods;  // (method, op)

  ClassDef(const char* ns, const char* name, const char* file, int line);
  /// Builds the C ABI struct, whose meaning is checked at load (src/core/declaration_checks.h).
  /// Defined in src/oplib/op_library.cpp.
  void finalize();
  const OpforgeClassSpec* spec() const { return &spec_; }

 private:
  std::vector<const char*> field_name_ptrs_;
  std::vector<OpforgeMethodSpec> method_specs_;
  OpforgeClassSpec spec_{};
};

/// The op library's own list of ops (hidden visibility: one per shared object).
class OPFORGE_HIDDEN Registry {
 public:
  void add(std::unique_ptr<OpDef> def);
  void add(std::unique_ptr<ClassDef> def);
  const OpforgeLibrary* library();
  /// Adds a backend's reload to the library's OpforgeLibrary::reload, by the first run-time
  /// kernel of that backend declared (so a library without one never references its compiler).
  void add_reload(void (*reload)()) {
    for (auto*& r : reloads_)
      if (r == reload || r == nullptr) {
        r = reload;
        return;
      }
  }
  /// Runs every backend's reload (OpforgeLibrary::reload).
  static void reload_all();

 private:
  void (*reloads_[4])() = {};
  std::vector<std::unique_ptr<OpDef>> defs_;
  std::vector<const OpforgeOpSpec*> specs_;
  std::vector<std::unique_ptr<ClassDef>> class_defs_;
  std::vector<const OpforgeClassSpec*> class_specs_;
  std::string errors_;
  OpforgeLibrary lib_{};
  bool built_ = false;
};
OPFORGE_HIDDEN Registry& registry();

// ---- parameter types ----------------------------------------------------------------------

/// How a declared parameter type is passed to kernels, and its ABI kind.
template <class T>
struct ParamTraits {
  static_assert(sizeof(T) == 0,
                "opforge: .param<T>() takes int64_t, double, bool, std::string, std::vector<int64_t> or "
                "std::vector<double> (use int64_t for integers and double for floating point)");
};
template <>
struct ParamTraits<int64_t> {
  using arg_type = int64_t;
  static constexpr OpforgeArgKind kind = OPFORGE_ARG_INT;
  static arg_type from(const OpforgeValue& v) { return v.i; }
};
template <>
struct ParamTraits<double> {
  using arg_type = double;
  static constexpr OpforgeArgKind kind = OPFORGE_ARG_FLOAT;
  static arg_type from(const OpforgeValue& v) { return v.f; }
};
template <>
struct ParamTraits<bool> {
  using arg_type = bool;
  static constexpr OpforgeArgKind kind = OPFORGE_ARG_BOOL;
  static arg_type from(const OpforgeValue& v) { return v.i != 0; }
};
template <>
struct ParamTraits<std::string> {
  using arg_type = std::string_view;
  static constexpr OpforgeArgKind kind = OPFORGE_ARG_STRING;
  static arg_type from(const OpforgeValue& v) { return {v.s, v.len}; }
};
template <>
struct ParamTraits<std::vector<int64_t>> {
  using arg_type = std::span<const int64_t>;
  static constexpr OpforgeArgKind kind = OPFORGE_ARG_INT_LIST;
  static arg_type from(const OpforgeValue& v) { return {v.ints, v.len}; }
};
template <>
struct ParamTraits<std::vector<double>> {
  using arg_type = std::span<const double>;
  static constexpr OpforgeArgKind kind = OPFORGE_ARG_FLOAT_LIST;
  static arg_type from(const OpforgeValue& v) { return {v.floats, v.len}; }
};

// ---- constraints ----------------------------------------------------------------------------

struct SameDtype {
  std::string tensor;
  DtypeSet alternatives;  // accepted besides the dtype of `tensor`
};
/// `same_dtype("x") | opforge::kFloat32`: x's dtype, or any of these.
inline SameDtype operator|(SameDtype s, DtypeSet alternatives) {
  s.alternatives = s.alternatives | alternatives;
  return s;
}
inline SameDtype operator|(SameDtype s, Dtype alternative) { return std::move(s) | DtypeSet(alternative); }
struct SameShape {
  std::string tensor;
};
struct RankRange {
  int32_t min, max;
};
struct Strided {};
struct ContiguousLastDim {};
struct Optional {};
struct Mutated {};
/// opforge::values_in(low, high), optionally .unique() and .or_value(v).
struct Values {
  Expr low, high;
  bool unique = false, has_sentinel = false;
  int64_t sentinel = 0;
  /// The elements (but the sentinel) are distinct, e.g. the cache slots tokens are written to.
  Values unique_values() const {
    Values v = *this;
    v.unique = true;
    return v;
  }
  /// `value` is allowed too, outside [low, high): a marker such as -1 for "skip this one".
  Values or_value(int64_t value) const {
    Values v = *this;
    v.has_sentinel = true;
    v.sentinel = value;
    return v;
  }
};
struct ParamRange {
  bool has_min, has_max;
  double min, max;
};
struct ShardDims {
  std::vector<int32_t> dims;
};
struct Choices {
  std::vector<std::string> values;  // integers in decimal when `integers`
  bool integers = false;
};
struct CompileTime {};

inline void apply(TensorDecl& t, DtypeSet s) { t.dtypes = s; }
inline void apply(TensorDecl& t, Dtype d) { t.dtypes = DtypeSet(d); }
inline void apply(TensorDecl& t, const SameDtype& c) {
  t.dtype_like = c.tensor;
  t.dtype_alternatives = c.alternatives;
}
inline void apply(TensorDecl& t, const SameShape& c) { t.shape_like = c.tensor; }
inline void apply(TensorDecl& t, const RankRange& r) {
  t.min_rank = r.min;
  t.max_rank = r.max;
}
inline void apply(TensorDecl& t, const Shape& s) {
  t.has_shape = true;
  t.shape = s.dims;
}
inline void apply(TensorDecl& t, Strided) { t.layout = OPFORGE_LAYOUT_STRIDED; }
inline void apply(TensorDecl& t, ContiguousLastDim) { t.layout = OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM; }
inline void apply(TensorDecl& t, Optional) { t.optional = true; }
inline void apply(TensorDecl& t, Mutated) { t.mutated = true; }
inline void apply(TensorDecl& t, const Values& v) {
  t.has_values = true;
  t.values_low = v.low;
  t.values_high = v.high;
  t.values_unique = v.unique;
  t.has_sentinel = v.has_sentinel;
  t.sentinel = v.sentinel;
}

/// Sets the dtype rule of `c` (opforge::when's rule): a dtype, a dtype set or a same_dtype.
inline void set_dtype_rule(DtypeCaseDecl& c, DtypeSet s) { c.dtypes = s; }
inline void set_dtype_rule(DtypeCaseDecl& c, Dtype d) { c.dtypes = DtypeSet(d); }
inline void set_dtype_rule(DtypeCaseDecl& c, const SameDtype& r) {
  c.dtype_like = r.tensor;
  c.dtype_alternatives = r.alternatives;
}
template <class R>
concept DtypeRule = requires(DtypeCaseDecl& c, const R& r) {
  ::opforge::detail::set_dtype_rule(c, r);
};

/// A parameter's value as its choices spell it: a string as is, an integer in decimal, a bool
/// "true" or "false".
template <class V>
std::string param_value_string(const V& v) {
  if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
  else if constexpr (std::is_integral_v<V>) return std::to_string(static_cast<int64_t>(v));
  else return std::string(v);
}

/// A complete dtype rule that follows a parameter: the cases, then the rule of every other value.
struct DtypeByParam {
  std::vector<DtypeCaseDecl> cases;
  DtypeCaseDecl otherwise;
};

/// opforge::when(param, value, rule), chained `.when(value, rule)` for more values of the same
/// parameter; `.otherwise(rule)` completes it.
struct DtypeWhen {
  std::vector<DtypeCaseDecl> cases;
  template <class V, DtypeRule R>
  DtypeWhen when(const V& value, const R& rule) const {
    DtypeWhen w = *this;
    DtypeCaseDecl& c = w.cases.emplace_back();
    c.param = cases.front().param;
    c.value = param_value_string(value);
    set_dtype_rule(c, rule);
    return w;
  }
  template <DtypeRule R>
  DtypeByParam otherwise(const R& rule) const {
    DtypeByParam b{cases, {}};
    set_dtype_rule(b.otherwise, rule);
    return b;
  }
};

/// Refused by OpBuilder::input's static_assert (a rule without .otherwise()); declared so that
/// the assertion is the only error.
inline void apply(TensorDecl&, const DtypeWhen&) {}
inline void apply(TensorDecl& t, const DtypeByParam& b) {
  t.dtypes = b.otherwise.dtypes;
  t.dtype_like = b.otherwise.dtype_like;
  t.dtype_alternatives = b.otherwise.dtype_alternatives;
  t.dtype_cases = b.cases;
}

/// The dtype a set of exactly one dtype holds, or -1 for any other set.
inline int32_t single_dtype(DtypeSet s) {
  return s.bits != 0 && (s.bits & (s.bits - 1)) == 0 ? __builtin_ctz(s.bits) : -1;
}

/// A complete shape rule that follows a parameter: the cases, then the shape of every other value.
struct ShapeByParam {
  std::vector<ShapeCaseDecl> cases;
  Shape otherwise;
};

/// opforge::when(param, value, shape), chained `.when(value, shape)` for more values of the same
/// parameter; `.otherwise(shape)` completes it.
struct ShapeWhen {
  std::vector<ShapeCaseDecl> cases;
  template <class V>
  ShapeWhen when(const V& value, const Shape& shape) const {
    ShapeWhen w = *this;
    w.cases.push_back({cases.front().param, param_value_string(value), shape.dims});
    return w;
  }
  ShapeByParam otherwise(const Shape& shape) const { return {cases, shape}; }
};

/// Refused by OpBuilder::input's static_assert (a rule without .otherwise()); declared so that
/// the assertion is the only error.
inline void apply(TensorDecl&, const ShapeWhen&) {}
inline void apply(TensorDecl& t, const ShapeByParam& b) {
  t.has_shape = true;
  t.shape = b.otherwise.dims;
  t.shape_cases = b.cases;
}

/// An output's shape rule (OpBuilder::output): an explicit shape, or one that follows a parameter.
inline void set_output_shape(OutputDecl& o, const Shape& s) { o.dims = s.dims; }
inline void set_output_shape(OutputDecl& o, const ShapeByParam& b) {
  o.dims = b.otherwise.dims;
  o.shape_cases = b.cases;
}
/// An output's dtype rule (OpBuilder::output): a dtype, opforge::dtype_of, or one that follows a
/// parameter (each case one dtype or a same_dtype, which takes that input's dtype).
inline void set_output_dtype(OutputDecl& o, Dtype d) { o.dtype = static_cast<int32_t>(d); }
inline void set_output_dtype(OutputDecl& o, const DtypeOf& d) { o.dtype_like = d.tensor; }
inline void set_output_dtype(OutputDecl& o, const DtypeByParam& b) {
  o.dtype_like = b.otherwise.dtype_like;
  o.dtype = b.otherwise.dtype_like.empty() ? single_dtype(b.otherwise.dtypes) : -1;
  o.dtype_cases = b.cases;
}
template <class S>
concept OutputShapeRule = requires(OutputDecl& o, const S& s) {
  ::opforge::detail::set_output_shape(o, s);
};
template <class D>
concept OutputDtypeRule = requires(OutputDecl& o, const D& d) {
  ::opforge::detail::set_output_dtype(o, d);
};

inline void apply(ParamDecl& p, const ParamRange& r) {
  if (r.has_min) p.has_min = true, p.min = r.min;
  if (r.has_max) p.has_max = true, p.max = r.max;
}
inline void apply(ParamDecl& p, const Choices& c) {
  p.choices = c.values;
  p.integer_choices = c.integers;
}
inline void apply(ParamDecl& p, CompileTime) { p.compile_time = true; }

template <class C>
concept TensorConstraint = requires(TensorDecl& t, const C& c) {
  ::opforge::detail::apply(t, c);
};
template <class C>
concept ParamConstraint = requires(ParamDecl& p, const C& c) {
  ::opforge::detail::apply(p, c);
};
// (Qualified calls: unqualified, ADL found std::apply for a std::vector default value.)

// ---- kernel signatures and entry trampolines ----------------------------------------------

/// The slot of an input declared opforge::mutated in a builder's signature (`Sig`): the kernel
/// takes it as a MutableTensor, but it is an argument of the call frame, not an output.
struct MutatedInput {};

/// The kernel parameter type of a signature slot: the slot itself, except a mutated input.
template <class S>
using KernelType = std::conditional_t<std::is_same_v<S, MutatedInput>, MutableTensor, S>;

/// The number of arguments (inputs and parameters) in a signature; outputs are MutableTensor slots.
template <class... S>
inline constexpr int32_t kNumArgs = (0 + ... + (std::is_same_v<S, MutableTensor> ? 0 : 1));

template <class S>
S unpack(const OpforgeArg& a) {
  if constexpr (std::is_same_v<S, Tensor>) {
    return Tensor(a.tensor);
  } else if constexpr (std::is_same_v<S, int64_t>) {
    return ParamTraits<int64_t>::from(a.value);
  } else if constexpr (std::is_same_v<S, double>) {
    return ParamTraits<double>::from(a.value);
  } else if constexpr (std::is_same_v<S, bool>) {
    return ParamTraits<bool>::from(a.value);
  } else if constexpr (std::is_same_v<S, std::string_view>) {
    return ParamTraits<std::string>::from(a.value);
  } else if constexpr (std::is_same_v<S, std::span<const int64_t>>) {
    return ParamTraits<std::vector<int64_t>>::from(a.value);
  } else {
    static_assert(std::is_same_v<S, std::span<const double>>);
    return ParamTraits<std::vector<double>>::from(a.value);
  }
}

inline void write_error(const OpforgeCallFrame* f, const char* msg) {
  if (f->error != nullptr && f->error_capacity > 0) std::snprintf(f->error, f->error_capacity, "%s", msg);
}

/// Runs `body`, turning exceptions into an OpforgeStatus and a message (nothing crosses the ABI).
template <class Body>
int32_t guarded(const OpforgeCallFrame* f, Body&& body) {
  try {
    body();
    return OPFORGE_STATUS_OK;
  } catch (const InvalidArgument& e) {
    write_error(f, e.what());
    return OPFORGE_STATUS_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    write_error(f, e.what());
    return OPFORGE_STATUS_INTERNAL;
  } catch (...) {
    write_error(f, "unknown C++ exception");
    return OPFORGE_STATUS_INTERNAL;
  }
}

/// Argument J of a kernel taking (S...): an input or parameter from the frame's args (a mutated
/// input as a MutableTensor), or an output from its outputs (outputs come last in S).
template <size_t J, class... S>
auto frame_arg(const OpforgeCallFrame* f) {
  using T = std::tuple_element_t<J, std::tuple<S...>>;
  if constexpr (std::is_same_v<T, MutableTensor>) {
    return MutableTensor(f->outputs[J - kNumArgs<S...>]);
  } else if constexpr (std::is_same_v<T, MutatedInput>) {
    return MutableTensor(f->args[J].tensor);
  } else {
    return unpack<T>(f->args[J]);
  }
}

template <bool WithContext, class... S>
struct Entry {
  using Fn = std::conditional_t<WithContext, void (*)(const Context&, KernelType<S>...), void (*)(KernelType<S>...)>;

  template <size_t... I>
  static void call(Fn fn, const OpforgeCallFrame* f, std::index_sequence<I...>) {
    if constexpr (WithContext) {
      fn(Context(*f->ctx), frame_arg<I, S...>(f)...);
    } else {
      fn(frame_arg<I, S...>(f)...);
    }
  }

  static int32_t run(const OpforgeCallFrame* f, const void* user) {
    return guarded(f, [&] {
      OPFORGE_ICHECK(
          f->num_args == kNumArgs<S...> && f->num_outputs == static_cast<int32_t>(sizeof...(S)) - kNumArgs<S...>,
          "call frame does not match the declaration");
      call(reinterpret_cast<Fn>(const_cast<void*>(user)), f, std::index_sequence_for<S...>{});
    });
  }
};

/// Calls a grid function `R fn(args...)` (R: LaunchConfig, or TritonLaunch for a Triton
/// kernel) with the frame's typed arguments.
template <class R, class... S>
struct GridEntry {
  using Fn = R (*)(KernelType<S>...);
  template <size_t... I>
  static R call(Fn fn, const OpforgeCallFrame* f, std::index_sequence<I...>) {
    return fn(frame_arg<I, S...>(f)...);
  }
  static R run(const OpforgeCallFrame* f, const void* user) {
    return call(reinterpret_cast<Fn>(const_cast<void*>(user)), f, std::index_sequence_for<S...>{});
  }
};

/// Which entry (with or without a leading Context) fits a function pointer type `F`.
template <class F, class... S>
struct EntryFor {
  static constexpr bool plain = std::is_same_v<F, void(KernelType<S>...)>;
  static constexpr bool with_context = std::is_same_v<F, void(const Context&, KernelType<S>...)>;
  static constexpr bool ok = plain || with_context;
};

}  // namespace opforge::detail
