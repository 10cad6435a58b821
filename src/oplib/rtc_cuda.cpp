// Run-time kernels compiled by NVRTC: compilation, the kernel cache's entries and module loading.
// The backend-neutral half (cache, names, geometry, argument order) is runtime_kernel.cpp; the
// launch through the driver API is cuda_launch.cpp. Linked into an op library only when it
// declares a .cuda_source() kernel.
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

#include "cuda_launch.h"

namespace opforge::detail {
namespace {

using cu::check_cu;
using cu::check_cuda;
using cu::cuda_type;
using cu::driver;
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
std::string device_target(int device) { return with_arch_features(target_for(cu::compute_capability(device))); }

/// Source, options and cache key of one instantiation, read fresh from the kernel folder.
struct Job {
  std::string path, display_path, source, name, arch, key;
  std::vector<std::string> options;
};

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
  throw InternalError(rtc::mismatch_message(
      "the run-time kernel " + name + " (" + rk.file + ") is declared (" + *declared + ")", expected,
      launch_values_known, cuda_type, "Note [Run-time kernels] in opforge/op_launch.h", problems));
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
      rtc::parameters_text(rtc::kernel_parameters(rk, arg_dtypes, out_dtypes, rtc::rule_launch_values(rk)), cuda_type);
  const Binary b = binary_for(make_job(rk, name, device_target(device), parameters), rtc::user_cache_dir(), hit);
  check_signature(rk, name, b, rtc::kernel_parameters(rk, arg_dtypes, out_dtypes, launch_count, map_count), true);
  // Loaded into the device's primary context (current: the adapter's device guard and
  // cu::launch made it so).
  const CUfunction fn = cu::load_function(b.image.data(), b.lowered_name, name);
  functions()[key] = fn;
  return fn;
}

}  // namespace

int32_t rtc_launch(const OpforgeCallFrame* frame, const void* user) {
  return guarded(frame, [&] { cu::launch(*static_cast<const RuntimeKernel*>(user), frame, cuda_type, &function_for); });
}

int32_t rtc_precompile(OpforgePrecompileRequest* request, const void* user) {
  return rtc::guarded_request(request, [&] {
    const auto& rk = *static_cast<const RuntimeKernel*>(user);
    const rtc::Requested r = rtc::requested(rk, *request, cuda_type);
    const std::string& name = r.name;
    std::lock_guard<std::mutex> lock(g_mutex);
    bool hit = false;
    const std::vector<rtc::KernelParameter> expected =
        rtc::kernel_parameters(rk, r.arg_dtypes, r.out_dtypes, rtc::rule_launch_values(rk));
    const Binary b = binary_for(make_job(rk, name, request->arch, rtc::parameters_text(expected, cuda_type)),
                                request->cache_dir ? request->cache_dir : rtc::user_cache_dir(), hit,
                                /*store_in_write_dir=*/true);
    check_signature(rk, name, b, expected, rtc::rule_launch_values(rk) >= 0);
    request->cache_hit = hit;
  });
}

// OpBuilder::cuda_source's step: here, so that only a library declaring a run-time kernel
// takes this file (and the CUDA libraries it needs) from the archive.
void OpDef::add_cuda_source(std::string source_file, std::string kernel_name) {
  add_runtime_kernel(RuntimeKernel::kNvrtc, std::move(source_file), std::move(kernel_name), &rtc_launch,
                     &rtc_precompile, &rtc_reload);
}

void rtc_reload() {
  std::lock_guard<std::mutex> lock(g_mutex);
  functions().clear();
  cu::forget_launches();
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
