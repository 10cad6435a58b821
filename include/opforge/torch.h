// opforge/torch.h -- the PyTorch adapter's API (libopforge_torch), for C++ programs such as
// the AOTInductor runner. Python reaches the same functions through `opforge.load_library`.
//
//   #include <opforge/torch.h>
//   opforge::torch::load_library("build/lib/libsoftshrink.so");
//   // torch.ops.examples.softshrink now exists in the dispatcher (CPU, CUDA, Meta kernels)
//
// Not for op files: op files include only opforge/op.h.
#pragma once

#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::torch {

/// Loads the op library at `path` (a shared object built with opforge_add_library; loading and
/// validation are libopforge_core's, see opforge/core.h) and registers each of its ops with the
/// PyTorch dispatcher: the schema derived from the declaration, a CPU kernel (the reference), a
/// CUDA kernel if declared, a Meta kernel computed symbolically from the shape rules, and an
/// Autograd kernel for ops that name a backward op. Loading the same file again is a no-op.
///
/// Returns the library's JSON description (src/core/description.h).
/// Throws c10::ValueError if the file is not a valid op library (every problem on its own line,
/// "file:line: ns::op: ...") or one of its ops is already registered with torch, c10::Error if
/// it cannot be opened or loaded.
std::string load_library(const std::string& path);

/// dlopen(path, flags) for a shared object the host needs besides op libraries (the runner's C shim
/// libraries), after the check op libraries get too: a file shorter than its ELF headers describe
/// is an error, not a process killed by SIGBUS when the loader touches its missing pages. `what`
/// names the file in messages ("the C shim library"). Returns dlopen's handle. Throws
/// c10::ValueError for a truncated file, c10::Error where the file cannot be read or dlopen fails
/// (its message).
void* open_shared_object(const std::string& path, const std::string& what, int flags);

/// Qualified names ("ns::name") of every op registered by load_library so far.
std::vector<std::string> registered_ops();

/// The message of the first error an opforge op raised on this thread since the last call, then
/// cleared; empty if none. For hosts whose caller may swallow an op's exception: AOTInductor's
/// proxy executor logs it and the model can return an undefined output instead of failing, so
/// the runner asks after each run.
std::string take_call_error();

}  // namespace opforge::torch

extern "C" {
/// C entry for Python (ctypes): like opforge::torch::load_library. Sets *out (free with
/// opforge_core_free) to the library's description, or to the error JSON of opforge/core.h.
OpforgeStatus opforge_torch_load_library(const char* path, char** out);
}
