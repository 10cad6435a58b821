// Prebuilt kernels (Note [Prebuilt kernels] in opforge/op_launch.h): a cubin, fatbin or PTX file
// of the library's kernel folder, read once per process (and again after a reload), its kernel
// checked against what opforge passes (the parameter sizes the binary records, the types of a
// C++-mangled symbol), loaded by the CUDA driver (which compiles PTX for the GPU) and launched as
// NVRTC kernels are (cuda_launch.cpp). What the file says of itself without a GPU is read by
// kernel_image.cpp. Linked into an op library only when it declares a .cuda_binary() kernel.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_launch.h"
#include "kernel_image.h"

namespace opforge::detail {
namespace {

using cu::check_cu;
using cu::cuda_type;
using cu::driver;

/// What `{T}` and `{T_<tensor>}` become in a prebuilt kernel's symbol: the dtype's name
/// ("float32", "bfloat16").
const char* symbol_type(int32_t dtype) { return dtype_name(dtype); }

std::string subject(const RuntimeKernel& rk, const std::string& symbol) {
  return "the prebuilt kernel " + symbol + " of " + rk.file;
}

/// A kernel's file as read for this process (until a reload), and its modules per device.
struct Image {
  std::string bytes;  // std::string keeps a NUL after the data: PTX loads as a C string
  std::vector<image::Code> codes;
  std::map<int, CUmodule> modules;
};

std::mutex g_mutex;
std::map<const RuntimeKernel*, Image>& images() {
  static std::map<const RuntimeKernel*, Image> m;
  return m;
}
std::map<std::tuple<const RuntimeKernel*, std::string, int>, CUfunction>& functions() {
  static std::map<std::tuple<const RuntimeKernel*, std::string, int>, CUfunction> m;
  return m;
}

/// The kernel's file, read on first use; the caller holds g_mutex. Throws InternalError naming
/// the kernel where the file cannot be read, is no cubin, fatbin or PTX, or is damaged.
Image& image_of(const RuntimeKernel& rk) {
  auto it = images().find(&rk);
  if (it != images().end()) return it->second;
  Image img;
  const std::string path = kernel_dir() + "/" + rk.file;
  if (!rtc::read_file(path, img.bytes))
    throw InternalError(subject(rk, rk.name) + ": " + path + " cannot be read (it ships beside the op library, in " +
                        kernel_dir() + ")");
  try {
    img.codes = image::read(img.bytes);
  } catch (const InternalError& e) {
    throw InternalError(subject(rk, rk.name) + ": " + path + " is " + e.what());
  }
  return images().emplace(&rk, std::move(img)).first->second;
}

/// The code of `img` the driver runs on a GPU of compute capability `cc`; throws naming what
/// the file holds where none runs there.
const image::Code& code_for(const RuntimeKernel& rk, const std::string& symbol, const Image& img, int cc) {
  if (const image::Code* code = image::code_for(img.codes, cc)) return *code;
  throw InternalError(subject(rk, symbol) + ": the file holds " + image::describe(img.codes) +
                      " and no code that runs on sm_" + std::to_string(cc) +
                      " (machine code runs on GPUs of its major version and at least its minor; PTX on its "
                      "architecture and newer)");
}

/// Throws naming the kernels `code` has (sorted), where it has none named `symbol`.
[[noreturn]] void no_such_kernel(const RuntimeKernel& rk, const std::string& symbol, const image::Code& code) {
  std::vector<std::string> names;
  for (const image::Kernel& k : code.kernels) names.push_back(k.name);
  std::sort(names.begin(), names.end());
  std::string listed;
  for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
  throw InternalError(subject(rk, symbol) + ": its " + code.describe() + " has no kernel named " + symbol +
                      (code.readable ? " (its kernels: " + (listed.empty() ? std::string("none") : listed) + ")" : ""));
}

/// Refuses a kernel whose parameters differ from what opforge passes (`expected`): the types a
/// C++-mangled symbol declares, then the sizes `sizes` (`read_by` says who read them: "as the
/// driver reads them"), where known. InternalError naming the kernel, its file and each parameter.
void check_parameters(const RuntimeKernel& rk, const std::string& symbol,
                      const std::optional<std::vector<uint32_t>>& sizes, const std::string& read_by,
                      const std::vector<rtc::KernelParameter>& expected, bool launch_values_known) {
  constexpr const char* kNote = "Note [Prebuilt kernels] in opforge/op_launch.h";
  if (const std::optional<std::string> declared = rtc::demangled_parameters(symbol)) {
    const std::vector<std::string> problems =
        rtc::signature_problems(*declared, expected, launch_values_known, cuda_type);
    if (!problems.empty())
      throw InternalError(rtc::mismatch_message(subject(rk, symbol) + " is declared (" + *declared + ")", expected,
                                                launch_values_known, cuda_type, kNote, problems));
  }
  if (!sizes) return;
  const std::vector<std::string> problems = rtc::size_problems(*sizes, expected, launch_values_known, cuda_type);
  if (problems.empty()) return;
  std::string listed;
  for (uint32_t s : *sizes) listed += (listed.empty() ? "" : ", ") + std::to_string(s);
  const std::string has = listed.empty() ? " has no parameters" : " has parameters of " + listed + " bytes";
  throw InternalError(rtc::mismatch_message(subject(rk, symbol) + has + " (" + read_by + ")", expected,
                                            launch_values_known, cuda_type, kNote, problems));
}

/// The module of `img` in `device`'s (current, primary) context, loaded on first use; the
/// driver compiles PTX for the GPU here, and its log is part of a failure's message.
CUmodule module_for(const RuntimeKernel& rk, Image& img, int device) {
  auto it = img.modules.find(device);
  if (it != img.modules.end()) return it->second;
  char log[8192] = {};
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log, reinterpret_cast<void*>(uintptr_t{sizeof(log) - 1})};
  CUmodule module = nullptr;
  const CUresult r = driver().module_load_ex ? driver().module_load_ex(&module, img.bytes.c_str(), 2, options, values)
                                             : driver().module_load(&module, img.bytes.c_str());
  if (r != CUDA_SUCCESS)
    throw InternalError(subject(rk, rk.name) + ": " + driver_error(r, "loading it (cuModuleLoadDataEx)") +
                        (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                             ? " (the PTX is of a newer ISA version than this driver compiles: ship a cubin, or PTX "
                               "written by an older CUDA)"
                             : "") +
                        (log[0] != '\0' ? std::string(":\n") + log : std::string()));
  // Modules are never unloaded: after reload() work already queued may still use them.
  return img.modules[device] = module;
}

/// The sizes of `fn`'s parameters as the driver reads them (cuFuncGetParamInfo, CUDA 12.4), or
/// nullopt where the driver is older or reads none (the file's records are used instead).
std::optional<std::vector<uint32_t>> driver_parameter_sizes(CUfunction fn) {
  if (driver().func_param_info == nullptr) return std::nullopt;
  std::vector<uint32_t> sizes;
  size_t offset = 0, size = 0;
  for (CUresult r; (r = driver().func_param_info(fn, sizes.size(), &offset, &size)) != CUDA_ERROR_INVALID_VALUE;) {
    if (r != CUDA_SUCCESS) return std::nullopt;
    sizes.push_back(static_cast<uint32_t>(size));
  }
  if (sizes.empty()) return std::nullopt;  // past the last parameter at once: none, or none it knows of
  return sizes;
}

/// cu::Loader of prebuilt kernels: the function `symbol` of the kernel's file on `device`,
/// its parameters checked when it is first loaded.
CUfunction function_for(const RuntimeKernel& rk, const std::string& symbol, int device,
                        const std::vector<int32_t>& arg_dtypes, const std::vector<int32_t>& out_dtypes,
                        int32_t launch_values, int32_t tensor_maps) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto key = std::make_tuple(&rk, symbol, device);
  auto it = functions().find(key);
  if (it != functions().end()) return it->second;
  Image& img = image_of(rk);
  const int cc = cu::compute_capability(device);
  const image::Code& code = code_for(rk, symbol, img, cc);
  CUfunction fn = nullptr;
  const CUresult r = driver().get_function(&fn, module_for(rk, img, device), symbol.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) no_such_kernel(rk, symbol, code);
  check_cu(r, subject(rk, symbol) + ": cuModuleGetFunction");
  std::optional<std::vector<uint32_t>> sizes = driver_parameter_sizes(fn);
  std::string read_by = "as the driver reads them";
  if (!sizes) {
    const image::Kernel* k = code.find(symbol);
    if (k != nullptr) sizes = k->sizes;
    read_by = "as its " + code.describe() + " records them";
  }
  check_parameters(rk, symbol, sizes, read_by,
                   rtc::kernel_parameters(rk, arg_dtypes, out_dtypes, launch_values, tensor_maps), true);
  return functions()[key] = fn;
}

int32_t binary_launch(const OpforgeCallFrame* frame, const void* user) {
  return guarded(frame,
                 [&] { cu::launch(*static_cast<const RuntimeKernel*>(user), frame, symbol_type, &function_for); });
}

/// The compute capability a precompile request's target names ("sm_90", "sm_90a", "compute_90": 90).
int target_capability(const std::string& arch) {
  const size_t digits = arch.find_first_of("0123456789");
  return digits == std::string::npos ? 0 : std::atoi(arch.c_str() + digits);
}

/// The precompile entry: nothing is compiled (the file ships in the kernel folder, which
/// packages carry; the driver compiles PTX at load), but what can be checked without a GPU is:
/// the file is readable and holds code that runs on the request's target, and where that code
/// is readable, a kernel of the instantiation's symbol whose parameters are what opforge passes.
int32_t binary_precompile(OpforgePrecompileRequest* request, const void* user) {
  return rtc::guarded_request(request, [&] {
    const auto& rk = *static_cast<const RuntimeKernel*>(user);
    const rtc::Requested r = rtc::requested(rk, *request, symbol_type);
    const std::string& symbol = r.name;
    std::lock_guard<std::mutex> lock(g_mutex);
    const Image& img = image_of(rk);
    const image::Code& code = code_for(rk, symbol, img, target_capability(request->arch));
    if (code.readable) {
      const image::Kernel* k = code.find(symbol);
      if (k == nullptr) no_such_kernel(rk, symbol, code);
      const int32_t launch_values = rtc::rule_launch_values(rk);
      check_parameters(rk, symbol, k->sizes, "as its " + code.describe() + " records them",
                       rtc::kernel_parameters(rk, r.arg_dtypes, r.out_dtypes, launch_values), launch_values >= 0);
    }
    request->cache_hit = 1;
  });
}

void binary_reload() {
  std::lock_guard<std::mutex> lock(g_mutex);
  images().clear();
  functions().clear();
  cu::forget_launches();
}

}  // namespace

// OpBuilder::cuda_binary's step: here, so that only a library declaring a prebuilt kernel takes
// this file (and the CUDA libraries it needs) from the archive.
void OpDef::add_cuda_binary(std::string file, std::string symbol) {
  add_runtime_kernel(RuntimeKernel::kBinary, std::move(file), std::move(symbol), &binary_launch, &binary_precompile,
                     &binary_reload);
}

}  // namespace opforge::detail
