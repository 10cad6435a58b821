// opforge/op_launch.h -- how a run-time kernel is launched: the launch rules that follow
// `.cuda_source()` (part of opforge/op.h).
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

}  // namespace opforge
