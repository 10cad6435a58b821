// Run-time kernels on CUDA: NVRTC compilation, module loading and launch through the driver
// API. The backend-neutral half (cache, names, geometry, argument order) is runtime_kernel.cpp.
// Linked into an op library only when it declares a .cuda_source() kernel.
//
// NVRTC is opened with dlopen and the driver API is reached through the CUDA runtime's
// cudaGetDriverEntryPointByVersion, so an op library loads on machines without a GPU driver or
// NVRTC and needs them only when a run-time kernel first runs.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "opforge/detail/driver.h"
#include "runtime_kernel.h"

namespace opforge::detail {
namespace {

using rtc::env;

// ---- NVRTC and the driver API ---------------------------------------------------------------

struct Nvrtc {
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcGetErrorString) error_string = nullptr;
  decltype(&::nvrtcCreateProgram) create = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy = nullptr;
  decltype(&::nvrtcAddNameExpression) add_name = nullptr;
  decltype(&::nvrtcCompileProgram) compile = nullptr;
  decltype(&::nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) log = nullptr;
  decltype(&::nvrtcGetLoweredName) lowered_name = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) cubin = nullptr;
  decltype(&::nvrtcGetPTXSize) ptx_size = nullptr;
  decltype(&::nvrtcGetPTX) ptx = nullptr;
  decltype(&::nvrtcGetNumSupportedArchs) num_archs = nullptr;
  decltype(&::nvrtcGetSupportedArchs) archs = nullptr;
  int major = 0, minor = 0;
  std::string version_text;
  std::string load_error;
};

const Nvrtc& nvrtc() {
  static const Nvrtc lib = [] {
    Nvrtc n;
    std::vector<std::string> candidates;
    if (!env("OPFORGE_NVRTC").empty()) candidates.push_back(env("OPFORGE_NVRTC"));
    const std::string soname = "libnvrtc.so." + std::to_string(CUDA_VERSION / 1000);
    candidates.push_back(soname);
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
      if (!env(var).empty()) candidates.push_back(env(var) + "/lib64/" + soname);
    candidates.push_back("/usr/local/cuda/lib64/" + soname);
    void* h = nullptr;
    for (const auto& c : candidates)
      if ((h = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (h == nullptr) {
      n.load_error = "cannot load NVRTC (" + soname + "; set OPFORGE_NVRTC to its path)";
      return n;
    }
#define OPFORGE_NVRTC_SYM(field, sym) n.field = reinterpret_cast<decltype(n.field)>(::dlsym(h, #sym))
    OPFORGE_NVRTC_SYM(version, nvrtcVersion);
    OPFORGE_NVRTC_SYM(error_string, nvrtcGetErrorString);
    OPFORGE_NVRTC_SYM(create, nvrtcCreateProgram);
    OPFORGE_NVRTC_SYM(destroy, nvrtcDestroyProgram);
    OPFORGE_NVRTC_SYM(add_name, nvrtcAddNameExpression);
    OPFORGE_NVRTC_SYM(compile, nvrtcCompileProgram);
    OPFORGE_NVRTC_SYM(log_size, nvrtcGetProgramLogSize);
    OPFORGE_NVRTC_SYM(log, nvrtcGetProgramLog);
    OPFORGE_NVRTC_SYM(lowered_name, nvrtcGetLoweredName);
    OPFORGE_NVRTC_SYM(cubin_size, nvrtcGetCUBINSize);
    OPFORGE_NVRTC_SYM(cubin, nvrtcGetCUBIN);
    OPFORGE_NVRTC_SYM(ptx_size, nvrtcGetPTXSize);
    OPFORGE_NVRTC_SYM(ptx, nvrtcGetPTX);
    OPFORGE_NVRTC_SYM(num_archs, nvrtcGetNumSupportedArchs);
    OPFORGE_NVRTC_SYM(archs, nvrtcGetSupportedArchs);
#undef OPFORGE_NVRTC_SYM
    if (!n.version || !n.create || !n.compile || !n.cubin || !n.archs) {
      n.load_error = "the NVRTC library found lacks required functions";
      return n;
    }
    n.version(&n.major, &n.minor);
    n.version_text = std::to_string(n.major) + "." + std::to_string(n.minor);
    return n;
  }();
  if (!lib.load_error.empty()) throw InternalError("opforge: " + lib.load_error);
  return lib;
}

struct Driver {
  decltype(&::cuModuleLoadData) module_load = driver_entry_point<decltype(&::cuModuleLoadData)>("cuModuleLoadData");
  decltype(&::cuModuleGetFunction) get_function =
      driver_entry_point<decltype(&::cuModuleGetFunction)>("cuModuleGetFunction");
  decltype(&::cuLaunchKernel) launch = driver_entry_point<decltype(&::cuLaunchKernel)>("cuLaunchKernel");
  decltype(&::cuFuncSetAttribute) set_attribute =
      driver_entry_point<decltype(&::cuFuncSetAttribute)>("cuFuncSetAttribute");
  decltype(&::cuCtxGetCurrent) get_current_context =
      driver_entry_point<decltype(&::cuCtxGetCurrent)>("cuCtxGetCurrent");
};

const Driver& driver() {
  static const Driver d;
  if (!d.module_load || !d.get_function || !d.launch || !d.get_current_context)
    throw InternalError("opforge: the CUDA driver API is not available (no GPU driver?)");
  return d;
}

void check_cu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw InternalError(driver_error(r, what));
}

/// check_cu for the CUDA runtime; the error is cleared, not left for an unrelated launch check.
void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw InternalError(what + " failed: " + cudaGetErrorString(e));
}

/// The CUDA toolkit's include folder, for cuda_fp16.h and friends.
const std::string& cuda_include_dir() {
  static const std::string dir = [] {
    std::vector<std::string> roots;
    for (const char* var : {"OPFORGE_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"})
      if (!env(var).empty()) roots.push_back(env(var));
    roots.push_back("/usr/local/cuda");
    for (const auto& r : roots)
      if (rtc::is_file(r + "/include/cuda_fp16.h")) return r + "/include";
    return std::string();
  }();
  if (dir.empty())
    throw InternalError("opforge: CUDA headers (cuda_fp16.h) not found; set CUDA_HOME to the CUDA toolkit");
  return dir;
}

const char* cuda_type(int32_t dtype) {
  static const char* const kTypes[] = {"float",         "double",        "__half",       "__nv_bfloat16", "signed char",
                                       "short",         "int",           "long long",    "unsigned char", "bool",
                                       "__nv_fp8_e4m3", "__nv_fp8_e5m2", "__nv_fp8_e8m0"};
  static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == OPFORGE_NUM_DTYPES, "a CUDA type per OpforgeDtype");
  return (dtype >= 0 && dtype < OPFORGE_NUM_DTYPES) ? kTypes[dtype] : "void";
}

// ---- compilation ----------------------------------------------------------------------------

using rtc::Binary;

/// Compiles `name` from `source` with NVRTC for `arch` ("sm_90"). Compile errors name the
/// source file and line (NVRTC's "file(line): error: ..." log).
Binary compile(const std::string& display_path, const std::string& source, const std::string& name,
               const std::string& arch, const std::vector<std::string>& options) {
  const Nvrtc& n = nvrtc();
  nvrtcProgram prog = nullptr;
  if (n.create(&prog, source.c_str(), display_path.c_str(), 0, nullptr, nullptr) != NVRTC_SUCCESS)
    throw InternalError("opforge: nvrtcCreateProgram failed for " + display_path);
  struct Destroy {
    const Nvrtc& n;
    nvrtcProgram* p;
    ~Destroy() { n.destroy(p); }
  } destroy{n, &prog};
  n.add_name(prog, name.c_str());
  std::vector<const char*> opts;
  for (const auto& o : options) opts.push_back(o.c_str());
  const nvrtcResult r = n.compile(prog, static_cast<int>(opts.size()), opts.data());
  size_t log_size = 0;
  n.log_size(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 1) n.log(prog, log.data());
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  if (r != NVRTC_SUCCESS)
    throw InternalError("compiling " + name + " from " + display_path + " for " + arch + " failed:\n" + log);
  Binary b;
  const char* lowered = nullptr;
  if (n.lowered_name(prog, name.c_str(), &lowered) != NVRTC_SUCCESS || lowered == nullptr)
    throw InternalError("compiling " + display_path + ": no kernel named " + name + " (is it a __global__ function?)");
  b.lowered_name = lowered;
  size_t size = 0;
  if (arch.rfind("sm_", 0) == 0) {
    n.cubin_size(prog, &size);
    b.image.resize(size);
    n.cubin(prog, b.image.data());
  } else {
    n.ptx_size(prog, &size);
    b.image.resize(size);
    n.ptx(prog, b.image.data());
  }
  return b;
}

/// The target for a device of compute capability `cc` (e.g. 90): machine code if NVRTC knows
/// the architecture, else PTX for the newest one it knows (the driver compiles that at load).
std::string target_for(int cc) {
  const Nvrtc& n = nvrtc();
  int count = 0;
  n.num_archs(&count);
  std::vector<int> archs(count);
  if (count > 0) n.archs(archs.data());
  int best = 0;
  for (int a : archs) {
    if (a == cc) return "sm_" + std::to_string(cc);
    if (a < cc) best = std::max(best, a);
  }
  if (best == 0)
    throw InternalError("opforge: NVRTC " + n.version_text + " cannot compile for sm_" + std::to_string(cc));
  return "compute_" + std::to_string(best);
}

/// The -arch NVRTC gets for a requested target: machine code for compute capability 9.0 is
/// built as sm_90a (NVRTC 12.0 or newer), with Hopper's architecture-specific instructions
/// (wgmma, setmaxnreg) that kernels may use under `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)`;
/// such code runs on 9.0 devices only, which is what "sm_90" machine code targets anyway (the
/// choice torch's and Triton's Hopper builds make). Other targets are used as given.
std::string with_arch_features(const std::string& arch) {
  return arch == "sm_90" && nvrtc().major >= 12 ? "sm_90a" : arch;
}

/// The NVRTC target of run-time kernels launched on CUDA device `device`.
std::string device_target(int device) {
  int major = 0, minor = 0;
  const std::string what = "opforge: querying the compute capability of CUDA device " + std::to_string(device);
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), what);
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), what);
  return with_arch_features(target_for(major * 10 + minor));
}

/// Source, options and cache key of one instantiation, read fresh from the kernel folder.
struct Job {
  std::string path, display_path, source, name, arch, key;
  std::vector<std::string> options;
};

/// How many int64 launch values precede the parameters: elementwise 1 (n), rows 2 (rows,
/// cols), a grid function's as many as it returns (-1: known only once it has run).
int32_t launch_values(const RuntimeKernel& rk) {
  return rk.rule.kind == LaunchRule::kElementwise ? 1 : rk.rule.kind == LaunchRule::kRows ? 2 : -1;
}

/// `parameters`: what the instantiation is passed (rtc::parameters_text), part of the cache key,
/// so a change of an output's dtype rule or of a parameter's type is never served an old binary.
Job make_job(const RuntimeKernel& rk, const std::string& name, const std::string& arch, const std::string& parameters) {
  Job j;
  j.path = kernel_dir() + "/" + rk.file;
  if (!rtc::read_file(j.path, j.source))
    throw InternalError("the run-time kernel source " + j.path +
                        " cannot be read (it ships beside the op library, in " + kernel_dir() + ")");
  j.display_path = rtc::real_path(j.path);
  j.name = name;
  j.arch = with_arch_features(arch);
  // The device headers the build put in the kernel folder's opforge/ (opforge_add_library): a
  // kernel may include any of them, so each one's text is part of the key.
  std::string header;
  for (const std::string& h : rtc::files_in(kernel_dir() + "/opforge")) {
    std::string text;
    rtc::read_file(kernel_dir() + "/opforge/" + h, text);
    header += h + "\n" + text;
  }
  j.options = {"--std=c++17",       "-arch=" + j.arch,         "-lineinfo",
               "-I" + kernel_dir(), "-I" + cuda_include_dir(), "-I" + cuda_include_dir() + "/cccl",
               "-DOPFORGE_RTC=1"};
  j.key = "opforge-rtc-v2\nnvrtc " + nvrtc().version_text + "\narch " + j.arch + "\nname " + name + "\nparameters " +
          parameters + "\noptions";
  for (const auto& o : j.options)
    if (o.rfind("-I", 0) != 0) j.key += " " + o;  // include folders may move; their contents count below
  j.key += "\nsource " + std::to_string(j.source.size()) + "\n" + j.source + "\nheader\n" + header;
  return j;
}

/// The binary of `job` from a cache (rtc::find_cached), else compiled now and stored in
/// `write_dir`; `hit` says whether it was cached.
Binary binary_for(const Job& job, const std::string& write_dir, bool& hit, bool store_in_write_dir = false) {
  Binary b;
  hit = rtc::find_cached(job.key, write_dir, store_in_write_dir, b);
  if (hit) return b;
  b = compile(job.display_path, job.source, job.name, job.arch, job.options);
  rtc::store(write_dir, job.key, b);
  return b;
}

/// Refuses a kernel whose declared parameters differ from what opforge passes (`expected`):
/// InternalError naming each parameter, the type expected and the type found. extern "C"
/// kernels have no types in their names and are not checked.
void check_signature(const RuntimeKernel& rk, const std::string& name, const Binary& b,
                     const std::vector<rtc::KernelParameter>& expected, bool launch_values_known) {
  const std::optional<std::string> declared = rtc::demangled_parameters(b.lowered_name);
  if (!declared) return;
  const std::vector<std::string> problems =
      rtc::signature_problems(*declared, expected, launch_values_known, cuda_type);
  if (problems.empty()) return;
  std::string message = "the run-time kernel " + name + " (" + rk.file + ") is declared (" + *declared +
                        ") but is passed (" + rtc::parameters_text(expected, cuda_type, !launch_values_known) +
                        "); see Note [Run-time kernels] in opforge/op_launch.h:";
  for (const auto& p : problems) message += "\n  " + p;
  throw InternalError(message);
}

// ---- loaded functions -----------------------------------------------------------------------

std::mutex g_mutex;
std::map<std::tuple<const RuntimeKernel*, std::string, int>, CUfunction>& functions() {
  static std::map<std::tuple<const RuntimeKernel*, std::string, int>, CUfunction> m;
  return m;
}

/// The loaded function of instantiation `name` on `device`, compiled (or found cached) and its
/// signature checked on first use; `launch_count`: the launch's int64 values, `map_count` its
/// tensor maps.
CUfunction function_for(const RuntimeKernel& rk, const std::string& name, int device,
                        const std::vector<int32_t>& arg_dtypes, const std::vector<int32_t>& out_dtypes,
                        int32_t launch_count, int32_t map_count) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto key = std::make_tuple(&rk, name, device);
  auto it = functions().find(key);
  if (it != functions().end()) return it->second;
  bool hit = false;
  const std::string parameters =
      rtc::parameters_text(rtc::kernel_parameters(rk, arg_dtypes, out_dtypes, launch_values(rk)), cuda_type);
  const Binary b = binary_for(make_job(rk, name, device_target(device), parameters), rtc::user_cache_dir(), hit);
  check_signature(rk, name, b, rtc::kernel_parameters(rk, arg_dtypes, out_dtypes, launch_count, map_count), true);
  // Loaded into the device's primary context (current: the adapter's device guard and
  // bind_primary_context made it so).
  // Modules are never unloaded: after reload() work already queued may still use them.
  CUmodule module = nullptr;
  check_cu(driver().module_load(&module, b.image.data()), "cuModuleLoadData");
  CUfunction fn = nullptr;
  check_cu(driver().get_function(&fn, module, b.lowered_name.c_str()), "cuModuleGetFunction");
  functions()[key] = fn;
  return fn;
}

/// Makes `device`'s primary context current on this thread if no context is. The driver API
/// (cuModuleLoadData, cuLaunchKernel) works in the current context, and a thread that has only
/// made CUDA runtime calls may have none: torch's autograd engine runs backward ops on a device
/// thread whose device guard skips cudaSetDevice when the index already matches
/// (c10::cuda::SetDevice), so a backward op's first launch there failed with "invalid device
/// context". cudaSetDevice binds the device's primary context, the one the runtime and torch
/// use, at once (CUDA 12 and later).
void bind_primary_context(int device) {
  CUcontext current = nullptr;
  check_cu(driver().get_current_context(&current), "cuCtxGetCurrent");
  if (current != nullptr) return;
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
}

// ---- the per-thread launch cache ------------------------------------------------------------

/// Bumped by rtc_reload: launch-cache entries of an older generation are not used.
std::atomic<uint64_t> g_generation{0};

/// Dynamic shared memory a function may take without cuFuncSetAttribute.
constexpr size_t kDefaultSharedBytes = 48 * 1024;

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
};

/// The loaded function for this call. Each thread keeps the instantiations it launched (at most
/// kEntries, then starts over), so that a launch of a known instantiation builds no name, takes
/// no lock and allocates nothing; the first launch on a thread goes through function_for.
CachedLaunch& cached_function(const RuntimeKernel& rk, const OpforgeCallFrame* f, const LaunchConfig& cfg) {
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
  probe.name = rtc::instantiate(rk, arg_dtypes, out_dtypes, values.data(), cuda_type);
  probe.fn = function_for(rk, probe.name, probe.device, arg_dtypes, out_dtypes, static_cast<int32_t>(cfg.args.size()),
                          static_cast<int32_t>(cfg.tensor_maps.size()));
  probe.generation = generation;
  probe.shared_allowed = kDefaultSharedBytes;
  if (!keyed) return probe;
  if (cache.size() == kEntries) cache.clear();
  cache.push_back(probe);
  return cache.back();
}

void launch(const RuntimeKernel& rk, const OpforgeCallFrame* f) {
  const std::optional<LaunchConfig> cfg = rtc::launch_config(rk, f);
  if (!cfg) return;
  bind_primary_context(f->ctx->device_index);
  CachedLaunch& target = cached_function(rk, f, *cfg);
  rtc::KernelArguments args(rk, f, *cfg);
  if (cfg->shared_bytes > target.shared_allowed && driver().set_attribute) {  // once per function and size
    check_cu(driver().set_attribute(target.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    static_cast<int>(cfg->shared_bytes)),
             "cuFuncSetAttribute");
    target.shared_allowed = cfg->shared_bytes;
  }
  const CUresult r =
      driver().launch(target.fn, cfg->grid[0], cfg->grid[1], cfg->grid[2], cfg->block[0], cfg->block[1], cfg->block[2],
                      cfg->shared_bytes, static_cast<CUstream>(f->ctx->stream), args.params(), nullptr);
  if (r != CUDA_SUCCESS) check_cu(r, ("cuLaunchKernel(" + target.name + ")").c_str());
}

}  // namespace

int32_t rtc_launch(const OpforgeCallFrame* frame, const void* user) {
  return guarded(frame, [&] { launch(*static_cast<const RuntimeKernel*>(user), frame); });
}

int32_t rtc_precompile(OpforgePrecompileRequest* request, const void* user) {
  OpforgeCallFrame errors{};
  errors.error = request->error;
  errors.error_capacity = request->error_capacity;
  return guarded(&errors, [&] {
    const auto& rk = *static_cast<const RuntimeKernel*>(user);
    const OpforgeOpSpec& spec = *rk.def->spec();
    std::vector<int32_t> arg_dtypes(request->dtypes, request->dtypes + spec.num_args), out_dtypes;
    for (int32_t o = 0; o < spec.num_outputs; ++o) out_dtypes.push_back(rtc::output_dtype(spec.outputs[o], arg_dtypes));
    const std::string name = rtc::instantiate(rk, arg_dtypes, out_dtypes, request->values, cuda_type);
    std::lock_guard<std::mutex> lock(g_mutex);
    bool hit = false;
    const std::vector<rtc::KernelParameter> expected =
        rtc::kernel_parameters(rk, arg_dtypes, out_dtypes, launch_values(rk));
    const Binary b = binary_for(make_job(rk, name, request->arch, rtc::parameters_text(expected, cuda_type)),
                                request->cache_dir ? request->cache_dir : rtc::user_cache_dir(), hit,
                                /*store_in_write_dir=*/true);
    check_signature(rk, name, b, expected, launch_values(rk) >= 0);
    request->cache_hit = hit;
  });
}

// OpBuilder::cuda_source's step: here, so that only a library declaring a run-time kernel
// takes this file (and the CUDA libraries it needs) from the archive.
void OpDef::add_cuda_source(std::string source_file, std::string kernel_name) {
  auto rk = std::make_unique<RuntimeKernel>();
  rk->def = this;
  rk->file = std::move(source_file);
  rk->name = std::move(kernel_name);
  OpforgeKernel k{};
  k.struct_size = sizeof(OpforgeKernel);
  k.device_type = OPFORGE_DEVICE_CUDA;
  k.fn = &rtc_launch;
  k.user = rk.get();
  k.source = rk->file.c_str();
  k.name = rk->name.c_str();
  k.precompile = &rtc_precompile;
  k.backend = OPFORGE_BACKEND_NVRTC;
  kernels.push_back(k);
  runtime_kernels.push_back(std::move(rk));
  registry().add_reload(&rtc_reload);
}

void rtc_reload() {
  std::lock_guard<std::mutex> lock(g_mutex);
  functions().clear();
  g_generation.fetch_add(1, std::memory_order_release);
}

}  // namespace opforge::detail

namespace opforge {

TensorMap tensor_map(const Tensor& t, std::initializer_list<uint32_t> box, TensorMapSwizzle swizzle) {
  const detail::rtc::TensorMapLayout l = detail::rtc::tensor_map_layout(t, box.begin(), box.size(), swizzle);
  // int8, uint8, bool and the float8 dtypes: copies move bytes (no float8 arithmetic on the way).
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  switch (t.dtype()) {
    case kFloat16:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
      break;
    case kBFloat16:
      type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
      break;
    case kFloat32:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
      break;
    case kFloat64:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
      break;
    case kInt16:
      type = CU_TENSOR_MAP_DATA_TYPE_UINT16;
      break;
    case kInt32:
      type = CU_TENSOR_MAP_DATA_TYPE_INT32;
      break;
    case kInt64:
      type = CU_TENSOR_MAP_DATA_TYPE_INT64;
      break;
    default:
      break;
  }
  static_assert(sizeof(CUtensorMap) == sizeof(TensorMap::bytes) && alignof(CUtensorMap) <= alignof(TensorMap));
  static_assert(static_cast<int>(TensorMapSwizzle::kNone) == CU_TENSOR_MAP_SWIZZLE_NONE &&
                static_cast<int>(TensorMapSwizzle::k32B) == CU_TENSOR_MAP_SWIZZLE_32B &&
                static_cast<int>(TensorMapSwizzle::k64B) == CU_TENSOR_MAP_SWIZZLE_64B &&
                static_cast<int>(TensorMapSwizzle::k128B) == CU_TENSOR_MAP_SWIZZLE_128B);
  TensorMap out;
  const CUresult r = detail::encode_tiled_tensor_map(
      *reinterpret_cast<CUtensorMap*>(out.bytes), type, l.rank, t.raw_data(), l.dims, l.strides, box.begin(),
      static_cast<CUtensorMapSwizzle>(swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  if (r == CUDA_ERROR_NOT_SUPPORTED)
    throw InternalError(
        "opforge::tensor_map: the CUDA driver has no cuTensorMapEncodeTiled (it needs a CUDA 12 driver)");
  if (r != CUDA_SUCCESS) throw InternalError(detail::driver_error(r, "opforge::tensor_map: cuTensorMapEncodeTiled"));
  return out;
}

const std::string& kernel_target(const Tensor& t) {
  static const std::string none;
  if (!t.is_cuda()) return none;
  // Asked on every launch of a grid function that uses it: computed once per device, then a
  // call_once check (an atomic load) and a reference.
  constexpr int kDevices = 64;
  static std::string targets[kDevices];
  static std::once_flag once[kDevices];
  const int d = t.device_index();
  if (d < 0 || d >= kDevices) {
    thread_local std::string target;
    return target = detail::device_target(d);
  }
  std::call_once(once[d], [d] { targets[d] = detail::device_target(d); });
  return targets[d];
}

}  // namespace opforge
