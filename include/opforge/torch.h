// opforge/torch.h -- the PyTorch adapter's API (libopforge_torch), for C++ programs such as
// the AOTInductor runner. Python reaches the same functions through `opforge.load_library`.
//
//   #include <opforge/torch.h>
//   opforge::torch::load_library("build/lib/libexamples_ops.so");
//   // torch.ops.examples.softshrink now exists in the dispatcher (CPU, CUDA, Meta kernels)
//
// Not for op files: op files include only opforge/op.h.
#pragma once

#include <string>
#include <vector>

namespace opforge::torch {

/// Loads the op library at `path` (a shared object built with opforge_add_library) and
/// registers each of its ops with the PyTorch dispatcher: the schema derived from the
/// declaration, a CPU kernel (the reference), a CUDA kernel if declared, and a Meta kernel
/// computed symbolically from the shape rules. Loading the same file again is a no-op.
///
/// Returns the library's JSON description (see opforge::core::library_json).
/// Throws c10::Error if the file cannot be opened, is not an opforge op library, was built
/// for another ABI version, has invalid declarations (every problem with its file:line), or
/// declares an op that another library already registered.
std::string load_library(const std::string& path);

/// Qualified names ("ns::name") of every op registered by load_library so far.
std::vector<std::string> registered_ops();

}  // namespace opforge::torch

extern "C" {
/// C entry for Python (ctypes): like opforge::torch::load_library. On success returns 0 and
/// sets *json (free with opforge_torch_free); on failure returns 1 for an invalid library
/// (ValueError) or 2 otherwise (RuntimeError) and sets *error.
int opforge_torch_load_library(const char* path, char** json, char** error);
void opforge_torch_free(char* p);
/// Fill every op output with NaN (integers: 123, bools: true) before its kernel runs, so
/// unwritten elements show (opforge verify turns this on).
void opforge_torch_set_poison_outputs(int enabled);
/// Forgets every compiled run-time kernel of every loaded library (opforge.reload()).
void opforge_torch_reload(void);
/// Compiles (or finds cached) the run-time kernels of op `name` ("ns::op") for one
/// instantiation: per argument, a tensor's OpforgeDtype in `dtypes`, an int/bool parameter in
/// `ints`, a float in `floats`, a string in `strings`. `arch` is e.g. "sm_90"; fresh binaries
/// go to `cache_dir`. Sets *cache_hit; returns 0, or 1/2 with *error set (free with
/// opforge_torch_free).
int opforge_torch_precompile(const char* name, int32_t num_args, const int32_t* dtypes, const int64_t* ints,
                             const double* floats, const char* const* strings, const char* arch,
                             const char* cache_dir, int32_t* cache_hit, char** error);
}
