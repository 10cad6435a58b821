// The C entry points of opforge/core.h: JSON requests in, JSON responses out.
#include "opforge/core.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "c_entry.h"
#include "call.h"
#include "check.h"
#include "device_checks.h"
#include "library.h"
#include "opforge/detail/names.h"
#include "precompile.h"
#include "schema.h"
#include "sizes.h"

namespace opforge::core {

char* copy_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

std::string error_json(OpforgeStatus status, const std::string& message) {
  nlohmann::json j = {{"status", status == OPFORGE_STATUS_INVALID_ARGUMENT ? "invalid_argument" : "internal"},
                      {"message", message}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

using nlohmann::json;

json parse(const char* request) {
  try {
    return json::parse(request);
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("opforge: the request is not valid JSON: ") + e.what());
  }
}

const OpforgeOpSpec& op_of(const json& request) {
  if (!request.contains("op") || !request["op"].is_string())
    throw InvalidArgument("opforge: the request names no op (\"op\": \"ns::name\")");
  const std::string name = request["op"];
  const OpforgeOpSpec* op = find_loaded_op(name);
  if (op == nullptr) throw InvalidArgument("opforge: no loaded op named " + name + " (load its library first)");
  return *op;
}

int32_t dtype_code(const std::string& name) {
  for (int32_t d = 0; d < OPFORGE_NUM_DTYPES; ++d)
    if (name == dtype_name(d)) return d;
  return -1;
}

/// Parameter values of one request, owning the strings and lists the OpforgeValues point into.
class Values {
 public:
  /// Values of `op`'s parameters from `params` (a JSON object by name); a parameter left out
  /// takes its default, or stays zero when `required` is false; problems are appended to `why`.
  Values(const OpforgeOpSpec& op, const json& params, bool required, std::vector<std::string>& why)
      : values_(op.num_args) {
    for (int32_t i = 0; i < op.num_args; ++i) {
      const OpforgeArgSpec& a = op.args[i];
      OpforgeValue& v = values_[i];
      v.kind = a.kind;
      if (a.kind == OPFORGE_ARG_TENSOR) continue;
      if (!params.is_object() || !params.contains(a.name) || params[a.name].is_null()) {
        if (a.param.has_default) v = a.param.default_value;
        else if (required)
          why.push_back(std::string(a.name) + ": expected a value of type " + schema_type(a.kind) + ", got none");
        continue;
      }
      if (!convert(a, params[a.name], v))
        why.push_back(std::string(a.name) + ": expected a value of type " + schema_type(a.kind) + ", got " +
                      params[a.name].dump());
    }
  }
  const std::vector<OpforgeValue>& get() const { return values_; }

 private:
  static bool real(const json& j, double& out) {
    if (j.is_number()) return out = j.get<double>(), true;
    if (j == "inf") return out = INFINITY, true;
    if (j == "-inf") return out = -INFINITY, true;
    if (j == "nan") return out = NAN, true;
    return false;
  }

  /// An int64: a JSON integer, unsigned ones only up to INT64_MAX.
  static bool int64(const json& j) {
    return j.is_number_integer() && !(j.is_number_unsigned() && j.get<uint64_t>() > uint64_t{INT64_MAX});
  }

  bool convert(const OpforgeArgSpec& a, const json& j, OpforgeValue& v) {
    switch (a.kind) {
      case OPFORGE_ARG_INT:
        if (!int64(j)) return false;
        v.i = j.get<int64_t>();
        return true;
      case OPFORGE_ARG_BOOL:
        if (!j.is_boolean()) return false;
        v.i = j.get<bool>();
        return true;
      case OPFORGE_ARG_FLOAT:
        return real(j, v.f);
      case OPFORGE_ARG_STRING: {
        if (!j.is_string()) return false;
        const std::string& s = strings_.emplace_back(j.get<std::string>());
        v.s = s.c_str();
        v.len = s.size();
        return true;
      }
      case OPFORGE_ARG_INT_LIST: {
        if (!j.is_array()) return false;
        auto& list = ints_.emplace_back();
        for (const auto& e : j) {
          if (!int64(e)) return false;
          list.push_back(e.get<int64_t>());
        }
        v.ints = list.data();
        v.len = list.size();
        return true;
      }
      case OPFORGE_ARG_FLOAT_LIST: {
        if (!j.is_array()) return false;
        auto& list = floats_.emplace_back();
        for (const auto& e : j) {
          double d;
          if (!real(e, d)) return false;
          list.push_back(d);
        }
        v.floats = list.data();
        v.len = list.size();
        return true;
      }
      default:
        return false;
    }
  }

  std::vector<OpforgeValue> values_;
  std::deque<std::string> strings_;
  std::deque<std::vector<int64_t>> ints_;
  std::deque<std::vector<double>> floats_;
};

std::string precompile_request(const char* text) {
  const json request = parse(text);
  const OpforgeOpSpec& op = op_of(request);
  std::vector<std::string> why;
  const json& given = request.value("dtypes", json::object());
  std::vector<int32_t> dtypes(op.num_args, -1);
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind != OPFORGE_ARG_TENSOR || !given.contains(a.name)) continue;
    const json& d = given[a.name];
    dtypes[i] = d.is_string() ? dtype_code(d.get<std::string>()) : -1;
    if (dtypes[i] < 0) why.push_back(std::string(a.name) + ": expected a dtype opforge knows, got " + d.dump());
  }
  // Only compile-time parameters select an instantiation: the others may be left out.
  Values values(op, request.value("params", json::object()), /*required=*/false, why);
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind != OPFORGE_ARG_TENSOR && a.param.compile_time && !a.param.has_default &&
        !(request.contains("params") && request["params"].contains(a.name)))
      why.push_back(std::string(a.name) + ": expected a value for this compile-time parameter, which has no default");
  }
  if (!why.empty()) throw InvalidArgument(invalid_arguments_message(op, why));
  std::vector<std::vector<int64_t>> shapes;  // "shapes": {name: sizes} of one call, optional
  if (request.contains("shapes") && request["shapes"].is_object()) {
    shapes.resize(op.num_args);
    for (int32_t i = 0; i < op.num_args; ++i)
      if (op.args[i].kind == OPFORGE_ARG_TENSOR && request["shapes"].contains(op.args[i].name))
        shapes[i] = request["shapes"][op.args[i].name].get<std::vector<int64_t>>();
  }
  const std::string arch = request.value("arch", "sm_90");
  const json& dir = request.value("cache_dir", json());
  const bool hit = precompile(op, dtypes, values.get(), arch, dir.is_string() ? dir.get<std::string>() : "", shapes);
  return json{{"cache_hit", hit}}.dump();
}

std::string example_shapes_request(const char* text) {
  const json request = parse(text);
  const OpforgeOpSpec& op = op_of(request);
  std::vector<std::string> why;
  Values values(op, request.value("params", json::object()), /*required=*/false, why);
  if (!why.empty()) throw InvalidArgument(invalid_arguments_message(op, why));
  const auto shapes = example_shapes(op, request.value("lead", int64_t{3}), request.value("last", int64_t{37}),
                                     values.get(), request.value("leading", int32_t{1}));
  const ExampleFacts facts = example_facts(op, shapes, values.get(), request.value("omit_optional", false));
  json out = json::object(), bounds = json::object();
  for (int32_t i = 0; i < op.num_args; ++i) {
    if (op.args[i].kind == OPFORGE_ARG_TENSOR) out[op.args[i].name] = shapes[i];
    if (facts.bounds[i]) bounds[op.args[i].name] = {facts.bounds[i]->first, facts.bounds[i]->second};
  }
  return json{{"shapes", out}, {"bounds", bounds}, {"rule_problems", facts.rule_problems}}.dump();
}

std::string output_shapes_request(const char* text) {
  const json request = parse(text);
  const OpforgeOpSpec& op = op_of(request);
  const json& args = request.value("args", json::object());
  std::vector<std::string> why;
  Values values(op, args, /*required=*/true, why);
  std::vector<ArgInfo<int64_t>> info(op.num_args);
  std::deque<std::string> labels;                         // dtype and device names the ArgInfo labels point into
  std::vector<std::vector<int64_t>> shapes(op.num_args);  // the sizes the ArgInfos view
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    info[i].value = values.get()[i];
    if (a.kind != OPFORGE_ARG_TENSOR) continue;
    const json& t = args.contains(a.name) ? args[a.name] : json();
    if (t.is_null()) {
      info[i].defined = false;
      continue;
    }
    const std::string dtype = t.value("dtype", "");
    info[i].dtype = dtype_code(dtype);
    info[i].dtype_label = labels.emplace_back(dtype.empty() ? "unknown" : dtype).c_str();
    const std::string device = t.value("device", "cpu");
    const size_t colon = device.find(':');
    info[i].device_type = labels.emplace_back(device.substr(0, colon)).c_str();
    info[i].device_index = colon == std::string::npos ? -1 : std::atoi(device.c_str() + colon + 1);
    const json& shape = t.value("shape", json::array());
    for (const auto& s : shape) shapes[i].push_back(s.is_number_integer() ? s.get<int64_t>() : -1);
    info[i].sizes = shapes[i];
  }
  if (!why.empty()) throw InvalidArgument(invalid_arguments_message(op, why));
  std::vector<OutputInfo<int64_t>> outs;
  const std::string message = check_call<int64_t>(op, info, outs);
  if (!message.empty()) throw InvalidArgument(message);
  json outputs = json::array();
  for (int32_t k = 0; k < op.num_outputs; ++k)
    outputs.push_back(
        outs[k].defined
            ? json{{"name", op.outputs[k].name}, {"dtype", dtype_name(outs[k].dtype)}, {"shape", outs[k].sizes}}
            : json(nullptr));
  return json{{"outputs", outputs}}.dump();
}

std::string admission_request(const char* text) {
  const json request = parse(text);
  const OpforgeOpSpec& op = op_of(request);
  const std::string name = request.value("arg", "");
  int32_t arg = -1;
  for (int32_t i = 0; i < op.num_args; ++i)
    if (name == op.args[i].name && op.args[i].kind == OPFORGE_ARG_TENSOR) arg = i;
  if (arg < 0) throw InvalidArgument("opforge: " + qualified_name(op) + " has no tensor input named '" + name + "'");
  const std::vector<int64_t> sizes = request.value("shape", std::vector<int64_t>{});
  const std::vector<int64_t> strides = request.value("strides", std::vector<int64_t>{});
  if (sizes.size() != strides.size()) throw InvalidArgument("opforge: shape and strides differ in length");
  const int32_t dtype = dtype_code(request.value("dtype", ""));
  if (dtype < 0) throw InvalidArgument("opforge: the request gives no dtype opforge knows");
  const int64_t item = static_cast<int64_t>(dtype_size(dtype));
  // A data pointer with the given offset from a 16-byte boundary: only its remainder is read.
  void* data = reinterpret_cast<void*>(uintptr_t{4096} + static_cast<uintptr_t>(request.value("offset_bytes", 0)));
  const OpforgeTensor view{data,         dtype,         OPFORGE_DEVICE_CPU, -1, static_cast<int32_t>(sizes.size()),
                           sizes.data(), strides.data()};
  const Admission a = admit(op.args[arg].tensor, view, item);
  json out = {{"admission", a == Admission::kAsIs ? "as_is" : a == Admission::kDenseCopy ? "dense_copy" : "refuse"}};
  out["refusal"] = a == Admission::kRefuse ? json(refusal(op.args[arg], view, item)) : json(nullptr);
  return out.dump();
}

}  // namespace
}  // namespace opforge::core

using opforge::core::c_entry;

extern "C" OpforgeStatus opforge_core_load_library(const char* path, char** out) {
  return c_entry(out, [&] { return opforge::core::load_library(path).json; });
}

extern "C" OpforgeStatus opforge_core_precompile(const char* request, char** out) {
  return c_entry(out, [&] { return opforge::core::precompile_request(request); });
}

extern "C" OpforgeStatus opforge_core_example_shapes(const char* request, char** out) {
  return c_entry(out, [&] { return opforge::core::example_shapes_request(request); });
}

extern "C" OpforgeStatus opforge_core_output_shapes(const char* request, char** out) {
  return c_entry(out, [&] { return opforge::core::output_shapes_request(request); });
}

extern "C" OpforgeStatus opforge_core_admission(const char* request, char** out) {
  return c_entry(out, [&] { return opforge::core::admission_request(request); });
}

extern "C" void opforge_core_reload(void) { opforge::core::reload_kernels(); }

extern "C" void opforge_core_set_poison_outputs(int mode) { opforge::core::set_poison_mode(mode); }

extern "C" int opforge_core_poison_outputs(void) { return opforge::core::poison_mode(); }

extern "C" int opforge_core_poison_byte(const char* dtype, int mode) {
  const int32_t code = opforge::core::dtype_code(dtype == nullptr ? "" : dtype);
  return code < 0 ? -1 : opforge::core::poison_byte(code, mode);
}

extern "C" void opforge_core_set_device_value_checks(int enabled) {
  opforge::core::set_device_value_checks(enabled != 0);
}

extern "C" void opforge_core_free(char* p) { std::free(p); }
