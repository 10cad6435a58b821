// AOTInductor C shims for opforge ops.
//
// Note [AOTInductor C shims]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// An AOTInductor model calls a custom op through its proxy executor: the call's arguments,
// serialized at compile time, become an IValue stack on every run, handed to the dispatcher
// (c10::OperatorHandle::callBoxed). With `aot_inductor.custom_ops_to_c_shims` the generated model
// calls an `extern "C"` function instead, `aoti_torch_<device>_<op>` (the op's name without its
// namespace: torch/_inductor/codegen/cpp_wrapper_cpu.py, get_c_shim_func_name), with the C shim
// types of torchgen (c_type_for_prim_type there): Tensor -> AtenTensorHandle, Tensor? ->
// AtenTensorHandle* (null for None), int and SymInt -> int64_t, float -> double, bool -> int32_t,
// an optional scalar -> a pointer to it (null for None), then one AtenTensorHandle* per returned
// tensor, which the shim fills with a new handle the model owns (an op that returns nothing, one
// that writes its inputs, is passed one null output all the same). The functions come from the
// libraries of `aot_inductor.custom_op_libs`, which the model links.
//
// opforge generates those functions from each op's registered schema (aoti_shim): each passes
// its arguments as an array of pointers to opforge_torch_aoti_call, which builds the stack from
// the schema's types and runs the op's boxed kernel for that device (kernel.cpp: the one the
// dispatcher would reach, checks included) without the dispatcher's walk over dispatch keys or
// the proxy executor's argument handling. The generated source includes no torch header: the
// handles are opaque pointers (AtenTensorHandle is an at::Tensor*, as in
// torch/csrc/inductor/aoti_torch/utils.h). Ops with other argument or return types keep the proxy
// executor (aoti_shim says why); opforge/aoti.py builds the library, passes the declarations and
// carries the library in the package, which the runner loads before the model.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "../core/backward.h"
#include "../core/c_entry.h"
#include "../core/library.h"
#include "../core/schema.h"
#include "kernel.h"
#include "opforge/error.h"

namespace opforge::torch {
namespace {

/// An op's kernel for one device, as a shim calls it.
struct ShimOp {
  std::string name;
  c10::FunctionSchema schema;
  std::function<void(::torch::jit::Stack*)> run;
};

const OpforgeOpSpec* find_spec(const std::string& qualified) {
  for (const core::Library* l : core::loaded_libraries())
    if (const OpforgeOpSpec* op = core::find_op(*l->lib, qualified)) return op;
  return nullptr;
}

/// The Mode of a C shim's device name: kCpu for "cpu", kCuda for "cuda", nullopt for any other.
std::optional<Mode> shim_mode(const std::string& device) {
  if (device == "cpu") return Mode::kCpu;
  if (device == "cuda") return Mode::kCuda;
  return std::nullopt;
}

/// The C shim type of a schema type, or "" where C shims cannot carry it.
std::string c_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::OptionalType) {
    const std::string inner = c_type(t->castRaw<c10::OptionalType>()->getElementType());
    return inner.empty() ? "" : inner + "*";
  }
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      return "AtenTensorHandle";
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return "int64_t";
    case c10::TypeKind::FloatType:
      return "double";
    case c10::TypeKind::BoolType:
      return "int32_t";
    default:
      return "";
  }
}

c10::IValue to_ivalue(const c10::TypePtr& t, const void* p) {
  if (t->kind() == c10::TypeKind::OptionalType)
    return p == nullptr ? c10::IValue() : to_ivalue(t->castRaw<c10::OptionalType>()->getElementType(), p);
  switch (t->kind()) {
    case c10::TypeKind::TensorType:  // an AtenTensorHandle is an at::Tensor*
      return p == nullptr ? c10::IValue() : c10::IValue(*static_cast<const at::Tensor*>(p));
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return c10::IValue(*static_cast<const int64_t*>(p));
    case c10::TypeKind::FloatType:
      return c10::IValue(*static_cast<const double*>(p));
    case c10::TypeKind::BoolType:
      return c10::IValue(*static_cast<const int32_t*>(p) != 0);
    default:
      throw InternalError("opforge: a C shim was given an argument of type " + t->str());
  }
}

const c10::FunctionSchema& registered_schema(const std::string& name) {
  const auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!handle) throw InvalidArgument("opforge: " + name + " is not registered with PyTorch (load its library first)");
  return handle->schema();
}

/// The C shim of op `name` ("ns::op") on `device` ("cpu" or "cuda"), as JSON: {"function": the
/// shim's name, "declaration": its prototype (for aot_inductor.custom_ops_to_c_shims),
/// "definition": its C++ source, which needs only <stdint.h> and the prelude of
/// opforge_torch_aoti_prelude}. Throws InvalidArgument (the reason) for an op that is not
/// loaded, has no kernel for the device, or has an argument or return type C shims cannot carry
/// (Note [AOTInductor C shims]).
std::string aoti_shim(const std::string& name, const std::string& device) {
  const OpforgeOpSpec* op = find_spec(name);
  if (op == nullptr) throw InvalidArgument("opforge: no loaded op library declares " + name);
  const std::optional<Mode> mode = shim_mode(device);
  if (!mode) throw InvalidArgument("opforge: C shims are for device \"cpu\" or \"cuda\", not \"" + device + "\"");
  if (kernel_for(*op, *mode) == nullptr) throw InvalidArgument("opforge: " + name + " has no " + device + " kernel");
  const c10::FunctionSchema& schema = registered_schema(name);
  const std::string function = "aoti_torch_" + device + "_" + op->name;
  std::ostringstream params, args, outs;
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string type = c_type(arguments[i].type());
    if (type.empty())
      throw InvalidArgument("opforge: " + name + "'s argument " + arguments[i].name() + " (" +
                            arguments[i].type()->str() + ") has no C shim type");
    params << (i ? ", " : "") << type << " a" << i;
    // Each argument as a pointer: a handle itself (null for an absent Tensor?), a scalar's address,
    // an optional scalar's pointer as given.
    const bool tensor = type == "AtenTensorHandle", optional_tensor = type == "AtenTensorHandle*";
    const bool optional_scalar = !optional_tensor && type.back() == '*';
    args << (i ? ", " : "")
         << (tensor ? "static_cast<const void*>(a" + std::to_string(i) + ")"
             : optional_tensor
                 ? "a" + std::to_string(i) + " ? static_cast<const void*>(*a" + std::to_string(i) + ") : nullptr"
             : optional_scalar ? "static_cast<const void*>(a" + std::to_string(i) + ")"
                               : "static_cast<const void*>(&a" + std::to_string(i) + ")");
  }
  const auto& returns = schema.returns();
  for (size_t r = 0; r < returns.size(); ++r) {
    const c10::TypePtr& t = returns[r].type();
    const bool tensor = t->kind() == c10::TypeKind::TensorType ||
                        (t->kind() == c10::TypeKind::OptionalType &&
                         t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType);
    if (!tensor) throw InvalidArgument("opforge: " + name + " returns " + t->str() + ", which C shims cannot carry");
    params << (arguments.empty() && r == 0 ? "" : ", ") << "AtenTensorHandle* ret" << r;
    outs << (r ? ", " : "") << "static_cast<void*>(ret" << r << ")";
  }
  if (returns.empty())  // AOTInductor passes one (null) output for an op that returns nothing
    params << (arguments.empty() ? "" : ", ") << "AtenTensorHandle* ret0";
  const std::string declaration = "AOTITorchError " + function + "(" + params.str() + ")";
  std::ostringstream def;
  def << "extern \"C\" " << declaration << " {\n"
      << "  static void* const op = opforge_torch_aoti_op(\"" << name << "\", \"" << device << "\");\n";
  def << "  const void* const args[] = {" << (arguments.empty() ? "nullptr" : args.str()) << "};\n";
  def << "  void* const outs[] = {" << (returns.empty() ? "nullptr" : outs.str()) << "};\n";
  def << "  return opforge_torch_aoti_call(op, args, outs);\n}\n";
  return nlohmann::json{{"function", function}, {"declaration", declaration}, {"definition", def.str()}}.dump();
}

}  // namespace
}  // namespace opforge::torch

/// The shim library's prelude: the opaque types and the two entry points its functions call.
extern "C" const char* opforge_torch_aoti_prelude() {
  return "#include <stdint.h>\n"
         "typedef struct AtenTensorOpaque* AtenTensorHandle;\n"
         "typedef int32_t AOTITorchError;\n"
         "extern \"C\" void* opforge_torch_aoti_op(const char* name, const char* device);\n"
         "extern \"C\" AOTITorchError opforge_torch_aoti_call(void* op, const void* const* args, void* const* outs);\n";
}

/// JSON of opforge::torch::aoti_shim for request "<ns>::<op> <device>".
extern "C" OpforgeStatus opforge_torch_aoti_shim(const char* request, char** out) {
  return opforge::core::c_entry(out, [&] {
    std::istringstream in(request);
    std::string name, device;
    in >> name >> device;
    return opforge::torch::aoti_shim(name, device);
  });
}

/// The kernel a shim calls, found once per shim (its function-local static): null, with the
/// reason on stderr, where the op is not loaded or has no kernel for `device`.
extern "C" void* opforge_torch_aoti_op(const char* name, const char* device) {
  try {
    const OpforgeOpSpec* op = opforge::torch::find_spec(name);
    const std::optional<opforge::torch::Mode> mode = opforge::torch::shim_mode(device);
    const OpforgeKernel* kernel = op && mode ? opforge::torch::kernel_for(*op, *mode) : nullptr;
    if (kernel == nullptr)
      throw opforge::InvalidArgument(std::string("no ") + device + " kernel of " + name + " is loaded");
    return new opforge::torch::ShimOp{name, opforge::torch::registered_schema(name),
                                      opforge::torch::make_boxed_run(*op, *mode, kernel)};
  } catch (const std::exception& e) {
    std::cerr << "opforge: C shim of " << name << ": " << e.what() << "\n";
    return nullptr;
  }
}

/// Runs a shim's op: `args` as the generated shim passes them (Note [AOTInductor C shims]),
/// `outs[r]` an AtenTensorHandle* for return r (null: not wanted). 0 on success; else 1, with
/// the op's error on stderr (AOTInductor's caller then throws, naming the shim).
extern "C" int32_t opforge_torch_aoti_call(void* op, const void* const* args, void* const* outs) {
  if (op == nullptr) return 1;  // opforge_torch_aoti_op said why
  const auto& s = *static_cast<const opforge::torch::ShimOp*>(op);
  try {
    const auto& arguments = s.schema.arguments();
    ::torch::jit::Stack stack;
    stack.reserve(arguments.size());
    for (size_t i = 0; i < arguments.size(); ++i)
      stack.push_back(opforge::torch::to_ivalue(arguments[i].type(), args[i]));
    s.run(&stack);
    for (size_t r = 0; r < stack.size(); ++r) {
      if (outs[r] == nullptr) continue;
      *static_cast<at::Tensor**>(outs[r]) = new at::Tensor(stack[r].isNone() ? at::Tensor() : stack[r].toTensor());
    }
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "opforge: " << s.name << ": " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "opforge: " << s.name << ": " << e.what() << "\n";
  }
  return 1;
}
