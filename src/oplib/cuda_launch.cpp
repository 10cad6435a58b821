// The launch of run-time kernels through the CUDA driver (see cuda_launch.h).
#include "cuda_launch.h"

#include <algorithm>
#include <atomic>
#include <optional>

namespace opforge::detail::cu {

const Driver& driver() {
  static const Driver d;
  if (!d.module_load || !d.get_function || !d.launch_ex || !d.get_current_context)
    throw InternalError("opforge: the CUDA driver API is not available (no GPU driver?)");
  return d;
}

void check_cu(CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS) throw InternalError(driver_error(r, what.c_str()));
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw InternalError(what + " failed: " + cudaGetErrorString(e));
}

const char* cuda_type(int32_t dtype) {
  static const char* const kTypes[] = {"float",         "double",        "__half",       "__nv_bfloat16", "signed char",
                                       "short",         "int",           "long long",    "unsigned char", "bool",
                                       "__nv_fp8_e4m3", "__nv_fp8_e5m2", "__nv_fp8_e8m0"};
  static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == OPFORGE_NUM_DTYPES, "a CUDA type per OpforgeDtype");
  return (dtype >= 0 && dtype < OPFORGE_NUM_DTYPES) ? kTypes[dtype] : "void";
}

int compute_capability(int device) {
  constexpr int kDevices = 64;  // asked on every Triton launch: once per device
  static std::atomic<int> known[kDevices] = {};
  const bool cached = device >= 0 && device < kDevices;
  if (cached && known[device].load(std::memory_order_relaxed) != 0)
    return known[device].load(std::memory_order_relaxed);
  int major = 0, minor = 0;
  const std::string what = "opforge: querying the compute capability of CUDA device " + std::to_string(device);
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), what);
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), what);
  if (cached) known[device].store(major * 10 + minor, std::memory_order_relaxed);
  return major * 10 + minor;
}

/// The driver API (cuModuleLoadData, cuLaunchKernelEx) works in the current context, and a
/// thread that has only made CUDA runtime calls may have none: torch's autograd engine runs
/// backward ops on a device thread whose device guard skips cudaSetDevice when the index already
/// matches (c10::cuda::SetDevice), so a backward op's first launch there failed with "invalid
/// device context". cudaSetDevice binds the device's primary context, the one the runtime and
/// torch use, at once (CUDA 12 and later).
void bind_primary_context(int device) {
  CUcontext current = nullptr;
  check_cu(driver().get_current_context(&current), "cuCtxGetCurrent");
  if (current != nullptr) return;
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
}

void allow_dynamic_shared(CUfunction fn, size_t bytes) {
  if (driver().set_attribute == nullptr) return;  // a driver without it launches within the default
  check_cu(driver().set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes)),
           "cuFuncSetAttribute");
}

CUfunction load_function(const void* image, const std::string& symbol, const std::string& what) {
  CUmodule module = nullptr;
  check_cu(driver().module_load(&module, image), "cuModuleLoadData (" + what + ")");
  CUfunction fn = nullptr;
  check_cu(driver().get_function(&fn, module, symbol.c_str()), "cuModuleGetFunction (" + symbol + ")");
  return fn;
}

int max_threads_per_block(CUfunction fn) {
  int most = 1024;
  if (driver().get_attribute == nullptr ||
      driver().get_attribute(&most, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn) != CUDA_SUCCESS)
    return 1024;
  return most;
}

void launch_function(CUfunction fn, const Geometry& g, CUstream stream, void** params, const char* name) {
  CUlaunchConfig cfg{};
  cfg.gridDimX = g.grid[0];
  cfg.gridDimY = g.grid[1];
  cfg.gridDimZ = g.grid[2];
  cfg.blockDimX = g.block[0];
  cfg.blockDimY = g.block[1];
  cfg.blockDimZ = g.block[2];
  cfg.sharedMemBytes = g.shared_bytes;
  cfg.hStream = stream;
  CUlaunchAttribute attrs[4];
  unsigned n = 0;
  if (g.pdl) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (g.cooperative) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n++].value.cooperative = 1;
  }
  if (g.cluster_x != 1) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = g.cluster_x;
    attrs[n].value.clusterDim.y = attrs[n].value.clusterDim.z = 1;
    ++n;
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n++].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  const CUresult r = driver().launch_ex(&cfg, fn, params, nullptr);
  if (r == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) {
    const unsigned threads = g.block[0] * g.block[1] * g.block[2];
    const int most = max_threads_per_block(fn);
    int registers = 0;
    if (driver().get_attribute != nullptr) driver().get_attribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, fn);
    if (threads > static_cast<unsigned>(most))
      throw InternalError(driver_error(r, (std::string("cuLaunchKernelEx(") + name + ")").c_str()) + ": a block of " +
                          std::to_string(threads) + " threads, and the kernel takes at most " + std::to_string(most) +
                          " (" + std::to_string(registers) + " registers a thread); declare it `__global__ void " +
                          "__launch_bounds__(" + std::to_string(threads) +
                          ")` so that the compiler fits that many, or launch fewer threads");
  }
  if (r != CUDA_SUCCESS) check_cu(r, std::string("cuLaunchKernelEx(") + name + ")");
}

namespace {

/// Bumped by forget_launches: launch-cache entries of an older generation are not used.
std::atomic<uint64_t> g_generation{0};

/// One instantiation a thread has launched: the kernel, device and instantiation key
/// (rtc::instantiation_key), the loaded function and its name, and the dynamic shared memory
/// the function has been allowed (raised by launch when a launch needs more).
struct CachedLaunch {
  static constexpr int kMaxKey = 24;
  const RuntimeKernel* rk = nullptr;
  int device = -1;
  uint64_t generation = 0;
  int32_t size = 0;
  int64_t key[kMaxKey] = {};
  CUfunction fn = nullptr;
  std::string name;
  size_t shared_allowed = kDefaultSharedBytes;
  unsigned max_threads = 1024;  ///< max_threads_per_block, whole warps
};

/// The loaded function for this call. Each thread keeps the instantiations it launched (at most
/// kEntries, then starts over), so that a launch of a known instantiation builds no name, takes
/// no lock and allocates nothing; the first launch on a thread goes through `load`.
CachedLaunch& cached_function(const RuntimeKernel& rk, const OpforgeCallFrame* f, const LaunchConfig& cfg,
                              const char* (*type_name)(int32_t), Loader load) {
  constexpr size_t kEntries = 64;
  thread_local std::vector<CachedLaunch> cache;
  thread_local CachedLaunch probe;
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  probe.rk = &rk;
  probe.device = f->ctx->device_index;
  const bool keyed = rtc::instantiation_key(rk, f, probe.key, CachedLaunch::kMaxKey, probe.size);
  if (keyed) {
    for (CachedLaunch& e : cache)
      if (e.rk == probe.rk && e.device == probe.device && e.generation == generation && e.size == probe.size &&
          std::equal(e.key, e.key + e.size, probe.key))
        return e;
  }
  const OpDef& def = *rk.def;
  std::vector<int32_t> arg_dtypes(f->num_args, -1), out_dtypes(f->num_outputs);
  std::vector<OpforgeValue> values(f->num_args);
  for (int32_t i = 0; i < f->num_args; ++i) {
    if (def.args[i].kind == OPFORGE_ARG_TENSOR) arg_dtypes[i] = f->args[i].tensor.dtype;
    values[i] = f->args[i].value;
  }
  for (int32_t o = 0; o < f->num_outputs; ++o) out_dtypes[o] = f->outputs[o].dtype;
  probe.name = rtc::instantiate(rk, arg_dtypes, out_dtypes, values.data(), type_name);
  probe.fn = load(rk, probe.name, probe.device, arg_dtypes, out_dtypes, static_cast<int32_t>(cfg.args.size()),
                  static_cast<int32_t>(cfg.tensor_maps.size()));
  probe.generation = generation;
  probe.shared_allowed = kDefaultSharedBytes;
  probe.max_threads = static_cast<unsigned>(std::max(32, max_threads_per_block(probe.fn) / 32 * 32));
  if (!keyed) return probe;
  if (cache.size() == kEntries) cache.clear();
  cache.push_back(probe);
  return cache.back();
}

}  // namespace

void launch(const RuntimeKernel& rk, const OpforgeCallFrame* f, const char* (*type_name)(int32_t dtype), Loader load) {
  thread_local LaunchConfig cfg;  // its argument storage outlives the call: no allocation per launch
  if (!rtc::launch_config(rk, f, cfg)) return;
  bind_primary_context(f->ctx->device_index);
  CachedLaunch& target = cached_function(rk, f, cfg, type_name, load);
  rtc::KernelArguments args(rk, f, cfg);
  if (cfg.shared_bytes > target.shared_allowed) {  // once per function and size
    allow_dynamic_shared(target.fn, cfg.shared_bytes);
    target.shared_allowed = cfg.shared_bytes;
  }
  Geometry g;
  for (int k = 0; k < 3; ++k) g.grid[k] = cfg.grid[k], g.block[k] = cfg.block[k];
  // opforge::rows() picks its threads where the kernel leaves it the choice (threads 0, any
  // number of warps): never more than the kernel's registers allow.
  if (rk.rule.kind == LaunchRule::kRows && rk.rule.threads <= 0 && g.block[0] > target.max_threads)
    g.block[0] = target.max_threads;
  g.shared_bytes = cfg.shared_bytes;
  // The value check just queued on this stream lets the kernel start (sm_90 or newer: programmatic
  // dependent launch); the kernel waits for its verdict (OpforgeContext::after_value_check).
  g.pdl = rk.waits_for_value_checks && opforge::Context(*f->ctx).after_value_check() &&
          compute_capability(f->ctx->device_index) >= 90;
  launch_function(target.fn, g, static_cast<CUstream>(f->ctx->stream), args.params(), target.name.c_str());
}

void forget_launches() { g_generation.fetch_add(1, std::memory_order_release); }

}  // namespace opforge::detail::cu
