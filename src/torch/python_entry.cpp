// The torch adapter's C entry points for Python (ctypes): see opforge/torch.h.
#include <c10/util/Exception.h>

#include "../core/c_entry.h"
#include "opforge/torch.h"

extern "C" OpforgeStatus opforge_torch_load_library(const char* path, char** out) {
  return opforge::core::c_entry(out, [&] {
    try {
      return opforge::torch::load_library(path);
    } catch (const c10::ValueError& e) {  // opforge's InvalidArgument, as torch raised it
      throw opforge::InvalidArgument(e.what_without_backtrace());
    } catch (const c10::Error& e) {
      throw opforge::InternalError(e.what_without_backtrace());
    }
  });
}
