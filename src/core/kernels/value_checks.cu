// The device half of Note [Device value checks] (src/core/device_checks.h): one launch checks
// every integer input of a call that declares a value domain, before the op's kernel runs. An
// element outside its domain prints the op's message and stops the kernel with a device-side
// assertion, which leaves the CUDA context in error: the op's kernel, queued after this one,
// never runs, so a bad index is never dereferenced, and the caller's next synchronisation
// raises "device-side assert triggered", as torch's own index kernels do.
//
// Compiled to PTX at build time (nvcc -ptx) and embedded in libopforge_core, which loads it
// with the CUDA driver on first use (the driver compiles PTX for any newer GPU).
#include <assert.h>
#include <stdint.h>

#include "../device_check_params.h"

namespace {

__device__ int64_t load(const OpforgeValueCheck& c, int64_t flat) {
  int64_t offset = 0;
  for (int32_t d = c.ndim - 1; d >= 0; --d) {
    offset += (flat % c.sizes[d]) * c.strides[d];
    flat /= c.sizes[d];
  }
  const char* p = static_cast<const char*>(c.data) + offset * c.item_size;
  switch (c.item_size) {
    case 1:
      return c.is_signed ? int64_t(*reinterpret_cast<const int8_t*>(p)) : int64_t(*reinterpret_cast<const uint8_t*>(p));
    case 2:
      return *reinterpret_cast<const int16_t*>(p);
    case 4:
      return *reinterpret_cast<const int32_t*>(p);
    default:
      return *reinterpret_cast<const int64_t*>(p);
  }
}

}  // namespace

// __grid_constant__: the checks are read in place from the parameter space. Without it, indexing
// the parameter by a run-time k copies all of it (1.4 KB) to each thread's local memory first,
// which made the check cost more than the op it guards (bench/RESULTS.md, seventeenth session).
//
// The op's kernel may be launched as this kernel's programmatic dependent (OpforgeContext::
// after_value_check): each block lets it start at once, and it waits (griddepcontrol.wait) for
// this grid to complete, and so for its verdict, before it touches memory through an index.
extern "C" __global__ void opforge_check_values(const __grid_constant__ OpforgeValueChecks checks) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int32_t k = 0; k < checks.count; ++k) {
    const OpforgeValueCheck& c = checks.checks[k];
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < c.numel; i += stride) {
      const int64_t v = load(c, i);
      if (c.has_sentinel && v == c.sentinel) continue;
      if (v < c.low || v >= c.high) {
        printf("%s, got %lld at flat index %lld\n", c.message, static_cast<long long>(v), static_cast<long long>(i));
        assert(false && "opforge: an index outside its declared value domain");
        return;
      }
    }
  }
}
