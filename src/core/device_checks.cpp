// Value domains checked on the device (see device_checks.h, Note [Device value checks]).
#include "device_checks.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "check.h"
#include "device_check_params.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "schema.h"

// The check kernel's PTX (kernels/value_checks.cu), generated at build time for compute_75 (every
// GPU opforge runs on) and compute_90 (which lets a programmatic dependent start early).
extern "C" const char opforge_value_checks_ptx_75[];
extern "C" const char opforge_value_checks_ptx_90[];

namespace opforge::core {
namespace {

std::atomic<bool> g_enabled{[] {
  const char* v = std::getenv("OPFORGE_DEVICE_VALUE_CHECKS");
  return v == nullptr || std::strcmp(v, "0") != 0;
}()};

/// The few CUDA driver functions the check needs, from libcuda at first use (the core links no
/// CUDA library: a process without a GPU driver loads it and never gets here).
struct Driver {
  using Result = int;  // CUresult
  using Context = void*;
  using Module = void*;
  using Function = void*;
  Result (*ctx_get_current)(Context*) = nullptr;
  Result (*ctx_get_device)(int*) = nullptr;
  Result (*device_get_attribute)(int*, int, int) = nullptr;
  Result (*module_load_data)(Module*, const void*) = nullptr;
  Result (*module_get_function)(Function*, Module, const char*) = nullptr;
  Result (*launch_kernel)(Function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                          void**) = nullptr;
  Result (*get_error_string)(Result, const char**) = nullptr;
  std::string load_error;

  Driver() {
    void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      load_error = "cannot load the CUDA driver (libcuda.so.1)";
      return;
    }
    ctx_get_current = reinterpret_cast<decltype(ctx_get_current)>(::dlsym(h, "cuCtxGetCurrent"));
    ctx_get_device = reinterpret_cast<decltype(ctx_get_device)>(::dlsym(h, "cuCtxGetDevice"));
    device_get_attribute = reinterpret_cast<decltype(device_get_attribute)>(::dlsym(h, "cuDeviceGetAttribute"));
    module_load_data = reinterpret_cast<decltype(module_load_data)>(::dlsym(h, "cuModuleLoadData"));
    module_get_function = reinterpret_cast<decltype(module_get_function)>(::dlsym(h, "cuModuleGetFunction"));
    launch_kernel = reinterpret_cast<decltype(launch_kernel)>(::dlsym(h, "cuLaunchKernel"));
    get_error_string = reinterpret_cast<decltype(get_error_string)>(::dlsym(h, "cuGetErrorString"));
    if (!ctx_get_current || !ctx_get_device || !device_get_attribute || !module_load_data || !module_get_function ||
        !launch_kernel)
      load_error =
          "the CUDA driver lacks cuCtxGetDevice, cuDeviceGetAttribute, cuModuleLoadData, cuModuleGetFunction or "
          "cuLaunchKernel";
  }

  void check(Result r, const OpforgeOpSpec& op, const char* what) const {
    if (r == 0) return;
    const char* text = nullptr;
    if (get_error_string != nullptr) get_error_string(r, &text);
    throw InternalError(qualified_name(op) + ": the device value check: " + what +
                        " failed: " + (text != nullptr ? text : "CUresult " + std::to_string(r)));
  }
};

const Driver& driver(const OpforgeOpSpec& op) {
  static const Driver d;
  if (!d.load_error.empty()) throw InternalError(qualified_name(op) + ": the device value check: " + d.load_error);
  return d;
}

/// The check kernel in the current context, loaded once per context.
void* check_function(const OpforgeOpSpec& op) {
  const Driver& d = driver(op);
  static std::mutex mutex;
  static std::map<void*, void*> functions;  // context -> function
  void* context = nullptr;
  d.check(d.ctx_get_current(&context), op, "cuCtxGetCurrent");
  if (context == nullptr)
    throw InternalError(qualified_name(op) + ": the device value check: no CUDA context is current");
  std::lock_guard<std::mutex> lock(mutex);
  void*& f = functions[context];
  if (f == nullptr) {
    constexpr int kComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    int device = 0, major = 0;
    d.check(d.ctx_get_device(&device), op, "cuCtxGetDevice");
    d.check(d.device_get_attribute(&major, kComputeCapabilityMajor, device), op, "cuDeviceGetAttribute");
    void* module = nullptr;
    d.check(d.module_load_data(&module, major >= 9 ? opforge_value_checks_ptx_90 : opforge_value_checks_ptx_75), op,
            "cuModuleLoadData");
    d.check(d.module_get_function(&f, module, "opforge_check_values"), op, "cuModuleGetFunction");
  }
  return f;
}

std::string range_text(int64_t low, int64_t high) {
  return "[" + std::to_string(low) + ", " + std::to_string(high) + ")";
}

}  // namespace

bool device_value_checks() { return g_enabled.load(std::memory_order_relaxed); }
void set_device_value_checks(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }

std::vector<ValueDomain> value_domains(const OpforgeOpSpec& op, Span<const OpforgeArg> args) {
  std::vector<ValueDomain> domains;
  bool any = false;
  for (int32_t i = 0; i < op.num_args; ++i)
    any |= op.args[i].kind == OPFORGE_ARG_TENSOR && op.args[i].tensor.has_values;
  if (!any) return domains;
  std::vector<ArgInfo<int64_t>> info(op.num_args);
  for (int32_t i = 0; i < op.num_args; ++i) {
    info[i].value = args[i].value;
    const OpforgeTensor& t = args[i].tensor;
    const bool tensor = op.args[i].kind == OPFORGE_ARG_TENSOR;
    if (tensor && t.ndim >= 0) info[i].sizes = Span<const int64_t>(t.sizes, static_cast<size_t>(t.ndim));
    info[i].defined = !tensor || t.ndim >= 0;
  }
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeTensorSpec& s = op.args[i].tensor;
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || !s.has_values || args[i].tensor.ndim < 0) continue;
    const Span<const ArgInfo<int64_t>> view(info);
    const std::optional<int64_t> low = eval_expr<int64_t>(s.values_low, view),
                                 high = eval_expr<int64_t>(s.values_high, view);
    if (!low || !high) continue;
    const std::string rule = "[" + expr_string(op, s.values_low) + ", " + expr_string(op, s.values_high) + ")";
    const std::string range = range_text(*low, *high);
    std::string message = std::string(op.args[i].name) + ": expected values in " + rule +
                          (rule == range ? "" : " = " + range) +
                          (s.has_sentinel ? " or " + std::to_string(s.sentinel) : "");
    domains.push_back({i, *low, *high, s.has_sentinel != 0, s.sentinel, std::move(message)});
  }
  return domains;
}

bool launch_value_checks(const OpforgeOpSpec& op, Span<const OpforgeArg> args, const std::vector<ValueDomain>& domains,
                         void* stream) {
  const std::string prefix = qualified_name(op) + ": ";
  bool launched = false;
  for (size_t first = 0; first < domains.size(); first += OPFORGE_VALUE_CHECK_MAX_INPUTS) {
    OpforgeValueChecks params{};
    int64_t most = 0;
    for (size_t k = first; k < domains.size() && params.count < OPFORGE_VALUE_CHECK_MAX_INPUTS; ++k) {
      const ValueDomain& d = domains[k];
      const OpforgeTensor& t = args[d.arg].tensor;
      if (t.ndim > OPFORGE_VALUE_CHECK_MAX_DIMS)
        throw InternalError(prefix + "the device value check of " + op.args[d.arg].name + " reads at most " +
                            std::to_string(OPFORGE_VALUE_CHECK_MAX_DIMS) + " dims, got " + std::to_string(t.ndim));
      OpforgeValueCheck& c = params.checks[params.count];
      c.data = t.data;
      c.numel = 1;
      for (int32_t d2 = 0; d2 < t.ndim; ++d2) {
        c.sizes[d2] = t.sizes[d2];
        c.strides[d2] = t.strides[d2];
        c.numel *= t.sizes[d2];
      }
      if (c.numel == 0 || t.data == nullptr) continue;
      c.ndim = t.ndim;
      c.item_size = static_cast<int32_t>(dtype_size(t.dtype));
      c.is_signed = t.dtype != OPFORGE_DTYPE_UINT8;
      c.low = d.low;
      c.high = d.high;
      c.has_sentinel = d.has_sentinel;
      c.sentinel = d.sentinel;
      const std::string text = prefix + d.message;
      std::strncpy(c.message, text.c_str(), sizeof(c.message) - 1);
      most = std::max(most, c.numel);
      ++params.count;
    }
    if (params.count == 0) continue;
    const Driver& drv = driver(op);
    void* fn = check_function(op);
    constexpr int64_t kThreads = 256, kMaxBlocks = 1024;
    const auto blocks = static_cast<unsigned>(std::min(kMaxBlocks, (most + kThreads - 1) / kThreads));
    void* kernel_args[] = {&params};
    drv.check(drv.launch_kernel(fn, blocks, 1, 1, kThreads, 1, 1, 0, stream, kernel_args, nullptr), op,
              "cuLaunchKernel");
    launched = true;
  }
  return launched;
}

std::vector<OpforgeValueDomain> kernel_value_domains(const OpforgeOpSpec& op, Span<const OpforgeArg> args,
                                                     bool checked) {
  const std::vector<ValueDomain> evaluated = checked ? value_domains(op, args) : std::vector<ValueDomain>{};
  std::vector<OpforgeValueDomain> out;
  for (int32_t i = 0; i < op.num_args; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || !op.args[i].tensor.has_values) continue;
    OpforgeValueDomain d{};
    d.arg = i;
    const auto it = std::find_if(evaluated.begin(), evaluated.end(), [&](const ValueDomain& v) { return v.arg == i; });
    if (it == evaluated.end()) {  // every value: [INT64_MIN, INT64_MAX) and INT64_MAX as the sentinel
      d.low = INT64_MIN;
      d.high = d.sentinel = INT64_MAX;
      d.has_sentinel = 1;
    } else {
      d.low = it->low;
      d.high = it->high;
      d.has_sentinel = it->has_sentinel;
      d.sentinel = it->sentinel;
    }
    const std::string text =
        qualified_name(op) + ": " + (it == evaluated.end() ? std::string(op.args[i].name) : it->message);
    std::strncpy(d.message, text.c_str(), sizeof(d.message) - 1);
    out.push_back(d);
  }
  return out;
}

}  // namespace opforge::core
