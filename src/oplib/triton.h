// Triton kernels (Note [Triton kernels] in opforge/op_launch.h), the backend-neutral half:
// what the worker process tells of a function, the binding of the op's arguments to its
// parameters, Triton's specialisation of one call, variant keys and the worker's requests. The
// CUDA half (loading, launching, autotuning) is triton_cuda.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime_kernel.h"

namespace opforge::detail::triton {

/// A tl.constexpr value: an integer, floating-point value, bool, a tl.dtype (by Triton's name,
/// "bf16") or None.
struct Constant {
  enum Kind { kNone, kInt, kFloat, kBool, kDtype } kind = kNone;
  int64_t i = 0;
  double f = 0;
  std::string dtype;
  bool operator==(const Constant& o) const { return kind == o.kind && i == o.i && f == o.f && dtype == o.dtype; }
  /// As the worker's JSON takes it: 5, 0.5, true, {"dtype": "bf16"}, null.
  std::string json() const;
};

/// One parameter of the function, in order (the worker's inspect).
struct Param {
  std::string name;
  bool is_constexpr = false;
  std::string annotation;  ///< Triton's type of an annotated parameter ("i64", "*fp32"), or ""
  bool has_default = false;
  Constant default_value;
  bool do_not_specialize = false, do_not_specialize_on_alignment = false;
};

/// One config of a function under triton.autotune.
struct Config {
  std::vector<std::pair<std::string, Constant>> kwargs;
  int32_t num_warps = 4, num_stages = 3, num_ctas = 1;
  int32_t maxnreg = 0;  ///< 0: none
};

/// What the worker's inspect reports of a function.
struct Function {
  std::string triton_version;
  std::vector<Param> params;
  bool autotuned = false;
  std::vector<Config> configs;
  std::vector<std::string> key, reset_to_zero, restore_value;
  /// Parts that run Python on every call (heuristics, config pre-hooks, prune_configs_by): such a
  /// function is refused, naming them.
  std::vector<std::string> needs_python;
};

/// Parses the worker's inspect answer (its JSON text). Throws InternalError on an answer it cannot read.
Function parse_inspection(const std::string& json_text);

/// A runtime value of one call.
struct Value {
  enum Kind { kPointer, kInt, kFloat, kBool } kind = kInt;
  const void* pointer = nullptr;
  int32_t dtype = -1;  ///< kPointer: the tensor's OpforgeDtype (-1: an optional input left out)
  int64_t i = 0;
  double f = 0;
};

/// Where one parameter's value comes from when the grid function does not set it (Note [Triton
/// kernels], rules 2 to 5), resolved once per kernel.
struct Source {
  enum Kind { kNone, kTensor, kOpParam, kLaunchValue, kDefault } kind = kNone;
  int32_t index = -1;  ///< kTensor: argument index, or num_args + output index; kOpParam: argument
                       ///< index; kLaunchValue: 0 (n_rows, n_elements) or 1 (n_cols)
};

/// Rules 2 to 5 of Note [Triton kernels] for every parameter of `fn` (kNone where only the grid
/// function can give a value).
std::vector<Source> static_sources(const RuntimeKernel& rk, const Function& fn);

/// The values of one call: a runtime value or a constant per parameter.
struct Bound {
  std::vector<Value> values;        ///< per parameter (unused for constants)
  std::vector<Constant> constants;  ///< per parameter (kNone kind and !is_constant: a runtime value)
  std::vector<uint8_t> is_constant;
  /// Partial sums (TritonLaunch::sum_into): per parameter, rows (0: not partials) and the output.
  std::vector<int64_t> partial_rows;
  std::vector<OpforgeTensor> partial_into;
};

/// Binds the call's values to the parameters (Note [Triton kernels]): `cfg` is what the grid
/// function (or the launch rule) gave. Throws InvalidArgument (caller's data: never) or
/// InternalError naming the op, the file, the function and the parameter for a parameter without
/// a value, a value of the wrong kind, or a name the grid function sets that no parameter has.
Bound bind(const RuntimeKernel& rk, const Function& fn, const std::vector<Source>& sources, const OpforgeCallFrame* f,
           const TritonLaunch& cfg);

/// Triton's type of a pointer to OpforgeDtype `dtype` ("*fp32"), or of the dtype ("fp32").
std::string type_name(int32_t dtype);

/// One compiled variant's description: the request the worker gets for it.
struct Variant {
  std::vector<std::string> types;   ///< per parameter: Triton's type, or "constexpr"
  std::vector<uint8_t> divisible;   ///< per parameter: tt.divisibility 16
  std::vector<Constant> constants;  ///< per parameter (types[i] == "constexpr")
  int32_t num_warps = 4, num_stages = 3, num_ctas = 1, maxnreg = 0;
  int32_t config = -1;  ///< the autotune config it compiles, or -1
  bool operator==(const Variant& o) const {
    return types == o.types && divisible == o.divisible && constants == o.constants && num_warps == o.num_warps &&
           num_stages == o.num_stages && num_ctas == o.num_ctas && maxnreg == o.maxnreg && config == o.config;
  }
  /// A hash of every field (64-bit FNV-1a), for the per-call lookup of a loaded variant.
  uint64_t hash() const;
  /// The request's "variants" entry (JSON).
  std::string request(const Function& fn) const;
  /// The variant's part of a cache key, and the text messages name it by.
  std::string key() const;
  std::string describe(const Function& fn) const;
};

/// The variant Triton's JIT would compile for this call (Note [Triton kernels], Variants); with
/// `general`, the one that serves every call (no divisibility, no constant 1, 64-bit integers).
Variant specialise(const Function& fn, const Bound& b, int32_t num_warps, int32_t num_stages, bool general);

/// The autotune config's constants and options applied to `v` (the config's kwargs become
/// constants of the parameters they name).
void apply_config(const Function& fn, int32_t config, Variant& v);

/// The text of every .py file in the library's kernel folder (sorted by path): part of every key,
/// so an edit to the kernel or a helper beside it compiles anew. Read once per process (and again
/// after a reload).
const std::string& sources_text();
void forget_sources();

/// Runs a worker (`OPFORGE_TRITON_PYTHON` running `OPFORGE_TRITON_WORKER --serve`, kept between
/// requests; triton_worker.cpp) on `request` and returns its answer (JSON text). nullopt where
/// this process cannot compile (either variable unset). Throws InternalError naming `what` if the
/// worker fails (its stderr's tail included). Threads calling at once are served by workers of
/// their own.
std::optional<std::string> run_worker(const std::string& request, const std::string& what);

/// The workers one compile of several variants uses at once (at most; never more than the cores).
constexpr size_t kParallelWorkers = 4;

/// Whether this process can compile Triton kernels (OPFORGE_TRITON_PYTHON and _WORKER are set).
bool can_compile();

/// The bytes of base64 text `text` (RFC 4648, with or without padding): the worker's cubins.
std::string base64_decode(const std::string& text);

}  // namespace opforge::detail::triton
