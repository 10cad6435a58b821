// Triton kernels on CUDA (Note [Triton kernels] in opforge/op_launch.h): the kernel folder's
// description of each function, variants found in the kernel cache or compiled by the worker,
// their parameter buffers and launch attributes, autotune choices, and the partial sums of
// TritonLaunch::sum_into. Loading and launching through the CUDA driver is cuda_launch.h's, as
// for the other CUDA backends. The backend-neutral half (binding, specialisation, keys, the worker's
// process) is triton.cpp. Linked into an op library only when it declares a .triton_source().
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_launch.h"
#include "triton.h"

// The PTX of kernels/sum_partials.cu, generated at build time.
extern "C" const char opforge_sum_partials_ptx[];

namespace opforge::detail {
namespace {

namespace tr = triton;
using nlohmann::json;

using cu::check_cu;
using cu::driver;

std::string subject(const RuntimeKernel& rk) { return "the Triton function " + rk.name + " of " + rk.file; }

// ---- what a compiled variant needs to be launched -------------------------------------------

/// A compiled variant as the cache holds it: the cubin and what its launch needs (the worker's
/// answer for it, less the cubin).
struct Compiled {
  std::string name, cubin;
  int32_t shared = 0, num_warps = 4, num_ctas = 1;
  int64_t global_scratch = 0, global_scratch_align = 1;
  bool launch_pdl = false, cooperative = false;
  std::vector<std::string> param_types;  ///< the kernel's parameters in order, the scratch pointers included

  /// The cache entry: "<json>\n" then the cubin.
  std::string entry() const {
    const json meta = {{"name", name},
                       {"shared", shared},
                       {"num_warps", num_warps},
                       {"num_ctas", num_ctas},
                       {"global_scratch_size", global_scratch},
                       {"global_scratch_align", global_scratch_align},
                       {"launch_pdl", launch_pdl},
                       {"launch_cooperative_grid", cooperative},
                       {"param_types", param_types}};
    return meta.dump() + "\n" + cubin;
  }
  static Compiled from_meta(const json& m) {
    Compiled c;
    c.name = m.at("name").get<std::string>();
    c.shared = m.value("shared", 0);
    c.num_warps = m.value("num_warps", 4);
    c.num_ctas = m.value("num_ctas", 1);
    c.global_scratch = m.value("global_scratch_size", int64_t{0});
    c.global_scratch_align = std::max<int64_t>(1, m.value("global_scratch_align", int64_t{1}));
    c.launch_pdl = m.value("launch_pdl", false);
    c.cooperative = m.value("launch_cooperative_grid", false);
    if (m.contains("param_types")) {
      c.param_types = m["param_types"].get<std::vector<std::string>>();
    } else {
      for (const json& p : m.at("kernel_params")) c.param_types.push_back(p.at("type").get<std::string>());
    }
    return c;
  }
  static Compiled from_entry(const std::string& image) {
    const size_t nl = image.find('\n');
    Compiled c = from_meta(json::parse(image.substr(0, nl)));
    c.cubin = image.substr(nl + 1);
    return c;
  }
};

/// A compiled variant loaded into one device's context.
struct Loaded {
  Compiled c;
  CUfunction fn = nullptr;
  tr::Variant variant;    ///< what `c` was compiled as: the call's variant, or the general one standing in
  std::string described;  ///< for messages
};

// ---- one kernel's state ---------------------------------------------------------------------

/// Bumped by the reload: every kernel's state and loaded variants are built again.
std::atomic<uint64_t> g_generation{0};

struct KernelState {
  std::mutex mutex;
  uint64_t generation = ~uint64_t{0};
  tr::Function fn;
  std::vector<tr::Source> sources;
  /// Loaded variants by device and Variant::hash (compared field by field: a hash is no proof).
  std::map<std::pair<int, uint64_t>, std::vector<std::pair<tr::Variant, std::unique_ptr<Loaded>>>> loaded;
  std::map<std::string, int32_t> choices;  // tuning key -> config
};

std::mutex g_states_mutex;
KernelState& state_of(const RuntimeKernel& rk) {
  static std::map<const RuntimeKernel*, std::unique_ptr<KernelState>> states;
  std::lock_guard<std::mutex> lock(g_states_mutex);
  auto& s = states[&rk];
  if (!s) s = std::make_unique<KernelState>();
  return *s;
}

std::string key_prefix(const RuntimeKernel& rk, const char* what) {
  return std::string("opforge-triton-v1 ") + what + "\nfile " + rk.file + "\nfunction " + rk.name + "\nsources\n" +
         tr::sources_text();
}

/// The function's description: the kernel cache's, else the worker's (then stored).
tr::Function describe(const RuntimeKernel& rk, const std::string& write_dir) {
  const std::string key = key_prefix(rk, "inspect");
  rtc::Binary b;
  if (!rtc::find_cached(key, write_dir, write_dir != rtc::user_cache_dir(), b)) {
    const json request = {{"verb", "inspect"}, {"file", kernel_dir() + "/" + rk.file}, {"function", rk.name}};
    const std::optional<std::string> answer = tr::run_worker(request.dump(), subject(rk));
    if (!answer)
      throw InternalError(subject(rk) +
                          ": this process cannot compile Triton kernels (OPFORGE_TRITON_PYTHON is unset: no Python "
                          "with Triton, as in the C++ runner) and the kernel folder " +
                          kernel_dir() +
                          " carries no description of the function; package the model with opforge.aoti.package, "
                          "which carries it");
    const json a = json::parse(*answer);
    if (!a.value("ok", false))
      throw InternalError(subject(rk) + ": " + a.value("error", std::string("the worker failed")));
    b.lowered_name = rk.name;
    b.image = *answer;
    rtc::store(write_dir, key, b);
  }
  tr::Function fn = tr::parse_inspection(b.image);
  if (!fn.needs_python.empty()) {
    std::string parts;
    for (const auto& p : fn.needs_python) parts += (parts.empty() ? "" : ", ") + p;
    throw InternalError(subject(rk) + " uses " + parts +
                        ", which run Python on every call; opforge launches Triton kernels without Python: compute "
                        "those values in the grid function instead (see Note [Triton kernels])");
  }
  return fn;
}

/// Brings `st` up to date with the kernel folder (once per process, and after each reload).
void refresh(const RuntimeKernel& rk, KernelState& st, const std::string& write_dir) {
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (st.generation == generation) return;
  st.fn = describe(rk, write_dir);
  st.sources = tr::static_sources(rk, st.fn);
  st.loaded.clear();
  st.choices.clear();
  st.generation = generation;
}

// ---- variants: the kernel cache, else the worker --------------------------------------------

std::string variant_key(const RuntimeKernel& rk, int arch, const tr::Variant& v) {
  return key_prefix(rk, "variant") + "\ntarget sm_" + std::to_string(arch) + "\nvariant " + v.key();
}

/// Compiles `variants` with the workers into `write_dir`, spread over up to tr::kParallelWorkers
/// workers at once (the configs of an autotuned kernel, a precompile's specialised and general
/// variants); throws naming the op on a failure, the first variant's in `variants` order.
void compile(const RuntimeKernel& rk, const tr::Function& fn, int arch, const std::vector<tr::Variant>& variants,
             const std::string& write_dir) {
  const size_t parallel = std::min<size_t>(
      {variants.size(), tr::kParallelWorkers, std::max<size_t>(1, std::thread::hardware_concurrency())});
  std::vector<std::string> answers(parallel);
  std::vector<std::exception_ptr> failures(parallel);
  auto run = [&](size_t part) {
    try {
      std::string request = "{\"verb\": \"compile\", \"file\": " + json(kernel_dir() + "/" + rk.file).dump() +
                            ", \"function\": " + json(rk.name).dump() +
                            ", \"target\": {\"arch\": " + std::to_string(arch) +
                            ", \"warp_size\": 32}, \"variants\": [";
      for (size_t i = part; i < variants.size(); i += parallel)
        request += (i == part ? "" : ", ") + variants[i].request(fn);
      request += "]}";
      const std::optional<std::string> answer = tr::run_worker(request, subject(rk));
      if (!answer) throw InternalError(subject(rk) + ": no Triton worker");  // callers asked can_compile() first
      answers[part] = *answer;
    } catch (...) {
      failures[part] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t part = 1; part < parallel; ++part) threads.emplace_back(run, part);
  run(0);
  for (std::thread& t : threads) t.join();
  std::vector<json> parsed(parallel);
  for (size_t part = 0; part < parallel; ++part) {
    if (failures[part]) std::rethrow_exception(failures[part]);
    parsed[part] = json::parse(answers[part]);
    if (!parsed[part].value("ok", false))
      throw InternalError(subject(rk) + ": " + parsed[part].value("error", std::string("the worker failed")));
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    const json& v = parsed[i % parallel].at("variants").at(i / parallel);
    if (!v.value("ok", false))
      throw InternalError(subject(rk) + ": Triton failed to compile the variant (" + variants[i].describe(fn) +
                          ") for sm_" + std::to_string(arch) + ":\n" + v.value("error", std::string()));
    Compiled c = Compiled::from_meta(v);
    c.cubin = tr::base64_decode(v.at("cubin_b64").get<std::string>());
    rtc::Binary b;
    b.lowered_name = c.name;
    b.image = c.entry();
    rtc::store(write_dir, variant_key(rk, arch, variants[i]), b);
  }
}

/// The compiled variant `v`: the kernel cache's, else compiled now (where this process can),
/// else nullopt.
std::optional<Compiled> find_or_compile(const RuntimeKernel& rk, const tr::Function& fn, int arch, const tr::Variant& v,
                                        const std::string& write_dir, bool store_in_write_dir) {
  rtc::Binary b;
  const std::string key = variant_key(rk, arch, v);
  if (!rtc::find_cached(key, write_dir, store_in_write_dir, b)) {
    if (!tr::can_compile()) return std::nullopt;
    compile(rk, fn, arch, {v}, write_dir);
    if (!rtc::find_cached(key, write_dir, store_in_write_dir, b))
      throw InternalError(subject(rk) + ": the compiled variant is not in the kernel cache " + write_dir);
  }
  return Compiled::from_entry(b.image);
}

/// The loaded variant `v` for the call's device: the exact one, else (in a process that cannot
/// compile) the general one; throws naming the op, the kernel and the specialisation where
/// neither is there.
template <class General>
Loaded& loaded_variant(const RuntimeKernel& rk, KernelState& st, int device, const tr::Variant& v,
                       General&& general_variant) {
  auto& bucket = st.loaded[{device, v.hash()}];
  for (auto& [known, l] : bucket)
    if (known == v) return *l;
  const int arch = cu::compute_capability(device);
  std::optional<Compiled> c = find_or_compile(rk, st.fn, arch, v, rtc::user_cache_dir(), false);
  std::string described = v.describe(st.fn);
  tr::Variant compiled_as = v;
  if (!c) {
    compiled_as = general_variant();  // made only where the exact variant is missing
    c = find_or_compile(rk, st.fn, arch, compiled_as, rtc::user_cache_dir(), false);
    described = compiled_as.describe(st.fn) + " (the general variant, standing in for " + described + ")";
  }
  if (!c)
    throw InternalError(subject(rk) + ": the kernel folder " + kernel_dir() + " carries no variant for sm_" +
                        std::to_string(arch) + " (" + v.describe(st.fn) +
                        "), nor the general one, and this process cannot compile Triton kernels "
                        "(OPFORGE_TRITON_PYTHON is unset); package the model with calls of these shapes "
                        "(opforge.aoti.package) or run it where Python with Triton is installed");
  auto l = std::make_unique<Loaded>();
  l->c = std::move(*c);
  l->variant = std::move(compiled_as);
  l->described = described;
  l->fn = cu::load_function(l->c.cubin.data(), l->c.name, subject(rk));
  if (l->c.shared > static_cast<int32_t>(cu::kDefaultSharedBytes))  // as Triton's loader: opted into once
    cu::allow_dynamic_shared(l->fn, static_cast<size_t>(l->c.shared));
  bucket.emplace_back(v, std::move(l));
  return *bucket.back().second;
}

// ---- one launch -----------------------------------------------------------------------------

/// The kernel's parameter buffer: one slot per parameter of the compiled kernel.
struct Arguments {
  std::vector<uint64_t> slots;
  std::vector<void*> params;

  Arguments(const tr::Function& fn, const tr::Variant& v, const tr::Bound& b, const Compiled& c,
            const std::vector<const void*>& pointers, void* scratch) {
    slots.assign(c.param_types.size(), 0);
    params.resize(c.param_types.size());
    size_t k = 0;
    for (size_t p = 0; p < fn.params.size(); ++p) {
      if (v.types[p] == "constexpr") continue;
      if (k >= slots.size()) break;
      const tr::Value& x = b.values[p];
      const std::string& type = c.param_types[k];
      void* slot = &slots[k];
      if (type[0] == '*') {
        std::memcpy(slot, &pointers[p], sizeof(void*));
      } else if (type == "fp32") {
        const float f = static_cast<float>(x.kind == tr::Value::kFloat ? x.f : static_cast<double>(x.i));
        std::memcpy(slot, &f, 4);
      } else if (type == "fp64") {
        const double f = x.kind == tr::Value::kFloat ? x.f : static_cast<double>(x.i);
        std::memcpy(slot, &f, 8);
      } else if (type == "i32" || type == "u32") {
        const int32_t i = static_cast<int32_t>(x.i);
        std::memcpy(slot, &i, 4);
      } else if (type == "i1" || type == "u1" || type == "i8" || type == "u8") {
        const uint8_t i = static_cast<uint8_t>(x.i);
        std::memcpy(slot, &i, 1);
      } else if (type == "i16" || type == "u16") {
        const int16_t i = static_cast<int16_t>(x.i);
        std::memcpy(slot, &i, 2);
      } else {  // i64, u64
        std::memcpy(slot, &x.i, 8);
      }
      params[k] = slot;
      ++k;
    }
    // The two trailing scratch pointers of Triton's kernels: global scratch (null when the kernel
    // needs none) and profile scratch (always null here).
    for (; k < slots.size(); ++k) {
      void* p = k + 2 == slots.size() ? scratch : nullptr;
      std::memcpy(&slots[k], &p, sizeof(void*));
      params[k] = &slots[k];
    }
  }
};

/// Launches `l` with the call's arguments, laid out as the variant `l` was compiled as (the general
/// variant standing in for the call's takes every integer, 64-bit, and the constant-1 ones).
void launch_variant(const Loaded& l, const tr::Function& fn, const tr::Bound& b,
                    const std::vector<const void*>& pointers, const int64_t grid[3], const OpforgeContext& ctx) {
  void* scratch = nullptr;
  const int64_t programs = grid[0] * grid[1] * grid[2] * l.c.num_ctas;
  if (l.c.global_scratch > 0) {
    const size_t bytes = static_cast<size_t>(programs * l.c.global_scratch + l.c.global_scratch_align);
    scratch = ctx.allocate ? ctx.allocate(ctx.allocator_state, bytes) : nullptr;
    if (scratch == nullptr)
      throw InternalError("opforge: scratch allocation failed for a Triton kernel's global scratch");
    const uintptr_t a = static_cast<uintptr_t>(l.c.global_scratch_align);
    scratch = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch) + a - 1) / a * a);
  }
  Arguments args(fn, l.variant, b, l.c, pointers, scratch);
  cu::Geometry g;
  g.grid[0] = static_cast<unsigned>(grid[0] * l.c.num_ctas);
  g.grid[1] = static_cast<unsigned>(grid[1]);
  g.grid[2] = static_cast<unsigned>(grid[2]);
  g.block[0] = static_cast<unsigned>(32 * l.c.num_warps);
  g.shared_bytes = static_cast<unsigned>(l.c.shared);
  g.cluster_x = static_cast<unsigned>(l.c.num_ctas);
  g.pdl = l.c.launch_pdl;
  g.cooperative = l.c.cooperative;
  cu::launch_function(l.fn, g, static_cast<CUstream>(ctx.stream), args.params.data(), l.c.name.c_str());
}

/// The partial-sum kernel for an output of `dtype` in the current context.
CUfunction sum_partials_function(int32_t dtype) {
  static std::mutex mutex;
  static std::map<std::pair<CUcontext, int32_t>, CUfunction> functions;
  CUcontext context = nullptr;
  check_cu(driver().get_current_context(&context), "cuCtxGetCurrent");
  std::lock_guard<std::mutex> lock(mutex);
  CUfunction& f = functions[{context, dtype}];
  if (f == nullptr) {
    static std::map<CUcontext, CUmodule> modules;
    CUmodule& m = modules[context];
    if (m == nullptr) check_cu(driver().module_load(&m, opforge_sum_partials_ptx), "cuModuleLoadData (sum_partials)");
    const char* name = dtype == OPFORGE_DTYPE_FLOAT64    ? "opforge_sum_partials_fp64"
                       : dtype == OPFORGE_DTYPE_FLOAT16  ? "opforge_sum_partials_fp16"
                       : dtype == OPFORGE_DTYPE_BFLOAT16 ? "opforge_sum_partials_bf16"
                                                         : "opforge_sum_partials_fp32";
    check_cu(driver().get_function(&f, m, name), "cuModuleGetFunction (sum_partials)");
  }
  return f;
}

/// The copies TritonLaunch::copy asks for, ordered before the kernel on the call's stream.
void copy_inputs(const RuntimeKernel& rk, const TritonLaunch& cfg, const OpforgeCallFrame* f) {
  for (const TritonLaunch::Value& c : cfg.values) {
    if (c.kind != TritonLaunch::Value::kCopy) continue;
    int64_t n = 1, m = 1;
    for (int32_t d = 0; d < c.tensor.ndim; ++d) n *= c.tensor.sizes[d];
    for (int32_t d = 0; d < c.from.ndim; ++d) m *= c.from.sizes[d];
    if (n != m || c.tensor.dtype != c.from.dtype)
      throw InternalError(subject(rk) + ": TritonLaunch::copy between tensors of other sizes or dtypes");
    const size_t bytes = static_cast<size_t>(n) * dtype_size(static_cast<Dtype>(c.tensor.dtype));
    if (bytes > 0)
      check_cu(
          driver().copy_async(reinterpret_cast<CUdeviceptr>(c.tensor.data), reinterpret_cast<CUdeviceptr>(c.from.data),
                              bytes, static_cast<CUstream>(f->ctx->stream)),
          "cuMemcpyDtoDAsync");
  }
}

// ---- autotune -------------------------------------------------------------------------------

/// The tuning key of a call: the values of the arguments `key` names, then the tensors' dtypes.
std::string tuning_key(const tr::Function& fn, const tr::Bound& b) {
  std::string k;
  for (const std::string& name : fn.key)
    for (size_t p = 0; p < fn.params.size(); ++p)
      if (fn.params[p].name == name)
        k += name + "=" +
             (b.is_constant[p]                          ? b.constants[p].json()
              : b.values[p].kind == tr::Value::kPointer ? tr::type_name(b.values[p].dtype)
              : b.values[p].kind == tr::Value::kFloat   ? json(b.values[p].f).dump()
                                                        : std::to_string(b.values[p].i)) +
             " ";
  for (size_t p = 0; p < fn.params.size(); ++p)
    if (!b.is_constant[p] && b.values[p].kind == tr::Value::kPointer) k += tr::type_name(b.values[p].dtype) + " ";
  return k;
}

/// One grid dim, divided by the constexpr grid_per names (rounded up).
int64_t grid_dim(const RuntimeKernel& rk, const tr::Function& fn, const tr::Variant& v, int64_t count,
                 const char* per) {
  if (per == nullptr) return count;
  for (size_t p = 0; p < fn.params.size(); ++p)
    if (fn.params[p].name == per && v.types[p] == "constexpr" && v.constants[p].kind == tr::Constant::kInt &&
        v.constants[p].i > 0)
      return (count + v.constants[p].i - 1) / v.constants[p].i;
  throw InternalError(subject(rk) + ": the grid is divided by '" + per +
                      "', which is no integer tl.constexpr of the function with a value for this call");
}

/// Times each config on the call's arguments and returns the fastest (Note [Triton kernels],
/// Autotune): for each, one warm-up launch and ten timed ones, the median kept, with the
/// reset_to_zero arguments zeroed and the restore_value ones restored around every launch.
int32_t tune(const RuntimeKernel& rk, KernelState& st, int device, const tr::Variant& base, const tr::Bound& b,
             const std::vector<const void*>& pointers, const TritonLaunch& cfg, const OpforgeCallFrame* f) {
  const cu::Driver& d = driver();
  CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d.is_capturing) d.is_capturing(static_cast<CUstream>(f->ctx->stream), &capturing);
  if (capturing != CU_STREAM_CAPTURE_STATUS_NONE)
    throw InternalError(subject(rk) +
                        " is autotuned and has no choice for this call's tuning key yet; tuning "
                        "times launches, which CUDA graph capture forbids: call the op once before capturing");
  const tr::Function& fn = st.fn;
  const int arch = cu::compute_capability(device);
  std::vector<tr::Variant> variants;
  for (int32_t c = 0; c < static_cast<int32_t>(fn.configs.size()); ++c) {
    tr::Variant v = base;
    tr::apply_config(fn, c, v);
    variants.push_back(v);
  }
  std::vector<tr::Variant> missing;
  for (const auto& v : variants) {
    rtc::Binary probe;
    if (!rtc::find_cached(variant_key(rk, arch, v), rtc::user_cache_dir(), false, probe)) missing.push_back(v);
  }
  if (!missing.empty()) compile(rk, fn, arch, missing, rtc::user_cache_dir());
  // Bytes of each pointer argument reset_to_zero and restore_value name: the tensor behind it.
  auto tensor_bytes = [&](const std::string& name, const void*& ptr) -> size_t {
    for (size_t p = 0; p < fn.params.size(); ++p)
      if (fn.params[p].name == name && b.values[p].kind == tr::Value::kPointer) {
        ptr = pointers[p];
        for (int32_t i = 0; i < f->num_args; ++i)
          if (f->args[i].tensor.data == ptr && f->args[i].tensor.ndim >= 0) {
            size_t n = dtype_size(static_cast<Dtype>(f->args[i].tensor.dtype));
            for (int32_t k = 0; k < f->args[i].tensor.ndim; ++k) n *= static_cast<size_t>(f->args[i].tensor.sizes[k]);
            return n;
          }
        for (int32_t o = 0; o < f->num_outputs; ++o)
          if (f->outputs[o].data == ptr) {
            size_t n = dtype_size(static_cast<Dtype>(f->outputs[o].dtype));
            for (int32_t k = 0; k < f->outputs[o].ndim; ++k) n *= static_cast<size_t>(f->outputs[o].sizes[k]);
            return n;
          }
      }
    return 0;
  };
  struct Saved {
    CUdeviceptr at;
    CUdeviceptr copy;
    size_t bytes;
  };
  std::vector<Saved> restore;
  CUstream stream = static_cast<CUstream>(f->ctx->stream);
  for (const std::string& name : fn.restore_value) {
    const void* ptr = nullptr;
    const size_t bytes = tensor_bytes(name, ptr);
    if (bytes == 0) continue;
    void* copy = f->ctx->allocate ? f->ctx->allocate(f->ctx->allocator_state, bytes) : nullptr;
    if (copy == nullptr) throw InternalError("opforge: scratch allocation failed while autotuning " + subject(rk));
    restore.push_back({reinterpret_cast<CUdeviceptr>(ptr), reinterpret_cast<CUdeviceptr>(copy), bytes});
    check_cu(d.copy_async(restore.back().copy, restore.back().at, bytes, stream), "cuMemcpyDtoDAsync");
  }
  auto around = [&](bool before) {
    if (before)
      for (const std::string& name : fn.reset_to_zero) {
        const void* ptr = nullptr;
        const size_t bytes = tensor_bytes(name, ptr);
        if (bytes > 0)
          check_cu(d.memset_async(reinterpret_cast<CUdeviceptr>(ptr), 0, bytes, stream), "cuMemsetD8Async");
      }
    else
      for (const Saved& s : restore) check_cu(d.copy_async(s.at, s.copy, s.bytes, stream), "cuMemcpyDtoDAsync");
  };
  CUevent start = nullptr, stop = nullptr;
  check_cu(d.event_create(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  check_cu(d.event_create(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  int32_t best = -1;
  float best_ms = INFINITY;
  for (int32_t c = 0; c < static_cast<int32_t>(variants.size()); ++c) {
    Loaded& l = loaded_variant(rk, st, device, variants[c], [&] { return variants[c]; });
    int64_t grid[3];
    for (int k = 0; k < 3; ++k) grid[k] = grid_dim(rk, fn, variants[c], cfg.grid[k], cfg.grid_per[k]);
    std::vector<float> times;
    for (int run = 0; run < 11; ++run) {
      around(true);
      copy_inputs(rk, cfg, f);  // a kernel computing in place starts from the input again
      check_cu(d.event_record(start, stream), "cuEventRecord");
      launch_variant(l, fn, b, pointers, grid, *f->ctx);
      check_cu(d.event_record(stop, stream), "cuEventRecord");
      around(false);
      check_cu(d.event_sync(stop), "cuEventSynchronize");
      float ms = 0;
      check_cu(d.elapsed(&ms, start, stop), "cuEventElapsedTime");
      if (run > 0) times.push_back(ms);  // the first launch warms up
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    const float median = times[times.size() / 2];
    if (median < best_ms) best_ms = median, best = c;
  }
  d.event_destroy(start);
  d.event_destroy(stop);
  around(true);  // as Triton: the reset_to_zero arguments zeroed once more before the real launch
  return best;
}

std::string choice_key(const RuntimeKernel& rk, int arch, const tr::Variant& base, const std::string& tuning) {
  return key_prefix(rk, "autotune") + "\ntarget sm_" + std::to_string(arch) + "\nvariant " + base.key() + "\ntuning " +
         tuning;
}

// ---- the entry --------------------------------------------------------------------------------

/// The grid function's answer, or the launch rule's (Note [Triton kernels], Grid).
std::optional<TritonLaunch> grid_of(const RuntimeKernel& rk, const OpforgeCallFrame* f) {
  TritonLaunch cfg;
  const int32_t n = f->num_args;
  const OpforgeTensor* t = rk.rule_tensor < 0   ? nullptr
                           : rk.rule_tensor < n ? &f->args[rk.rule_tensor].tensor
                                                : &f->outputs[rk.rule_tensor - n];
  int64_t numel = 1;
  if (t != nullptr)
    for (int32_t d = 0; d < t->ndim; ++d) numel *= t->sizes[d];
  switch (rk.rule.kind) {
    case LaunchRule::kRows:
      cfg.grid[0] = t->ndim > 0 && t->sizes[t->ndim - 1] > 0 ? numel / t->sizes[t->ndim - 1] : 0;
      if (t->ndim > 0 && t->sizes[t->ndim - 1] == 0) {  // empty rows: as many programs as rows
        cfg.grid[0] = 1;
        for (int32_t d = 0; d + 1 < t->ndim; ++d) cfg.grid[0] *= t->sizes[d];
      }
      break;
    case LaunchRule::kElementwise:
      cfg.grid[0] = numel;
      cfg.grid_per[0] = "BLOCK_SIZE";
      break;
    case LaunchRule::kGrid:
      cfg = rk.rule.triton_grid_entry(f, rk.rule.grid_fn);
      break;
    case LaunchRule::kNone:
      throw InternalError(subject(rk) + " has no launch rule");
  }
  if (cfg.grid[0] * cfg.grid[1] * cfg.grid[2] == 0) return std::nullopt;
  return cfg;
}

void launch(const RuntimeKernel& rk, const OpforgeCallFrame* f) {
  std::optional<TritonLaunch> cfg = grid_of(rk, f);
  if (!cfg) return;  // nothing to launch: the call protocol skipped calls whose outputs are all empty
  const int device = f->ctx->device_index;
  cu::bind_primary_context(device);
  KernelState& st = state_of(rk);
  std::lock_guard<std::mutex> lock(st.mutex);
  refresh(rk, st, rtc::user_cache_dir());
  const tr::Function& fn = st.fn;
  const tr::Bound b = tr::bind(rk, fn, st.sources, f, *cfg);
  tr::Variant v = tr::specialise(fn, b, cfg->num_warps, cfg->num_stages, false);
  std::vector<const void*> pointers(fn.params.size(), nullptr);
  std::vector<std::pair<size_t, void*>> partials;  // parameter, scratch
  for (size_t p = 0; p < fn.params.size(); ++p) {
    if (b.is_constant[p] || b.values[p].kind != tr::Value::kPointer) continue;
    pointers[p] = b.values[p].pointer;
    if (b.partial_rows[p] > 0) {
      const OpforgeTensor& into = b.partial_into[p];
      int64_t cols = 1;
      for (int32_t d = 0; d < into.ndim; ++d) cols *= into.sizes[d];
      const size_t bytes = static_cast<size_t>(b.partial_rows[p] * cols) * sizeof(float);
      void* scratch = f->ctx->allocate ? f->ctx->allocate(f->ctx->allocator_state, bytes) : nullptr;
      if (scratch == nullptr && bytes > 0) throw InternalError("opforge: scratch allocation failed for " + subject(rk));
      if (bytes > 0)
        check_cu(driver().memset_async(reinterpret_cast<CUdeviceptr>(scratch), 0, bytes,
                                       static_cast<CUstream>(f->ctx->stream)),
                 "cuMemsetD8Async");
      pointers[p] = scratch;
      partials.emplace_back(p, scratch);
    }
  }
  if (fn.autotuned && !fn.configs.empty()) {
    const int arch = cu::compute_capability(device);
    const std::string tuning = tuning_key(fn, b);
    auto chosen = st.choices.find(tuning);
    if (chosen == st.choices.end()) {
      const std::string key = choice_key(rk, arch, v, tuning);
      rtc::Binary entry;
      int32_t config = -1;
      if (rtc::find_cached(key, rtc::user_cache_dir(), false, entry)) {
        config = std::stoi(entry.image);
      } else if (tr::can_compile()) {
        config = tune(rk, st, device, v, b, pointers, *cfg, f);
        entry.lowered_name = rk.name;
        entry.image = std::to_string(config);
        rtc::store(rtc::user_cache_dir(), key, entry);
      } else {
        throw InternalError(subject(rk) + " is autotuned, and the kernel folder " + kernel_dir() +
                            " carries no choice for the tuning key " + tuning + "on sm_" + std::to_string(arch) +
                            "; this process cannot tune (OPFORGE_TRITON_PYTHON is unset): run the op once with these "
                            "shapes where Python with Triton is installed before packaging");
      }
      chosen = st.choices.emplace(tuning, config).first;
    }
    tr::apply_config(fn, chosen->second, v);
  }
  copy_inputs(rk, *cfg, f);
  const int32_t config = v.config;
  Loaded& l = loaded_variant(rk, st, device, v, [&] {
    tr::Variant general = tr::specialise(fn, b, cfg->num_warps, cfg->num_stages, true);
    if (config >= 0) tr::apply_config(fn, config, general);
    return general;
  });
  int64_t grid[3];
  for (int k = 0; k < 3; ++k) grid[k] = grid_dim(rk, fn, v, cfg->grid[k], cfg->grid_per[k]);
  launch_variant(l, fn, b, pointers, grid, *f->ctx);
  for (auto& [p, scratch] : partials) {
    const OpforgeTensor& into = b.partial_into[p];
    int64_t cols = 1;
    for (int32_t d = 0; d < into.ndim; ++d) cols *= into.sizes[d];
    int64_t rows = b.partial_rows[p];
    void* out = into.data;
    void* args[] = {&scratch, &rows, &cols, &out};
    cu::Geometry g;
    g.grid[0] = static_cast<unsigned>(std::min<int64_t>((cols + 255) / 256, 65535));
    g.block[0] = 256;
    if (cols > 0)
      cu::launch_function(sum_partials_function(into.dtype), g, static_cast<CUstream>(f->ctx->stream), args,
                          "sum_partials");
  }
}

void reload() {
  g_generation.fetch_add(1, std::memory_order_release);
  triton::forget_sources();
}

int32_t triton_launch(const OpforgeCallFrame* frame, const void* user) {
  return guarded(frame, [&] { launch(*static_cast<const RuntimeKernel*>(user), frame); });
}

/// The precompile entry (OpforgePrecompileRequest): the description of the function, and, where
/// the request gives a call's shapes, the variant Triton would compile for that call (pointers
/// 16-byte aligned) and the general variant, for every autotune config, with the autotune choice
/// for the call's tuning key where one was made, so that a package carries what its calls need
/// (Note [Triton kernels], Variants and Autotune).
int32_t triton_precompile(OpforgePrecompileRequest* request, const void* user) {
  OpforgeCallFrame errors{};
  errors.error = request->error;
  errors.error_capacity = request->error_capacity;
  return guarded(&errors, [&] {
    const auto& rk = *static_cast<const RuntimeKernel*>(user);
    const std::string write_dir = request->cache_dir ? request->cache_dir : rtc::user_cache_dir();
    rtc::Binary probe;
    bool hit = rtc::find_cached(key_prefix(rk, "inspect"), write_dir, true, probe);
    const tr::Function fn = describe(rk, write_dir);
    const OpforgeOpSpec& spec = *rk.def->spec();
    const bool shaped = OPFORGE_HAS_FIELD(OpforgePrecompileRequest, *request, sizes) &&
                        request->num_shapes == spec.num_args + spec.num_outputs;
    if (!shaped) {
      request->cache_hit = hit;
      return;
    }
    // A call of these shapes: dense tensors at distinct 256-byte aligned (never dereferenced) addresses.
    std::vector<std::vector<int64_t>> strides(request->num_shapes);
    std::vector<OpforgeArg> args(spec.num_args);
    std::vector<OpforgeTensor> outputs(spec.num_outputs);
    for (int32_t i = 0; i < request->num_shapes; ++i) {
      const int32_t nd = request->ndims[i];
      OpforgeTensor t{};
      if (nd >= 0) {
        strides[i].assign(nd, 1);
        for (int32_t d = nd - 1; d > 0; --d) strides[i][d - 1] = strides[i][d] * request->sizes[i][d];
        const int32_t dtype =
            i < spec.num_args
                ? request->dtypes[i]
                : rtc::output_dtype(spec.outputs[i - spec.num_args],
                                    std::vector<int32_t>(request->dtypes, request->dtypes + spec.num_args));
        t = {reinterpret_cast<void*>(uintptr_t{0x100000} * (i + 1)),
             dtype,
             OPFORGE_DEVICE_CUDA,
             0,
             nd,
             request->sizes[i],
             strides[i].data()};
      } else {
        t = {nullptr, -1, OPFORGE_DEVICE_CUDA, 0, -1, nullptr, nullptr};
      }
      if (i < spec.num_args) {
        args[i].tensor = t;
        args[i].value = request->values[i];
        args[i].value.kind = spec.args[i].kind;
      } else {
        outputs[i - spec.num_args] = t;
      }
    }
    OpforgeContext ctx{};
    ctx.struct_size = sizeof(ctx);
    ctx.device_type = OPFORGE_DEVICE_CUDA;
    OpforgeCallFrame f{};
    f.struct_size = sizeof(f);
    f.ctx = &ctx;
    f.num_args = spec.num_args;
    f.args = args.data();
    f.num_outputs = spec.num_outputs;
    f.outputs = outputs.data();
    const std::optional<TritonLaunch> cfg = grid_of(rk, &f);
    if (!cfg) {
      request->cache_hit = hit;
      return;
    }
    const tr::Bound b = tr::bind(rk, fn, tr::static_sources(rk, fn), &f, *cfg);
    const std::string target = request->arch;
    const int arch = std::stoi(target.substr(target.find('_') + 1));
    std::vector<tr::Variant> variants;
    for (bool general : {false, true}) {
      const tr::Variant v = tr::specialise(fn, b, cfg->num_warps, cfg->num_stages, general);
      if (!fn.autotuned) variants.push_back(v);
      for (int32_t c = 0; fn.autotuned && c < static_cast<int32_t>(fn.configs.size()); ++c) {
        tr::Variant configured = v;
        tr::apply_config(fn, c, configured);
        variants.push_back(configured);
      }
      // The autotune choice for this call's tuning key, where a run on a GPU of `arch` made one
      // (tuning needs a GPU): copied into write_dir, so that a package carries it.
      if (fn.autotuned && !fn.configs.empty() && !general)
        rtc::find_cached(choice_key(rk, arch, v, tuning_key(fn, b)), write_dir, true, probe);
    }
    std::vector<tr::Variant> missing;
    for (const tr::Variant& v : variants)
      if (!rtc::find_cached(variant_key(rk, arch, v), write_dir, true, probe)) missing.push_back(v);
    if (!missing.empty()) {
      if (!tr::can_compile())
        throw InternalError(subject(rk) +
                            ": this process cannot compile Triton kernels (OPFORGE_TRITON_PYTHON is unset)");
      compile(rk, fn, arch, missing, write_dir);
    }
    request->cache_hit = hit && missing.empty();
  });
}

}  // namespace

// OpBuilder::triton_source's step: here, so that only a library declaring a Triton kernel takes
// this file (and the CUDA libraries it needs) from the archive.
void OpDef::add_triton_source(std::string source_file, std::string function) {
  auto rk = std::make_unique<RuntimeKernel>();
  rk->def = this;
  rk->backend = RuntimeKernel::kTriton;
  rk->file = std::move(source_file);
  rk->name = std::move(function);
  OpforgeKernel k{};
  k.struct_size = sizeof(OpforgeKernel);
  k.device_type = OPFORGE_DEVICE_CUDA;
  k.fn = &triton_launch;
  k.user = rk.get();
  k.source = rk->file.c_str();
  k.name = rk->name.c_str();
  k.precompile = &triton_precompile;
  k.backend = OPFORGE_BACKEND_TRITON;
  kernels.push_back(k);
  runtime_kernels.push_back(std::move(rk));
  registry().add_reload(&reload);
}

}  // namespace opforge::detail
