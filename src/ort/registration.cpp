// The ONNX Runtime adapter: RegisterCustomOps, which ONNX Runtime calls when a session's options
// register this library (SessionOptions.register_custom_ops_library in Python,
// RegisterCustomOpsLibrary_V2 in C), registers every op of the op libraries the options name as
// a custom op of the domain named by its namespace. A kernel translates ONNX Runtime's kernel
// context into the core's call protocol (kernel.cpp) and evaluates no rule of the description
// itself (Note [One core for every adapter] in src/core/library.h).
//
// Note [The ONNX node of an op]
// -----------------------------
// opforge.onnx exports a call of `ns::op` as one node (python/opforge/onnx):
//   domain, op_type:  "ns", "op" (opset 1 of the domain);
//   inputs:           the tensor inputs in schema order; an optional input left out is an empty
//                     input (""), or no input at all where no given input follows it;
//   attributes:       each parameter by its name: int and bool as INT (bool 0 or 1), float as
//                     FLOAT (ONNX's attributes are float32, so a double parameter runs with its
//                     float32 rounding: eps=1e-6 as 9.99999997e-07), str as STRING, int[] as
//                     INTS, float[] as FLOATS; one left out takes its declared default;
//   outputs:          the op's outputs in order (one that exists only with an optional input is
//                     an empty output when the call leaves that input out), then for each input
//                     the op writes, in argument order, its value after the op ("x_out").
// ONNX has no mutation: a value is written once, by its node. So a written input is an input
// and an output: the kernel copies the input into the output and writes the output in place;
// the input is never written. This is what torch.export's functionalised graph says of such a
// call (auto_functionalized_v2: the op's results, then the new value of each written base), and
// opforge.onnx's translation maps those new values to the extra outputs, so a later read of `x`
// in the model reads `x_out` (torch 2.11's ONNX exporter does not reach that translation yet: it
// takes the call's op argument for a graph node).
//
// Each op is registered for the CPU execution provider (the CPU reference) and, where it has a
// CUDA kernel, for the CUDA execution provider: inputs and outputs in device memory, the kernel
// on ONNX Runtime's compute stream of the node, scratch memory from ONNX Runtime's allocator of
// the device. Input and output element types are left open (any type): the core checks every
// call (dtype, shape, device, parameters, rules) and raises the call's message, which ONNX
// Runtime reports as the node's failure. Output types and shapes for ONNX Runtime's own shape
// inference come from the core too (InferOutputShapeFn: output_types.h); ONNX Runtime does not
// report a failure of that function, so a graph whose sizes contradict an op's rules loads and
// fails when it runs, with the call's message. ONNX Runtime's shape-inference context has no type
// for an empty input (its context dereferences it), so the function is given to ops whose
// optional tensor inputs all follow their required ones, and opforge.onnx writes no empty input
// after the last given one: a node then lists only the inputs it has. An op with an optional
// tensor input before a required one gets no shape-inference function, so ONNX Runtime takes
// its output types from its inputs (which it can only where the op has one input of open type).
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "../core/library.h"
#include "../core/records.h"
#include "../core/schema.h"
#include "kernel.h"
#include "output_types.h"
#include "types.h"

namespace opforge::ort {
namespace {

/// The session configuration entry that names the op libraries to serve: their paths, separated
/// by ':' (os.pathsep). opforge.onnx.session_options sets it.
constexpr const char* kLibrariesKey = "opforge.op_libraries";

const OpEntry& entry(const CustomOp* op) { return *reinterpret_cast<const OpEntry*>(op); }

int32_t num_tensor_inputs(const OpforgeOpSpec& op) {
  int32_t n = 0;
  for (int32_t i = 0; i < op.num_args; ++i) n += op.args[i].kind == OPFORGE_ARG_TENSOR;
  return n;
}

/// The argument index of tensor input `index` (its position among the tensor inputs).
int32_t tensor_arg(const OpforgeOpSpec& op, size_t index) {
  for (int32_t i = 0, k = 0; i < op.num_args; ++i)
    if (op.args[i].kind == OPFORGE_ARG_TENSOR && static_cast<size_t>(k++) == index) return i;
  return -1;
}

/// The argument index of the written input whose new value is output slot `index` (past the
/// op's own outputs), or -1.
int32_t written_arg(const OpforgeOpSpec& op, size_t index) {
  size_t k = static_cast<size_t>(op.num_outputs);
  for (int32_t i = 0; i < op.num_args; ++i)
    if (core::is_mutated(op.args[i]) && k++ == index) return i;
  return -1;
}

size_t num_node_outputs(const OpforgeOpSpec& op) {
  size_t n = static_cast<size_t>(op.num_outputs);
  for (int32_t i = 0; i < op.num_args; ++i) n += core::is_mutated(op.args[i]);
  return n;
}

/// A node's attributes from ONNX Runtime's shape-inference context.
class InferSource final : public AttributeSource {
 public:
  InferSource(Api api, ShapeInferContext* ctx) : api_(api), ctx_(ctx) {}
  bool int64(const char* name, int64_t& out) override { return read(name, kAttrInt, &out, sizeof out); }
  bool float32(const char* name, float& out) override { return read(name, kAttrFloat, &out, sizeof out); }
  bool string(const char* name, std::string& out) override {
    size_t size = 0;
    const OpAttr* attr = find(name);
    if (attr == nullptr) return false;
    release(api_.call<Status*>(Slot::ReadOpAttr, attr, kAttrString, static_cast<void*>(nullptr), size_t{0}, &size));
    std::vector<char> text(size + 1, '\0');
    if (!read(name, kAttrString, text.data(), text.size())) return false;
    out.assign(text.data());
    return true;
  }
  bool ints(const char* name, std::vector<int64_t>& out) override { return array(name, kAttrInts, out); }
  bool floats(const char* name, std::vector<float>& out) override { return array(name, kAttrFloats, out); }

 private:
  void release(Status* s) const {
    if (s != nullptr) api_.call<void>(Slot::ReleaseStatus, s);
  }
  const OpAttr* find(const char* name) const {
    const OpAttr* attr = nullptr;
    Status* s = api_.call<Status*>(Slot::ShapeInferContext_GetAttribute, static_cast<const ShapeInferContext*>(ctx_),
                                   name, &attr);
    if (s != nullptr) {
      release(s);
      return nullptr;
    }
    return attr;
  }
  bool read(const char* name, AttrType type, void* data, size_t len) const {
    const OpAttr* attr = find(name);
    if (attr == nullptr) return false;
    size_t out = 0;
    Status* s = api_.call<Status*>(Slot::ReadOpAttr, attr, type, data, len, &out);
    release(s);
    return s == nullptr;
  }
  template <class T>
  bool array(const char* name, AttrType type, std::vector<T>& out) const {
    const OpAttr* attr = find(name);
    if (attr == nullptr) return false;
    size_t bytes = 0;
    release(api_.call<Status*>(Slot::ReadOpAttr, attr, type, static_cast<void*>(nullptr), size_t{0}, &bytes));
    out.resize(bytes / sizeof(T));
    return read(name, type, out.data(), bytes);
  }

  Api api_;
  ShapeInferContext* ctx_;
};

/// The API version every op library's entry was registered with; set by RegisterCustomOps.
Api g_api{nullptr};

// The OrtCustomOp callbacks.
const char* get_name(const CustomOp* op) { return entry(op).name.c_str(); }
const char* get_provider(const CustomOp* op) {
  return entry(op).device_type == OPFORGE_DEVICE_CUDA ? "CUDAExecutionProvider" : "CPUExecutionProvider";
}
ElementType any_type(const CustomOp*, size_t) { return kUndefined; }
size_t input_count(const CustomOp* op) { return static_cast<size_t>(num_tensor_inputs(*entry(op).op)); }
size_t output_count(const CustomOp* op) { return num_node_outputs(*entry(op).op); }
Characteristic input_characteristic(const CustomOp* op, size_t index) {
  const int32_t i = tensor_arg(*entry(op).op, index);
  return i >= 0 && core::is_optional(entry(op).op->args[i]) ? kOptional : kRequired;
}
Characteristic output_characteristic(const CustomOp* op, size_t index) {
  const OpforgeOpSpec& o = *entry(op).op;
  if (index < static_cast<size_t>(o.num_outputs)) return o.outputs[index].present_with >= 0 ? kOptional : kRequired;
  const int32_t i = written_arg(o, index);
  return i >= 0 && core::is_optional(o.args[i]) ? kOptional : kRequired;
}
MemType input_memory(const CustomOp*, size_t) { return kMemDefault; }
int one(const CustomOp*) { return 1; }
int start_version(const CustomOp*) { return 1; }
int end_version(const CustomOp*) { return INT_MAX; }

Status* create_kernel(const CustomOp* op, const void* const* api, const KernelInfo* info, void** kernel) {
  const Api a{api};
  try {
    *kernel = new Kernel(entry(op), a, info);
    return nullptr;
  } catch (...) {
    return status_of_current_exception(a);
  }
}
Status* compute(void* kernel, KernelContext* context) {
  try {
    static_cast<Kernel*>(kernel)->compute(context);
    return nullptr;
  } catch (...) {
    return status_of_current_exception(g_api);
  }
}
void destroy(void* kernel) { delete static_cast<Kernel*>(kernel); }

Status* infer(const CustomOp* op, ShapeInferContext* ctx) {
  try {
    InferSource source(g_api, ctx);
    infer_output_types(g_api, *entry(op).op, ctx, source);
    return nullptr;
  } catch (...) {
    return status_of_current_exception(g_api);
  }
}

/// The registered entries: one per op and execution provider, made once and kept for the life
/// of the process (ONNX Runtime holds their addresses in every session made with them).
std::mutex g_mutex;
std::map<std::pair<const OpforgeOpSpec*, int32_t>, std::unique_ptr<OpEntry>> g_entries;
std::deque<CustomOpDomain*> g_domains;  // kept: sessions made from the options use them

const OpEntry& entry_for(const OpforgeOpSpec& op, int32_t device_type) {
  std::unique_ptr<OpEntry>& slot = g_entries[{&op, device_type}];
  if (slot) return *slot;
  slot = std::make_unique<OpEntry>();
  OpEntry& e = *slot;
  e.op = &op;
  e.device_type = device_type;
  e.name = op.name;
  CustomOp& c = e.custom_op;
  c.version = kCustomOpVersion;
  c.GetName = get_name;
  c.GetExecutionProviderType = get_provider;
  c.GetInputType = any_type;
  c.GetInputTypeCount = input_count;
  c.GetOutputType = any_type;
  c.GetOutputTypeCount = output_count;
  c.KernelDestroy = destroy;
  c.GetInputCharacteristic = input_characteristic;
  c.GetOutputCharacteristic = output_characteristic;
  c.GetInputMemoryType = input_memory;
  c.GetVariadicInputMinArity = one;
  c.GetVariadicInputHomogeneity = one;
  c.GetVariadicOutputMinArity = one;
  c.GetVariadicOutputHomogeneity = one;
  c.CreateKernelV2 = create_kernel;
  c.KernelComputeV2 = compute;
  // Shape inference only where no required tensor input follows an optional one (Note [The
  // ONNX node of an op]).
  bool optional_seen = false, required_after_optional = false;
  for (int32_t i = 0; i < op.num_args; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR) continue;
    if (core::is_optional(op.args[i])) optional_seen = true;
    else required_after_optional = required_after_optional || optional_seen;
  }
  c.InferOutputShapeFn = required_after_optional ? nullptr : infer;
  c.GetStartVersion = start_version;
  c.GetEndVersion = end_version;
  return e;
}

/// The op-library paths of the session's configuration entry kLibrariesKey.
std::vector<std::string> library_paths(Api api, const SessionOptions* options) {
  size_t size = 0;
  Status* s =
      api.call<Status*>(Slot::GetSessionConfigEntry, options, kLibrariesKey, static_cast<char*>(nullptr), &size);
  if (s != nullptr) {
    api.call<void>(Slot::ReleaseStatus, s);
    throw InvalidArgument(std::string("opforge.ort: the session options name no op libraries: set the session "
                                      "configuration entry ") +
                          kLibrariesKey + " to their paths, separated by ':' (opforge.onnx.session_options does)");
  }
  std::vector<char> text(size + 1, '\0');
  check(api, api.call<Status*>(Slot::GetSessionConfigEntry, options, kLibrariesKey, text.data(), &size),
        "GetSessionConfigEntry");
  std::vector<std::string> paths;
  std::string all(text.data());
  for (size_t start = 0; start <= all.size();) {
    const size_t end = std::min(all.find(':', start), all.size());
    if (end > start) paths.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return paths;
}

Status* register_ops(SessionOptions* options, Api api) {
  try {
    const std::vector<std::string> paths = library_paths(api, options);
    std::map<std::string, std::vector<const OpforgeOpSpec*>> by_namespace;
    for (const std::string& path : paths) {
      const core::Library& lib = core::load_library(path);
      for (int32_t k = 0; k < lib.lib->num_ops; ++k) by_namespace[lib.lib->ops[k]->ns].push_back(lib.lib->ops[k]);
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    g_api = api;
    for (const auto& [ns, ops] : by_namespace) {
      CustomOpDomain* domain = nullptr;
      check(api, api.call<Status*>(Slot::CreateCustomOpDomain, ns.c_str(), &domain), "CreateCustomOpDomain");
      g_domains.push_back(domain);
      std::set<const OpforgeOpSpec*> seen;
      for (const OpforgeOpSpec* op : ops) {
        if (!seen.insert(op).second) continue;
        check(api, api.call<Status*>(Slot::CustomOpDomain_Add, domain, &entry_for(*op, OPFORGE_DEVICE_CPU).custom_op),
              "CustomOpDomain_Add");
        if (core::device_kernel(*op, OPFORGE_DEVICE_CUDA) != nullptr)
          check(api,
                api.call<Status*>(Slot::CustomOpDomain_Add, domain, &entry_for(*op, OPFORGE_DEVICE_CUDA).custom_op),
                "CustomOpDomain_Add");
      }
      check(api, api.call<Status*>(Slot::AddCustomOpDomain, options, domain), "AddCustomOpDomain");
    }
    return nullptr;
  } catch (...) {
    return status_of_current_exception(api);
  }
}

}  // namespace
}  // namespace opforge::ort

/// ONNX Runtime's entry point of a custom-op library: registers the ops of the op libraries the
/// session configuration entry "opforge.op_libraries" names (Note [The ONNX node of an op]).
extern "C" opforge::ort::Status* RegisterCustomOps(opforge::ort::SessionOptions* options,
                                                   const opforge::ort::ApiBase* base) {
  using namespace opforge::ort;
  const void* const* table = base->GetApi(kApiVersion);
  if (table == nullptr) {
    const Api oldest{base->GetApi(1)};
    const std::string message = std::string("opforge.ort: this ONNX Runtime (") + base->GetVersionString() +
                                ") is older than 1.17, the oldest the opforge ONNX Runtime library runs on";
    return oldest.table == nullptr ? nullptr : oldest.call<Status*>(Slot::CreateStatus, kFail, message.c_str());
  }
  return register_ops(options, Api{table});
}
