// opforge/op_launch.h -- how a run-time kernel is launched: the launch rules that follow
// `.cuda_source()`, `.cuda_binary()` and `.triton_source()` (part of opforge/op.h).
//
//   .cuda_source("softshrink.cu", "softshrink<{T}>").launch(opforge::elementwise("y").bytes_per_thread(16))
//   .cuda_source("rms_norm.cu", "rms_norm<{T}, {T_weight}>").launch(opforge::rows("x"))
//   .cuda_source("attention.cu", "attention<{T}, {head_dim}, {causal}>").launch_grid(attention_grid)
//
// opforge::elementwise and opforge::rows size the grid from one tensor; a grid function
// (`opforge::LaunchConfig fn(args...)`, given to `.launch_grid()`) takes the op's arguments like a
// kernel and returns grid, block, dynamic shared memory and extra int64 kernel arguments. CUDA's
// tensor maps and compile target, which only grid functions use, are in opforge/op_cuda.h.
//
// Note [Run-time kernels]
// -----------------------
// `.cuda_source("softshrink.cu", "softshrink<{T}>").launch(opforge::elementwise("y"))` names a CUDA
// source that is not compiled with the library. It ships in the library's kernel folder
// (lib<name>.kernels/ beside lib<name>.so; opforge_add_library(... KERNELS ...) links it there),
// and NVRTC compiles it for the GPU in use on first call, once per instantiation: `{T}` becomes the
// first tensor input's CUDA type (float, double, __half, __nv_bfloat16, ...), `{T_<tensor>}`
// another tensor's, `{<param>}` the value of an opforge::compile_time parameter.
//
// The kernel receives, in this order: the tensors' data pointers (inputs, then outputs); the launch
// rule's int64 values (elementwise: n; rows: rows, cols; a grid function: its LaunchConfig's args);
// a grid function's tensor maps (`const __grid_constant__ opforge::kernel::TensorMap`, for Hopper's
// bulk tensor copies: opforge::tensor_map in opforge/op_cuda.h, and opforge/tma.cuh); then the
// other parameters, with their declared C types (int64_t, double, bool). A kernel whose parameter
// list differs (an `int` for an int64_t, a pointer to another element type, a const pointer to an
// output, a missing parameter) is refused when it is compiled or loaded from the cache, with each
// parameter named. `void*` takes any tensor; extern "C" kernels carry no types and are not checked.
//
// An opforge::optional input keeps its place among the pointers and is a null pointer when the
// caller left it out, so the kernel tests `mask != nullptr`. An empty tensor that was given may
// have a null pointer too: pass its size through the grid function's args if that matters. A grid
// function gets a left-out input as an opforge::Tensor whose defined() is false.
//
// Binaries are cached on disk ($OPFORGE_CACHE_DIR/kernels, default ~/.cache/opforge/kernels) under
// a key made of the source text, the kernel name, the options, the architecture and the NVRTC
// version. Entries carry their key and a checksum and are written atomically; a damaged one is
// recompiled. An edited source is picked up by the next process, or in this process after
// opforge.reload(); the op's name and schema do not change. opforge.aoti.package compiles the
// instantiations a graph uses into the package (lib<name>.kernels/cache/), so a deployed model
// compiles nothing on its first inference.
//
// The source may `#include <opforge/kernel.cuh>` (device helpers), <opforge/tma.cuh> (mbarriers and
// bulk tensor copies), cuda_fp16.h and cuda_bf16.h.
//
// Note [Triton kernels]
// ---------------------
// `.triton_source("rms_norm.py", "_rms_norm_forward_kernel").launch_grid(rms_norm_grid)` names an
// unmodified `@triton.jit` function (under `@triton.autotune` or not) in a Python file of the
// library's kernel folder. On a kernel's first use opforge has Triton compile it for the GPU in
// use, in a Python process of its own (`python -m opforge._triton_worker`: the caller's GIL is
// not held, and other threads' calls go on), stores the cubin in the kernel cache, and launches it
// from C++ through the CUDA driver, as Triton's own launcher would: no Python on the call path.
//
// Arguments. Each parameter of the function, in order, gets its value by name, from the first of:
//   1. a name the grid function sets (TritonLaunch::set, constant, tensor, sum_into; and
//      TritonLaunch::copy gives an output a copy of an input before the kernel, for kernels that
//      compute in place through one pointer);
//   2. a tensor input or output of the op with the parameter's name, ignoring case and a `_ptr`
//      suffix (`X_ptr` is input `x`): its data pointer (for an optional input left out, None,
//      which Triton compiles in as a constant, as when a Python caller passes None);
//   3. a parameter of the op of that name, ignoring case: its value; an opforge::compile_time
//      parameter must meet a `tl.constexpr` one and any other a runtime one;
//   4. the launch rule's values: opforge::rows gives `n_rows` and `n_cols`, opforge::elementwise
//      `n_elements`;
//   5. the default of a `tl.constexpr` parameter in the function's signature, or the value an
//      autotune config gives it.
// A parameter that gets no value, a value of the wrong kind for it (a tensor or runtime value for
// a `tl.constexpr`, a constant for a runtime parameter), or a name the grid function sets that the
// function does not have, is an error when the kernel is first compiled, naming the op, the file,
// the function and the parameter. Runtime values travel as Triton's launcher types them:
// pointers as `*<dtype>`, integers as i32 or i64 by value, floating-point values as fp32, bools as
// i1; a dtype constant is a `tl.dtype` (tl.bfloat16).
//
// Grid. opforge::rows(t) launches one program per row of t (numel / size(-1)); opforge::elementwise(t)
// cdiv(t.numel(), BLOCK_SIZE) programs, BLOCK_SIZE being the kernel's `tl.constexpr` of that name; a
// grid function sets TritonLaunch::grid (with grid_per for a grid that depends on an autotune
// config's value). num_warps and num_stages are 4 and 3 (Triton's defaults) unless the grid
// function or an autotune config sets them.
//
// Variants. As Triton's JIT specialises: an integer argument divisible by 16 and a pointer aligned
// to 16 bytes compile with that fact (tt.divisibility), an integer equal to 1 compiles as a
// constant, and `do_not_specialize` / `do_not_specialize_on_alignment` and annotated parameters are
// honoured; each variant compiles once. A variant is keyed by the sha256 of every .py file of the
// kernel folder (a kernel file may import helpers beside it), the function, the target, the
// signature, the constants and the options. A process that cannot compile (no Python with Triton:
// OPFORGE_TRITON_PYTHON unset, as in the C++ runner) uses the variants the library's kernel folder
// carries (opforge.aoti.package puts those of the graph's calls there), and where the exact one is
// missing the general variant (no divisibility, no constant 1, 64-bit integers), which is correct
// for every call; a call for which neither is there fails naming the op, the kernel and the
// specialisation.
//
// Autotune. For a function under `@triton.autotune`, the configs are tried on the first call of
// each tuning key (the values of the arguments its `key` names, and the tensors' dtypes), each
// timed over repeated launches on the call's stream with its `reset_to_zero` arguments zeroed and
// `restore_value` arguments restored around each run; the fastest is kept in the kernel cache, and
// packages carry the choices. Tuning synchronises the device, once per key; it refuses to run
// during CUDA graph capture (call the op once before capturing). Config pre-hooks,
// `prune_configs_by` and `triton.heuristics` run Python per call and are refused, naming the op.
//
// Edit and redeploy: the next process, or this one after opforge.reload(), hashes the kernel
// folder again and compiles what changed.
//
// Note [Prebuilt kernels]
// -----------------------
// `.cuda_binary("scale.cubin", "scale_kernel").launch(opforge::elementwise("y"))` names a kernel
// that another compiler built: a cubin (`nvcc -cubin`, CuTe DSL's CUTE_DSL_KEEP=cubin, TileLang,
// cuTile), a fatbin (`nvcc -fatbin`) or PTX (`nvcc -ptx`; the driver compiles it for the GPU when
// it loads it), shipped in the library's kernel folder like a .cu source (an op folder's
// kernels/*.cubin, *.fatbin and *.ptx). Which of the three a file is, is read from its content.
// `scale_kernel` is the kernel's symbol as the file has it (extern "C" names are plain, C++ names
// mangled); `{T}`, `{T_<tensor>}` and `{<param>}` in it become the dtype's name and the
// compile-time parameter's value ("scale_{T}" is scale_bfloat16 for a bfloat16 input), so one file
// may hold a kernel per dtype.
//
// The kernel takes what a `.cuda_source()` kernel takes, in the same order (Note [Run-time
// kernels]): the tensors' pointers, the launch rule's int64 values, a grid function's tensor maps,
// then the other parameters; launch rules and grid functions (opforge::LaunchConfig) are the same.
// A binary has no types to check, so its parameters are checked by size, wherever it records them:
// 8 bytes for a pointer, an int64 and a double, 1 for a bool, 128 for a tensor map. A cubin records
// each kernel's parameter sizes (its .nv.info section; src/oplib/kernel_image.h says how it is
// read), PTX declares them (`.param .u64 ...`), and a fatbin holds cubins and PTX, compressed or
// not. Without a GPU (opforge.precompile, packaging, opforge verify) opforge checks the code that
// runs on the requested architecture, where it can read it: that code exists, has the symbol, and
// its parameters have the sizes opforge passes. On the GPU the driver's own reading
// (cuFuncGetParamInfo, CUDA 12.4 and later) is checked when the kernel is first loaded, which
// covers compressed fatbins too. A C++-mangled symbol also carries its parameters' types, which
// are checked as a `.cuda_source()` kernel's are. A mismatch is an error naming the op, the file,
// the symbol and each parameter. Sizes alone cannot tell a float* from a __half*, nor an int64_t
// from a double: declare with `.kernel_dtypes()` the dtypes an extern "C" kernel was built for.
//
// Nothing is compiled: opforge.precompile checks and reports a cache hit, and packages carry the
// file with the kernel folder. The machine code in a binary runs on GPUs of its major version and
// at least its minor (sm_80 code on sm_80, sm_86 and sm_89), PTX on its architecture and newer if the driver
// knows its ISA version; a binary without code for the GPU in use is refused naming what it holds.
// An edited or replaced file is read by the next process, or by this one after opforge.reload().
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "opforge/detail/op_detail.h"

namespace opforge {

/// What a grid function returns: grid and block of the launch, dynamic shared memory in bytes,
/// the extra int64 kernel arguments (passed after the tensor pointers) and tensor maps (passed
/// after those; opforge::tensor_map in opforge/op_cuda.h).
using detail::LaunchConfig;

/// What the grid function of a Triton kernel returns (Note [Triton kernels]): the grid in
/// programs, num_warps and num_stages, and values of the function's parameters by name:
///
///   opforge::TritonLaunch rms_norm_grid(opforge::Tensor x, opforge::Tensor w, double eps,
///                                       opforge::MutableTensor y, opforge::MutableTensor rstd) {
///     opforge::TritonLaunch cfg;
///     cfg.grid[0] = x.numel() / x.size(-1);  // one program per row
///     cfg.num_warps = 8;
///     cfg.set("X_row_stride", x.size(-1)).constant("BLOCK_SIZE", 4096);
///     return cfg;
///   }
using detail::TritonLaunch;

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
/// opforge::kernel::RowRegisters), between 32 and 1024 threads, and never more than the
/// kernel's registers a thread allow on one SM (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK), so such a
/// kernel takes any number of warps. A fixed `threads` above that fails the launch, naming the
/// kernel's most and its registers a thread.
inline detail::LaunchRule rows(std::string tensor, int32_t threads = 0) {
  detail::LaunchRule r;
  r.kind = detail::LaunchRule::kRows;
  r.tensor = std::move(tensor);
  r.threads = threads;
  return r;
}

}  // namespace opforge
