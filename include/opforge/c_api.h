/*
 * opforge/c_api.h -- the C ABI between op libraries and framework adapters.
 *
 * An op library (a shared object built from op files) exports one symbol,
 * `opforge_library_v1`, returning an OpforgeLibrary: plain data describing every
 * op (names, argument kinds, dtype sets, shape rules as expressions, defaults and
 * ranges) plus C function pointers for its kernels. Adapters (torch, the C++
 * runner, later JAX) read only this header; they never see the C++ builder that
 * produced the data, so one op library binary serves every framework and every
 * framework version an adapter supports.
 *
 * Every struct an adapter receives or passes starts with `struct_size`, so fields
 * can be appended without breaking older readers (see Note [ABI versioning]).
 *
 * Note [ABI versioning]
 * ---------------------
 * OPFORGE_ABI_VERSION changes only on an incompatible change (a field removed or
 * its meaning changed, or a struct that is embedded by value or laid out in an
 * array growing: OpforgeTensorSpec and OpforgeParamSpec live inside
 * OpforgeArgSpec, which op specs hold as an array, so growing any of them moves
 * every later element). Appending a field to a struct that is only reached
 * through a pointer is compatible: readers read a field past the ones the
 * struct's first version had only where OPFORGE_HAS_FIELD says the record
 * carries it, and a field that fits in an older struct's tail padding is read
 * only when a value that needs it says so (as `sharding_dims` is read only for
 * OPFORGE_SHARDING_DIMS). A field added after version 1 says so in its comment,
 * "Since ABI n.", n being the version below that lists it (appended fields
 * included, which change no version).
 *
 * Version 1: the records, with OpforgeOpSpec::equivalent and sharding,
 * OpforgeKernel::source, name and precompile, and OpforgeLibrary::kernel_dir and
 * reload appended.
 * Version 2: OpforgeTensorSpec::optional (OpforgeArgSpec grew); appended:
 * OpforgeOpSpec::sharding_dims.
 * Version 3: OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM (an older adapter would pass such inputs
 * as is, misaligned or with a strided last dim), OPFORGE_EXPR_MULTIPLE_OF; appended:
 * OpforgeOpSpec::backward.
 * Version 4: OpforgeTensorSpec::mutated (an older adapter would copy a mutated input and lose
 * the kernel's writes) and value domains (OpforgeTensorSpec grew), comparison and remainder
 * nodes (OPFORGE_EXPR_MOD .. OPFORGE_EXPR_GE); appended: OpforgeOpSpec::num_rules and rules.
 * Version 5: OpforgeTensorSpec::dtype_alternatives and leading_dims (OpforgeArgSpec grew),
 * OpforgeOutputSpec::present_with and size_from (held in an array, it grew),
 * OPFORGE_EXPR_SIZE_OF; appended: OpforgeOpSpec::autocast, OpforgeLibrary::num_classes and
 * classes (OpforgeClassSpec, OpforgeMethodSpec).
 * Version 6: OpforgeKernel::dtype_arg and dtypes (OpforgeKernel, held in an array, grew; an
 * older adapter would hand a kernel dtypes it does not take); appended:
 * OpforgeOpSpec::num_tolerances, tolerances (OpforgeTolerance) and tolerance_vs_equivalent.
 * Version 7: OpforgeKernel::backend (OpforgeKernel, held in an array, grew: an older adapter
 * would take a Triton kernel's Python source for CUDA C++); appended:
 * OpforgePrecompileRequest::num_shapes, ndims and sizes; appended value:
 * OPFORGE_BACKEND_BINARY (a reader that does not know the value still launches and precompiles
 * such a kernel through its entries, as any run-time kernel).
 * Version 8: the float8 dtypes OPFORGE_DTYPE_FLOAT8_E4M3FN .. OPFORGE_DTYPE_FLOAT8_E8M0FNU (an
 * older adapter would name them "unknown" in a dtype set and could not pass such a tensor).
 * Version 9: OpforgeTensorSpec::leading_like (OpforgeArgSpec grew; an older adapter would not
 * tie such an input's leading dims), OpforgeRule::when_arg and when_given (held in an array, it
 * grew; an older adapter would check a rule whose optional input is absent); rules and
 * same_dtype/same_shape may name any argument, declared before or after them. Also dtype rules
 * that follow a parameter's value (an older adapter would hold every call to the rule of the
 * spec, which is then only the rule of the values no case names); appended:
 * OpforgeOpSpec::num_dtype_cases and dtype_cases (OpforgeDtypeCase).
 * Version 10: shape rules of inputs and outputs, and dtype rules of outputs, that follow a
 * parameter's value (an older adapter would check and allocate every call by the rule of the
 * spec, which is then only the rule of the values no case names); appended:
 * OpforgeOpSpec::num_rule_cases and rule_cases (OpforgeRuleCase).
 * Appended in version 10: OpforgeContext::after_value_check.
 * Version 11: OpforgeKernel::checks_values (in the tail padding of version 10's struct, which an
 * older library need not have zeroed: a reader would take its kernel for one that checks its own
 * indices, and launch no value check); appended: OpforgeContext::value_domains and
 * num_value_domains (OpforgeValueDomain).
 */
#ifndef OPFORGE_C_API_H_
#define OPFORGE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPFORGE_ABI_VERSION 11

/* Whether `record`, a struct of type `type` that starts with `struct_size`, carries `field`:
 * its struct_size reaches past the field's end. Readers test a field appended after the
 * struct's first version with it before reading it (Note [ABI versioning]), e.g.
 * `OPFORGE_HAS_FIELD(OpforgeOpSpec, *op, autocast) ? op->autocast : OPFORGE_AUTOCAST_NONE`. */
#define OPFORGE_HAS_FIELD(type, record, field) ((record).struct_size >= offsetof(type, field) + sizeof((record).field))

/* Element types. The numbering is opforge's own and stable across versions. */
typedef enum OpforgeDtype {
  OPFORGE_DTYPE_FLOAT32 = 0,
  OPFORGE_DTYPE_FLOAT64 = 1,
  OPFORGE_DTYPE_FLOAT16 = 2,
  OPFORGE_DTYPE_BFLOAT16 = 3,
  OPFORGE_DTYPE_INT8 = 4,
  OPFORGE_DTYPE_INT16 = 5,
  OPFORGE_DTYPE_INT32 = 6,
  OPFORGE_DTYPE_INT64 = 7,
  OPFORGE_DTYPE_UINT8 = 8,
  OPFORGE_DTYPE_BOOL = 9,
  /* The 8-bit floating-point formats of torch's names (Micikevicius et al., "FP8 Formats for Deep
   * Learning", 2022; the OCP MX specification for e8m0): e4m3fn (no infinities, NaN 0x7f/0xff),
   * e5m2 (IEEE-like, with infinities), e8m0fnu (a power of two: exponent only, no sign, NaN 0xff).
   * Since ABI 8. */
  OPFORGE_DTYPE_FLOAT8_E4M3FN = 10,
  OPFORGE_DTYPE_FLOAT8_E5M2 = 11,
  OPFORGE_DTYPE_FLOAT8_E8M0FNU = 12,
  OPFORGE_NUM_DTYPES = 13
} OpforgeDtype;

typedef enum OpforgeDeviceType { OPFORGE_DEVICE_CPU = 0, OPFORGE_DEVICE_CUDA = 1 } OpforgeDeviceType;

/* A strided view of device or host memory. `data` points at element [0, ..., 0]
 * (any storage offset is already applied); sizes and strides count elements.
 *
 * An absent optional tensor (an input declared optional that the caller left out, None in
 * Python) has `ndim == -1`, `data`, `sizes` and `strides` NULL and `dtype == -1`;
 * `device_type` and `device_index` are those of the call. `ndim == -1` is the marker: a
 * present tensor may have a NULL `data` too (no elements). Arguments not declared optional
 * are never absent. */
typedef struct OpforgeTensor {
  void* data;
  int32_t dtype;       /* OpforgeDtype */
  int32_t device_type; /* OpforgeDeviceType */
  int32_t device_index;
  int32_t ndim;
  const int64_t* sizes;
  const int64_t* strides;
} OpforgeTensor;

typedef enum OpforgeArgKind {
  OPFORGE_ARG_TENSOR = 0,
  OPFORGE_ARG_INT = 1,   /* int64_t */
  OPFORGE_ARG_FLOAT = 2, /* double */
  OPFORGE_ARG_BOOL = 3,
  OPFORGE_ARG_STRING = 4,
  OPFORGE_ARG_INT_LIST = 5,  /* int64_t[] */
  OPFORGE_ARG_FLOAT_LIST = 6 /* double[] */
} OpforgeArgKind;

/* A parameter value. Which fields are meaningful depends on `kind`:
 * INT and BOOL use `i`, FLOAT uses `f`, STRING uses `s` and `len` (bytes),
 * INT_LIST uses `ints` and `len`, FLOAT_LIST uses `floats` and `len`. */
typedef struct OpforgeValue {
  int32_t kind; /* OpforgeArgKind, never OPFORGE_ARG_TENSOR */
  int64_t i;
  double f;
  const char* s;
  const int64_t* ints;
  const double* floats;
  size_t len;
} OpforgeValue;

/* Shape expressions, stored in postfix order (see Note [Shape expressions] in
 * opforge/expr.h). DIM reads dimension `value` (negative counts from the end) of
 * tensor argument `arg`; PARAM reads integer parameter `arg`; CONST pushes
 * `value`; the binary operators pop two operands (left pushed first). MULTIPLE_OF is
 * only ever a whole one-node rule of an input's dim: any size that is a multiple of
 * `value` (> 0). */
typedef enum OpforgeExprOp {
  OPFORGE_EXPR_CONST = 0,
  OPFORGE_EXPR_DIM = 1,
  OPFORGE_EXPR_PARAM = 2,
  OPFORGE_EXPR_ADD = 3,
  OPFORGE_EXPR_SUB = 4,
  OPFORGE_EXPR_MUL = 5,
  OPFORGE_EXPR_FLOORDIV = 6,
  OPFORGE_EXPR_CEILDIV = 7,
  OPFORGE_EXPR_MIN = 8,
  OPFORGE_EXPR_MAX = 9,
  OPFORGE_EXPR_MULTIPLE_OF = 10,
  OPFORGE_EXPR_MOD = 11, /* the remainder of floor division */
  /* Comparisons: only the operator of an OpforgeRule, never a node. */
  OPFORGE_EXPR_EQ = 12,
  OPFORGE_EXPR_NE = 13,
  OPFORGE_EXPR_LT = 14,
  OPFORGE_EXPR_LE = 15,
  OPFORGE_EXPR_GT = 16,
  OPFORGE_EXPR_GE = 17,
  /* opforge::size_of(output, at_most): only in a declaration (the first dim of an output's
   * shape), never stored in a record; see OpforgeOutputSpec::size_from. */
  OPFORGE_EXPR_SIZE_OF = 18
} OpforgeExprOp;

typedef struct OpforgeExprNode {
  int32_t op;  /* OpforgeExprOp */
  int32_t arg; /* argument index for DIM and PARAM, else -1 */
  int64_t value;
} OpforgeExprNode;

typedef struct OpforgeExpr {
  int32_t num_nodes; /* 0 means "any size" where a constraint allows it */
  const OpforgeExprNode* nodes;
} OpforgeExpr;

typedef enum OpforgeLayout {
  OPFORGE_LAYOUT_CONTIGUOUS = 0, /* the adapter passes a dense, row-major, 16-byte aligned copy if needed */
  OPFORGE_LAYOUT_STRIDED = 1,    /* kernels read `strides`; any layout is passed as is */
  /* kernels read `strides` of every dim but the last, which has stride 1: a view whose last
   * dim has stride 1 and whose data pointer and other strides are multiples of 16 bytes is
   * passed as is (strides of size-1 dims, the last included, are not looked at: they never
   * move a pointer), any other a dense, row-major, 16-byte aligned copy */
  OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM = 2
} OpforgeLayout;

/* Constraints of one tensor argument, checked by adapters before any launch. */
typedef struct OpforgeTensorSpec {
  size_t struct_size;
  uint32_t dtypes;    /* bit (1u << OpforgeDtype) per allowed dtype */
  int32_t dtype_like; /* index of a tensor argument whose dtype this must equal, or -1 */
  int32_t min_rank;   /* -1: no lower bound */
  int32_t max_rank;   /* -1: no upper bound */
  int32_t num_dims;   /* > 0: exact rank and one expression per dim (num_nodes 0: any) */
  const OpforgeExpr* dims;
  int32_t layout;     /* OpforgeLayout */
  int32_t shape_like; /* index of a tensor argument whose shape this must equal, or -1 */
  /* 1: the caller may leave the tensor out (schema `Tensor? name=None`); it then arrives absent
   * (see OpforgeTensor) and its constraints are not checked. No other argument's constraint,
   * shape rule, output rule or launch rule refers to an optional tensor (a rule gated on its
   * presence, OpforgeRule::when_arg, may), and the first tensor
   * argument is never optional. Since ABI 2. */
  int32_t optional;
  /* 1: the kernel writes this input in place (schema `Tensor(a!) name`): it reaches the kernel
   * as the caller's tensor, never as a copy (see Note [Mutated inputs] in opforge/op.h). Since
   * ABI 4. */
  int32_t mutated;
  /* The values an integer input's elements may take (Note [Value domains] in opforge/op.h):
   * with has_values, each element is in [values_low, values_high) -- expressions over dims
   * and integer parameters -- or equals `sentinel` when has_sentinel; with values_unique, the
   * elements other than the sentinel are distinct. Since ABI 4. */
  int32_t has_values;
  int32_t values_unique;
  int32_t has_sentinel;
  int64_t sentinel;
  OpforgeExpr values_low;
  OpforgeExpr values_high;
  /* With dtype_like: dtypes accepted besides that tensor's, whatever it is (`same_dtype("x") |
   * kFloat32`: a norm weight kept in float32 under 16-bit activations); 0: none. Since ABI 5. */
  uint32_t dtype_alternatives;
  /* 1: `dims` describe the last num_dims dims, after any number of leading dims (torch's `(*, H)`;
   * `shape({opforge::leading_dims, ...})`): the rank is at least num_dims, within min_rank and
   * max_rank. 0: `dims` give the exact rank. Since ABI 5. */
  int32_t leading_dims;
  /* With leading_dims: the index of the tensor argument whose leading dims (those before the
   * dims its own shape({opforge::leading_dims, ...}) rules) this input's leading dims equal, in
   * number and sizes (`shape({opforge::leading_dims_of("x"), ...})`), or -1. Since ABI 9. */
  int32_t leading_like;
} OpforgeTensorSpec;

/* Default, range and choices of one parameter. */
typedef struct OpforgeParamSpec {
  size_t struct_size;
  int32_t has_default;
  OpforgeValue default_value;
  int32_t has_min, has_max; /* inclusive bounds, for INT and FLOAT (and their lists, per element) */
  double min, max;
  int32_t num_choices; /* STRING or INT: allowed values (INT ones in decimal); 0: any value */
  const char* const* choices;
  int32_t compile_time; /* a template argument of run-time kernels, not a kernel argument */
} OpforgeParamSpec;

/* One input or parameter, in declaration order (the schema's argument order). */
typedef struct OpforgeArgSpec {
  size_t struct_size;
  const char* name;
  int32_t kind;             /* OpforgeArgKind */
  OpforgeTensorSpec tensor; /* kind == OPFORGE_ARG_TENSOR */
  OpforgeParamSpec param;   /* otherwise */
} OpforgeArgSpec;

/* A cross-argument rule (`.require(...)` in opforge/op.h): `lhs op rhs` must hold for a call,
 * with `op` one of OPFORGE_EXPR_EQ .. OPFORGE_EXPR_GE over two shape expressions. */
typedef struct OpforgeRule {
  size_t struct_size;
  int32_t op;
  OpforgeExpr lhs;
  OpforgeExpr rhs;
  /* -1: the rule holds for every call. Else an optional tensor argument whose presence decides
   * whether the rule applies (opforge::when_given, opforge::unless_given): when_given 1, only to
   * calls that give it; 0, only to calls that leave it out. Since ABI 9. */
  int32_t when_arg;
  int32_t when_given;
} OpforgeRule;

/* One output: its dtype and shape rule. Outputs are freshly allocated (or, through an `out=`
 * overload, the caller's tensors), dense and row-major, and never alias inputs. An op with an
 * output that exists only with an optional input (present_with) has no out= overload. */
typedef struct OpforgeOutputSpec {
  size_t struct_size;
  const char* name;
  int32_t dtype_like;       /* tensor argument whose dtype the output takes, or -1 */
  int32_t dtype;            /* fixed OpforgeDtype when dtype_like == -1 */
  int32_t shape_like;       /* tensor argument whose shape is the base, or -1 (explicit shape) */
  int32_t num_dims;         /* explicit: the rank; like: the number of overridden dims */
  const int32_t* dim_index; /* like: which dim each expression replaces (negative from end) */
  const OpforgeExpr* dims;
  /* The optional input whose rules this output's rules read (like("key")), or -1: the output
   * exists only in calls that give that input (schema `Tensor?`, None otherwise), and reaches
   * kernels absent (see OpforgeTensor) in the others. Since ABI 5. */
  int32_t present_with;
  /* The output whose value is this output's first dim, or -1: a data-dependent size (a
   * compaction's length), known only after the kernel writes it into that output (a 0-dim int64
   * one). Kernels get this output allocated with dims[0] (the bound) as its first dim; the
   * adapter reads the size after the kernel and returns the first that many rows. Since ABI 5. */
  int32_t size_from;
} OpforgeOutputSpec;

/* The bytes of an OpforgeValueDomain's message, NUL included. */
#define OPFORGE_VALUE_DOMAIN_MESSAGE_BYTES 192

/* One input's value domain for one call (Note [Device value checks] in src/core/device_checks.h):
 * each element in [low, high), or equal to `sentinel` where has_sentinel. A kernel that checks
 * its own values (OpforgeKernel::checks_values) takes one by value per input declaring a domain,
 * as opforge::kernel::ValueDomain (opforge/kernel.cuh, the same layout). Where device value
 * checks are off, or the input is absent, the domain admits every value. Passed by value to
 * kernels: never grows. Since ABI 11. */
typedef struct OpforgeValueDomain {
  int64_t low;
  int64_t high;
  int64_t sentinel;
  int32_t has_sentinel;
  int32_t arg; /* the input's argument index */
  /* "ns::op: name: expected values in [rule) = [low, high)", which the kernel prints before the
   * value and its flat index (NUL-terminated, cut to fit). */
  char message[OPFORGE_VALUE_DOMAIN_MESSAGE_BYTES];
} OpforgeValueDomain;

/* What a kernel is given besides its arguments. */
typedef struct OpforgeContext {
  size_t struct_size;
  int32_t device_type;
  int32_t device_index;
  void* stream; /* cudaStream_t for CUDA (the framework's current stream); NULL on CPU */
  /* Scratch memory from the framework's allocator, valid until the kernel returns
   * and ordered on `stream`. Returns NULL on failure. */
  void* (*allocate)(void* state, size_t bytes);
  void* allocator_state;
  /* Nonzero where the core has just queued the device value check of this call's indices on
   * `stream` (Note [Device value checks] in src/core/device_checks.h): a kernel that waits for
   * it (PTX griddepcontrol.wait) before its first access through a checked index may then be
   * launched as the check's programmatic dependent (CUDA's programmatic dependent launch,
   * sm_90 or newer), so that its launch and its other loads overlap the check. Read it only
   * where OPFORGE_HAS_FIELD says the context carries it. Since ABI 10. */
  int32_t after_value_check;
  /* For a kernel that checks its own values (OpforgeKernel::checks_values), one domain per
   * input that declares opforge::values_in(...), in argument order, valid until the kernel
   * returns; the core launched no value check for the call. NULL and 0 for other kernels. Read
   * them only where OPFORGE_HAS_FIELD says the context carries them. Since ABI 11. */
  const OpforgeValueDomain* value_domains;
  int32_t num_value_domains;
} OpforgeContext;

typedef enum OpforgeStatus {
  OPFORGE_STATUS_OK = 0,
  OPFORGE_STATUS_INVALID_ARGUMENT = 1, /* the caller's fault: mapped to ValueError */
  OPFORGE_STATUS_INTERNAL = 2          /* a bug or a device failure: mapped to RuntimeError */
} OpforgeStatus;

/* Sharding kinds (see opforge::Sharding in opforge/op.h). */
typedef enum OpforgeSharding {
  OPFORGE_SHARDING_NONE = 0,      /* no rule: frameworks replicate or refuse */
  OPFORGE_SHARDING_POINTWISE = 1, /* any dim of the output; inputs follow (broadcast from the right) */
  OPFORGE_SHARDING_ROWWISE = 2,   /* any dim but the last: rows (the last dim) stay whole */
  OPFORGE_SHARDING_DIMS = 3       /* any one of the first tensor input's dims in sharding_dims (and
                                   * the same dim of the outputs); other inputs follow through their
                                   * shape rules (a dim declared dim(first, d) is sharded with d),
                                   * else are replicated */
} OpforgeSharding;

/* Autocast policies (see opforge::Autocast in opforge/op.h). */
typedef enum OpforgeAutocast {
  OPFORGE_AUTOCAST_NONE = 0,            /* runs in the dtypes it is called with */
  OPFORGE_AUTOCAST_FLOAT32 = 1,         /* floating inputs cast to float32 (norms, reductions) */
  OPFORGE_AUTOCAST_LOWER_PRECISION = 2, /* floating inputs cast to the autocast dtype (matmul-like) */
  OPFORGE_AUTOCAST_PROMOTE = 3          /* floating inputs cast to the widest among them */
} OpforgeAutocast;

/* One call: arguments in declaration order (tensors in `tensor`, parameters in
 * `value` of the same slot; a mutated input's `tensor` is the caller's memory, written by the
 * kernel), then the outputs, already allocated. */
typedef struct OpforgeArg {
  OpforgeTensor tensor;
  OpforgeValue value;
} OpforgeArg;

typedef struct OpforgeCallFrame {
  size_t struct_size;
  const OpforgeContext* ctx;
  int32_t num_args;
  const OpforgeArg* args;
  int32_t num_outputs;
  const OpforgeTensor* outputs;
  char* error; /* on failure, a NUL-terminated message is written here */
  size_t error_capacity;
} OpforgeCallFrame;

typedef int32_t (*OpforgeKernelFn)(const OpforgeCallFrame* frame, const void* user);

/* Compile a run-time kernel ahead of its first use (when packaging): the instantiation for
 * these argument dtypes and compile-time parameter values, for GPU architecture `arch`
 * ("sm_90"). Looks in the caches first, like a launch does; a fresh binary is stored in
 * `cache_dir` (with a warning if that folder cannot be written). Needs no GPU. */
typedef struct OpforgePrecompileRequest {
  size_t struct_size;
  const int32_t* dtypes;      /* per argument: the tensor's OpforgeDtype, -1 for an absent
                               * optional tensor (ignored for params) */
  const OpforgeValue* values; /* per argument: the parameter's value (ignored for tensors) */
  const char* arch;
  const char* cache_dir;
  char* error; /* on failure, a NUL-terminated message */
  size_t error_capacity;
  int32_t cache_hit; /* out: 1 if the binary was already cached, 0 if compiled now */
  /* The shapes of one call to compile for, or num_shapes 0 for none: per argument then per
   * output, its rank (-1: a parameter, or an optional tensor left out) and sizes (dense, row-major
   * layouts). A kernel whose variants depend on sizes (a Triton kernel's grid function) compiles the
   * variant of these shapes. Since ABI 7. */
  int32_t num_shapes;
  const int32_t* ndims;
  const int64_t* const* sizes;
} OpforgePrecompileRequest;
typedef int32_t (*OpforgePrecompileFn)(OpforgePrecompileRequest* request, const void* user);

/* How a kernel was made (OpforgeKernel::backend). */
typedef enum OpforgeKernelBackend {
  OPFORGE_BACKEND_NATIVE = 0, /* a function compiled with the library (the reference, .cuda()) */
  OPFORGE_BACKEND_NVRTC = 1,  /* CUDA C++ compiled at run time (.cuda_source()) */
  OPFORGE_BACKEND_TRITON = 2, /* a Triton function compiled by the worker (.triton_source()) */
  OPFORGE_BACKEND_BINARY = 3  /* a prebuilt cubin, fatbin or PTX file (.cuda_binary()); an
                               * appended value of ABI 7 */
} OpforgeKernelBackend;

typedef struct OpforgeKernel {
  size_t struct_size;
  int32_t device_type; /* OpforgeDeviceType */
  OpforgeKernelFn fn;
  const void* user; /* passed back to fn: the author's typed function */
  /* Run-time kernels only (NULL otherwise): the source file, relative to the library's
   * kernel folder (see Note [Run-time kernels] and Note [Triton kernels] in
   * opforge/op_launch.h), the kernel's name (a CUDA name template, or a Triton function), and
   * the ahead-of-time compile entry. */
  const char* source;
  const char* name;
  OpforgePrecompileFn precompile;
  /* The dtypes this device kernel takes (Note [Kernel dtypes] in opforge/op.h): bit
   * (1u << OpforgeDtype) per dtype of tensor argument `dtype_arg`, as declared (a dtype the
   * argument does not admit comes in no call); dtypes 0 (a zeroed struct) or dtype_arg -1:
   * every dtype the declaration admits (always so for the CPU reference). Since ABI 6. */
  int32_t dtype_arg;
  uint32_t dtypes;
  /* How the kernel was made: OpforgeKernelBackend. Since ABI 7. */
  int32_t backend;
  /* Nonzero where the kernel checks every element of each input that declares a value domain
   * itself, before it uses it (opforge::kernel::check_value, as torch's index kernels do with
   * CUDA_KERNEL_ASSERT): a device call then launches no separate value check, and the domains
   * reach the kernel through OpforgeContext::value_domains. Since ABI 11. */
  int32_t checks_values;
} OpforgeKernel;

/* A tolerance of opforge verify for an op's results in one dtype, against float64:
 * |got - want| <= atol + rtol * |want|. Held in an array: never grows. */
typedef struct OpforgeTolerance {
  int32_t dtype; /* OpforgeDtype, floating */
  double atol;
  double rtol;
} OpforgeTolerance;

/* A tensor input's dtype rule for the calls where parameter `param` has the value `value`
 * (`opforge::when(param, value, rule)`, Note [Rules that follow a parameter] in
 * opforge/op_constraints.h): in those calls the rule below replaces the dtype rule of the
 * input's OpforgeTensorSpec (dtypes, dtype_like, dtype_alternatives, with the same meanings),
 * which holds for the values no case of that input names. `value` is spelled as the parameter's
 * choices are: a string as is, an int64 in decimal, a bool "true" or "false". `param` is a
 * STRING, INT or BOOL parameter; at most one case per (arg, value). Since ABI 9. */
typedef struct OpforgeDtypeCase {
  size_t struct_size;
  int32_t arg;   /* the tensor input the rule is of */
  int32_t param; /* the parameter whose value selects the rule */
  const char* value;
  uint32_t dtypes;
  int32_t dtype_like;
  uint32_t dtype_alternatives;
} OpforgeDtypeCase;

/* A tensor input's shape rule, or an output's shape or dtype rule, for the calls where parameter
 * `param` has the value `value` (`opforge::when(param, value, opforge::shape({...}))`, Note [Rules
 * that follow a parameter] in opforge/op_constraints.h). With has_shape, num_dims, dims and
 * leading_dims replace those of the input's OpforgeTensorSpec (its rank bounds become the
 * shape's: exactly num_dims, or at least num_dims with leading_dims) or of the output's
 * OpforgeOutputSpec (an output with cases has an explicit shape: shape_like -1); with has_dtype
 * (outputs only), dtype_like and dtype replace the output's. The spec's own rule holds for the
 * values no case of that input or output names. `value` is spelled as in OpforgeDtypeCase;
 * `param` is a STRING, INT or BOOL parameter; at most one case per (input or output, value, rule
 * kind). Since ABI 10. */
typedef struct OpforgeRuleCase {
  size_t struct_size;
  int32_t arg;    /* the tensor input the rule is of, or -1 */
  int32_t output; /* the output the rule is of, or -1 */
  int32_t param;  /* the parameter whose value selects the rule */
  const char* value;
  int32_t has_shape;
  int32_t num_dims;
  const OpforgeExpr* dims;
  int32_t leading_dims;
  int32_t has_dtype;
  int32_t dtype_like; /* a tensor argument whose dtype the output takes, or -1 */
  int32_t dtype;      /* fixed OpforgeDtype when dtype_like == -1 */
} OpforgeRuleCase;

typedef struct OpforgeOpSpec {
  size_t struct_size;
  const char* ns;
  const char* name;
  const char* doc;
  const char* file; /* where the op was declared */
  int32_t line;
  int32_t num_args;
  const OpforgeArgSpec* args;
  int32_t num_outputs;
  const OpforgeOutputSpec* outputs;
  int32_t num_kernels; /* kernels[0] is the CPU reference */
  const OpforgeKernel* kernels;
  /* A Python expression computing the same outputs with torch, over the argument names
   * (e.g. "torch.nn.functional.softshrink(x, lambd)"), or NULL. Tooling only: opforge verify
   * checks the CPU reference against it, and measures tolerance_vs_equivalent with it. */
  const char* equivalent;
  /* How torch.distributed.tensor (or another framework's sharding) may split the op's work:
   * OpforgeSharding. */
  int32_t sharding;
  /* OPFORGE_SHARDING_DIMS: bit d set if dim d of the first tensor input may be sharded. Since
   * ABI 2. */
  uint32_t sharding_dims;
  /* The op that computes this op's input gradients ("ns::name"), or NULL: see
   * Note [Backward ops] in opforge/op.h. Since ABI 3. */
  const char* backward;
  /* Cross-argument rules, checked with the arguments' own constraints. Since ABI 4. */
  int32_t num_rules;
  const OpforgeRule* rules;
  /* How the op runs under automatic mixed precision (torch.autocast): OpforgeAutocast. Since ABI 5. */
  int32_t autocast;
  /* The tolerances opforge verify compares this op's results with where its arithmetic is
   * looser than a dtype's defaults (OpBuilder::tolerance), num_tolerances of them, one per
   * dtype at most. Since ABI 6 (num_tolerances lies in the tail padding of older records: it is
   * read only where the record has `tolerances`). */
  int32_t num_tolerances;
  const struct OpforgeTolerance* tolerances;
  /* Where a device kernel's result misses the dtype's tolerance, opforge verify still passes
   * it if each output's largest error is at most this many times that of `equivalent` run in
   * the case's own dtypes, both against float64 (OpBuilder::tolerance_vs_equivalent); 0: not
   * declared. Since ABI 6. */
  double tolerance_vs_equivalent;
  /* Dtype rules of inputs that follow a parameter's value, grouped by input in declaration
   * order. Since ABI 9. */
  int32_t num_dtype_cases;
  const struct OpforgeDtypeCase* dtype_cases;
  /* Shape rules of inputs and outputs, and dtype rules of outputs, that follow a parameter's
   * value. Since ABI 10. */
  int32_t num_rule_cases;
  const struct OpforgeRuleCase* rule_cases;
} OpforgeOpSpec;

/* One method of a custom class (Note [Custom classes] in opforge/op.h): calling it runs `op`, an
 * op of the same namespace, with the object's fields as the op's arguments of the same names and
 * the caller's arguments as the op's other ones, in order. */
typedef struct OpforgeMethodSpec {
  size_t struct_size;
  const char* name; /* the method's name, e.g. "forward" */
  const char* op;   /* "ns::name" */
} OpforgeMethodSpec;

/* A custom class (`torch.classes.<ns>.<name>`): state kept between calls, constructed once. With
 * a constructor op, the class's __init__ takes that op's arguments and the object keeps its
 * outputs, then those of its arguments that a method takes; without one, __init__ takes the
 * declared fields, which the object keeps as given. Since ABI 5. */
typedef struct OpforgeClassSpec {
  size_t struct_size;
  const char* ns;
  const char* name;
  const char* doc;
  const char* file; /* where the class was declared */
  int32_t line;
  int32_t num_fields; /* declared fields: parameters kept as given (OpforgeArgKind, never TENSOR) */
  const char* const* field_names;
  const int32_t* field_kinds;
  const char* constructor; /* the constructor op, "ns::name", or NULL */
  int32_t num_methods;
  const OpforgeMethodSpec* methods;
} OpforgeClassSpec;

typedef struct OpforgeLibrary {
  size_t struct_size;
  int32_t abi_version; /* OPFORGE_ABI_VERSION of the headers the library was built with */
  int32_t num_ops;
  const OpforgeOpSpec* const* ops;
  /* Non-NULL if a declaration in the library is invalid: every problem, each with
   * the file and line of the declaration. Adapters refuse to load such a library. */
  const char* error;
  /* The folder run-time kernel sources are read from (absolute). */
  const char* kernel_dir;
  /* Forget compiled run-time kernels, so the next call re-reads and recompiles (or finds in
   * the on-disk cache) each source. Modules already loaded stay valid for work in flight. */
  void (*reload)(void);
  /* Custom classes declared with OPFORGE_CLASS, in declaration order. Since ABI 5. */
  int32_t num_classes;
  const OpforgeClassSpec* const* classes;
} OpforgeLibrary;

/* The one symbol an op library exports (defined by opforge's op-library support code). */
const OpforgeLibrary* opforge_library_v1(void);
typedef const OpforgeLibrary* (*OpforgeLibraryFn)(void);
#define OPFORGE_LIBRARY_SYMBOL "opforge_library_v1"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OPFORGE_C_API_H_ */
