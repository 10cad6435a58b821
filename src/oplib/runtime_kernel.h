// The backend-neutral half of run-time kernels (Note [Run-time kernels] in opforge/op_launch.h): the
// kernel folder, the on-disk binary cache, instantiation names, launch geometry and the order of
// kernel arguments and the check of a kernel's parameters. A backend (rtc_cuda.cpp: NVRTC;
// binary_cuda.cpp: prebuilt binaries; cuda_launch.cpp: their launch through the CUDA driver)
// compiles or loads and launches; everything here is shared by any backend and needs no GPU
// library.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "opforge/op.h"

namespace opforge::detail::rtc {

// ---- files ----------------------------------------------------------------------------------

bool read_file(const std::string& path, std::string& out);
bool is_file(const std::string& path);
/// The names of the regular files in folder `dir` (symbolic links followed), sorted; empty if
/// it cannot be read.
std::vector<std::string> files_in(const std::string& dir);
std::string real_path(const std::string& path);
std::string env(const char* name);

// ---- the binary cache -----------------------------------------------------------------------

/// A compiled kernel: its lowered (mangled) name and its binary image (CUBIN, or PTX).
struct Binary {
  std::string lowered_name;
  std::string image;
};

/// The user cache: $OPFORGE_CACHE_DIR/kernels, else $XDG_CACHE_HOME/opforge/kernels, else
/// ~/.cache/opforge/kernels.
std::string user_cache_dir();

/// The binary for cache key `key`: looked up in the library's shipped cache (the kernel folder's
/// cache/), the user cache and `write_dir`, in that order. With `store_in_write_dir`
/// (precompile: packages must carry their binaries) one found elsewhere is copied into
/// `write_dir`. Returns false if none is cached. Entries carry their full key and a checksum
/// (64-bit FNV-1a; Fowler, Noll, Vo, http://www.isthe.com/chongo/tech/comp/fnv/) and are compared
/// on load, so a damaged or colliding entry costs a recompile, never a wrong kernel.
bool find_cached(const std::string& key, const std::string& write_dir, bool store_in_write_dir, Binary& out);

/// Stores `b` under `key` in `dir`, atomically (a temporary file renamed into place); warns once
/// and keeps the binary in memory only if the folder cannot be written.
void store(const std::string& dir, const std::string& key, const Binary& b);

// ---- names ----------------------------------------------------------------------------------

/// The kernel's name expression for one instantiation: `{T}` replaced by the first tensor
/// input's type, `{T_<tensor>}` by that tensor's, `{<param>}` by a compile-time parameter's
/// value; `type_name` gives a backend's type for an OpforgeDtype ("__half" for CUDA).
std::string instantiate(const RuntimeKernel& rk, const std::vector<int32_t>& arg_dtypes,
                        const std::vector<int32_t>& out_dtypes, const OpforgeValue* values,
                        const char* (*type_name)(int32_t dtype));

/// The instantiation key of one call: every tensor argument's dtype (-1 for an absent optional
/// input), every compile-time parameter's value, then every output's dtype; calls with equal
/// keys have the same instantiation name (placeholders may only name compile-time parameters,
/// which the load checks). Writes at most `capacity` values to `key` and their count to `size`;
/// false where they do not fit or a compile-time parameter is a string (its text would be part of
/// the key), and the caller then goes by the name.
bool instantiation_key(const RuntimeKernel& rk, const OpforgeCallFrame* f, int64_t* key, int32_t capacity,
                       int32_t& size);

/// The dtype of output `o` for these argument dtypes.
int32_t output_dtype(const OpforgeOutputSpec& o, const std::vector<int32_t>& arg_dtypes);

// ---- ahead-of-time compiles (OpforgePrecompileRequest) --------------------------------------

/// The instantiation a precompile request asks for: its tensor dtypes (`arg_dtypes` per argument
/// as the request gives them, -1 for an absent optional input; `out_dtypes` by the outputs'
/// rules) and its name (instantiate, with `type_name`).
struct Requested {
  std::vector<int32_t> arg_dtypes, out_dtypes;
  std::string name;
};
Requested requested(const RuntimeKernel& rk, const OpforgePrecompileRequest& request,
                    const char* (*type_name)(int32_t dtype));

/// Runs `body`, a precompile entry's work, as detail::guarded runs a kernel: an exception
/// becomes the entry's status, its message written into the request.
template <class Body>
int32_t guarded_request(OpforgePrecompileRequest* request, Body&& body) {
  OpforgeCallFrame errors{};
  errors.error = request->error;
  errors.error_capacity = request->error_capacity;
  return guarded(&errors, std::forward<Body>(body));
}

// ---- launch geometry and arguments ----------------------------------------------------------

/// Grid, block, shared memory and the rule's int64 arguments of one call: elementwise over the
/// rule tensor's elements, rows over the product of its leading dims (a row may be empty: the
/// kernel then writes what an empty row gives), or the grid function's answer, written into
/// `cfg` (whose argument storage is reused: a launch keeps one LaunchConfig per thread, so the
/// elementwise and rows rules allocate nothing per call). Returns false when there is nothing
/// to launch (no thread would have work) and no output has an element. Throws InternalError if
/// the rule gives no threads while an output has elements (those elements would stay
/// unwritten: the rule names the wrong tensor), InvalidArgument if the grid would exceed a
/// launch's limits.
bool launch_config(const RuntimeKernel& rk, const OpforgeCallFrame* f, LaunchConfig& cfg);

// ---- tensor maps ----------------------------------------------------------------------------

/// The dims (elements) and strides (bytes, of dims 1 and up) of a tensor map, innermost first.
struct TensorMapLayout {
  uint32_t rank = 0;
  uint64_t dims[5] = {};
  uint64_t strides[4] = {};
};

/// The layout of opforge::tensor_map(t, box, swizzle): t's dims and strides reversed. Throws
/// InvalidArgument naming the tensor's dtype and shape and what the bulk tensor copies cannot
/// take (Requires of opforge::tensor_map in opforge/op_cuda.h).
TensorMapLayout tensor_map_layout(const Tensor& t, const uint32_t* box, size_t box_size, TensorMapSwizzle swizzle);

// ---- kernel signatures ----------------------------------------------------------------------

/// One parameter a run-time kernel must declare: what KernelArguments passes in its place.
struct KernelParameter {
  enum Kind { kPointer, kInt64, kDouble, kBool, kTensorMap, kValueDomain };
  Kind kind = kInt64;
  std::string what;       ///< "input x", "output y", "launch value n", "tensor map 0", "parameter eps",
                          ///< "value domain of slots"
  int32_t dtype = -1;     ///< kPointer: the tensor's OpforgeDtype; -1: an optional input left out
  bool writes = false;    ///< kPointer: an output or mutated input (the pointee is not const)
  bool optional = false;  ///< kPointer: an opforge::optional input, or an output that exists only with
                          ///< one (null when left out)
};

/// How many int64 launch values precede the parameters: elementwise 1 (n), rows 2 (rows,
/// cols), a grid function's as many as it returns (-1: known only once it has run).
int32_t rule_launch_values(const RuntimeKernel& rk);

/// The parameters a kernel instantiation takes, in order, for these dtypes: the tensors'
/// pointers (inputs, then outputs), `launch_values` int64 values of the launch rule
/// (elementwise: n; rows: rows, cols; a grid function: its args; -1 when unknown, i.e. a grid
/// function's before it runs), `tensor_maps` tensor maps (a grid function's; none when
/// `launch_values` is -1), then the parameters that are not compile-time, then, for a kernel that
/// checks its own values (.checks_values_in_kernel()), one value domain per input declaring one.
std::vector<KernelParameter> kernel_parameters(const RuntimeKernel& rk, const std::vector<int32_t>& arg_dtypes,
                                               const std::vector<int32_t>& out_dtypes, int32_t launch_values,
                                               int32_t tensor_maps = 0);

/// A one-line text of `params` for cache keys ("float const*, float*, int64_t, double"); an
/// optional input is "optional*" whether given or not (one binary serves both calls). With
/// `grid_values_unknown` (messages, before a grid function has run) the text says where the
/// grid function's values and maps go.
std::string parameters_text(const std::vector<KernelParameter>& params, const char* (*type_name)(int32_t dtype),
                            bool grid_values_unknown = false);

/// The differences between a kernel's declared parameter list `declared` (as the Itanium
/// demangler prints it, e.g. "float const*, float*, long long, double") and `expected`, one
/// line per parameter: "parameter 3 (launch value n): expected int64_t, found int". A pointer
/// matches its tensor's element type (`type_name`, e.g. "__half"; int64 also as "long") or
/// void (any type for an optional input left out); an output's or mutated input's must not point to const; a
/// tensor map is "opforge::kernel::TensorMap". With `launch_values_known` false, any number of int64 parameters
/// and then of tensor maps may stand for a grid function's values and maps. Empty if they match.
std::vector<std::string> signature_problems(const std::string& declared, const std::vector<KernelParameter>& expected,
                                            bool launch_values_known, const char* (*type_name)(int32_t dtype));

/// The size in bytes of what KernelArguments passes for `p`: 8 for a pointer, an int64 and a
/// double, 1 for a bool, 128 for a tensor map (CUtensorMap), 224 for a value domain
/// (OpforgeValueDomain).
uint32_t parameter_size(const KernelParameter& p);

/// The differences between the parameter sizes a prebuilt kernel records (`sizes`, bytes, in
/// order) and what opforge passes (`expected`), one line per parameter: "parameter 3 (launch
/// value n): expected int64_t (8 bytes), found a parameter of 4 bytes". With
/// `launch_values_known` false, any number of 8-byte and then 128-byte parameters may stand for
/// a grid function's values and maps. Empty if they match. Sizes cannot tell a float* from a
/// half*: a kernel whose name is C++-mangled is also checked by signature_problems.
std::vector<std::string> size_problems(const std::vector<uint32_t>& sizes, const std::vector<KernelParameter>& expected,
                                       bool launch_values_known, const char* (*type_name)(int32_t dtype));

/// The error that refuses a kernel: "<kernel> but is passed (<parameters_text of expected>); see
/// <note>:", then each of `problems` on a line of its own. `kernel` names the kernel and what it
/// takes ("the run-time kernel f<float> (f.cu) is declared (float const*, int)").
std::string mismatch_message(const std::string& kernel, const std::vector<KernelParameter>& expected,
                             bool launch_values_known, const char* (*type_name)(int32_t dtype), const char* note,
                             const std::vector<std::string>& problems);

/// The parameter list of a lowered (Itanium-mangled) kernel name, demangled: for
/// "_Z10softshrinkIfEvPKT_PS0_xd", "float const*, float*, long long, double". nullopt for a
/// name that is not mangled (an extern "C" kernel, whose parameters cannot be checked).
std::optional<std::string> demangled_parameters(const std::string& lowered_name);

/// The kernel's arguments in their order: the tensors' data pointers (inputs, then outputs; an
/// absent optional input's is null), the launch's int64 values, its tensor maps (pointed to in
/// `cfg`, which must outlive the launch), then the parameters that are not compile-time, each
/// with its declared C type (int64_t, double, bool), then the call's value domains for a kernel
/// that checks its own values (OpforgeContext::value_domains, which must outlive the launch).
/// Throws InternalError where such a kernel's context carries fewer domains than its inputs
/// declare. Held inline for up
/// to kInline arguments (built on every launch: no allocation on that path), else on the heap.
class KernelArguments {
 public:
  KernelArguments(const RuntimeKernel& rk, const OpforgeCallFrame* f, const LaunchConfig& cfg);
  KernelArguments(const KernelArguments&) = delete;
  KernelArguments& operator=(const KernelArguments&) = delete;
  /// One pointer per argument, to its value (what cuLaunchKernel's kernelParams takes).
  void** params() { return params_; }

 private:
  union Slot {  // one argument's value; a bool is its first byte
    void* pointer;
    int64_t integer;
    double floating;
    unsigned char boolean;
  };
  static constexpr size_t kInline = 32;
  Slot inline_slots_[kInline];
  void* inline_params_[kInline];
  std::vector<Slot> heap_slots_;
  std::vector<void*> heap_params_;
  Slot* slots_ = inline_slots_;
  void** params_ = inline_params_;
};

}  // namespace opforge::detail::rtc
