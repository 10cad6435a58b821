// Output types of an opforge op's ONNX node (output_types.h).
#include "output_types.h"

#include <deque>
#include <string>

#include <nlohmann/json.hpp>

#include "../core/c_entry.h"
#include "../core/check.h"
#include "../core/library.h"
#include "../core/records.h"
#include "types.h"

namespace opforge::ort {

std::vector<TensorType> output_types(const OpforgeOpSpec& op, const std::vector<TensorType>& inputs,
                                     const Params& params) {
  const int32_t n = op.num_args;
  std::vector<core::ArgInfo<Dim>> info(n);
  std::vector<const TensorType*> of_arg(n, nullptr);
  size_t next = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (op.args[i].kind != OPFORGE_ARG_TENSOR) {
      info[i].value = params[i];
      continue;
    }
    info[i].value.kind = OPFORGE_ARG_TENSOR;
    const TensorType* t = next < inputs.size() ? &inputs[next] : nullptr;
    ++next;
    if (t == nullptr || !t->present) {
      info[i].defined = false;
      continue;
    }
    of_arg[i] = t;
    const TypeMap m = type_of(t->element_type);
    info[i].dtype = m.opforge;
    info[i].dtype_label = m.label;
    info[i].sizes = core::Span<const Dim>(t->dims.data(), t->dims.size());
  }
  std::vector<core::OutputInfo<Dim>> outs;
  const std::string message = core::check_call<Dim>(op, info, outs);
  if (!message.empty()) throw InvalidArgument(message);
  std::vector<TensorType> types;
  for (const auto& o : outs) {
    TensorType& t = types.emplace_back();
    t.present = o.defined;
    if (!o.defined) continue;
    t.element_type = element_type(o.dtype);
    t.dims = o.sizes;
  }
  for (int32_t i = 0; i < n; ++i)
    if (core::is_mutated(op.args[i]))
      types.push_back(of_arg[i] != nullptr ? *of_arg[i] : TensorType{kUndefined, {}, false});
  return types;
}

namespace {

/// A type's dims as ONNX Runtime takes them: values (-1 where not a number) and names ("" where
/// not a name).
struct OrtDims {
  std::vector<int64_t> values;
  std::vector<std::string> names;
  std::vector<const char*> name_ptrs;

  explicit OrtDims(const std::vector<Dim>& dims) {
    for (const Dim& d : dims) {
      values.push_back(d.number() ? d.value : -1);
      names.push_back(d.kind == Dim::kName ? d.name : "");
    }
    for (const std::string& s : names) name_ptrs.push_back(s.c_str());
  }
};

/// The type of input `index` (the context owns the info it returns).
TensorType input_type(Api api, ShapeInferContext* ctx, size_t index) {
  TensorTypeAndShapeInfo* info = nullptr;
  check(api,
        api.call<Status*>(Slot::ShapeInferContext_GetInputTypeShape, static_cast<const ShapeInferContext*>(ctx), index,
                          &info),
        "ShapeInferContext_GetInputTypeShape");
  const auto* cinfo = static_cast<const TensorTypeAndShapeInfo*>(info);
  TensorType t;
  ElementType type = kUndefined;
  size_t rank = 0;
  Status* s = api.call<Status*>(Slot::GetTensorElementType, cinfo, &type);
  if (s == nullptr) s = api.call<Status*>(Slot::GetDimensionsCount, cinfo, &rank);
  std::vector<int64_t> values(rank);
  std::vector<const char*> names(rank, nullptr);
  if (s == nullptr) s = api.call<Status*>(Slot::GetDimensions, cinfo, values.data(), rank);
  if (s == nullptr) s = api.call<Status*>(Slot::GetSymbolicDimensions, cinfo, names.data(), rank);
  for (size_t d = 0; s == nullptr && d < rank; ++d)
    t.dims.push_back(values[d] >= 0                            ? Dim(values[d])
                     : names[d] != nullptr && names[d][0] != 0 ? Dim::named(names[d])
                                                               : Dim::unknown());
  check(api, s, "ShapeInferContext_GetInputTypeShape");
  t.element_type = type;
  return t;
}

void set_output_type(Api api, ShapeInferContext* ctx, size_t index, const TensorType& t) {
  TensorTypeAndShapeInfo* info = nullptr;
  check(api, api.call<Status*>(Slot::CreateTensorTypeAndShapeInfo, &info), "CreateTensorTypeAndShapeInfo");
  OrtDims dims(t.dims);
  Status* s = api.call<Status*>(Slot::SetTensorElementType, info, static_cast<ElementType>(t.element_type));
  if (s == nullptr)
    s = api.call<Status*>(Slot::SetDimensions, info, static_cast<const int64_t*>(dims.values.data()),
                          dims.values.size());
  if (s == nullptr)
    s = api.call<Status*>(Slot::SetSymbolicDimensions, info, dims.name_ptrs.data(), dims.name_ptrs.size());
  if (s == nullptr)
    s = api.call<Status*>(Slot::ShapeInferContext_SetOutputTypeShape, static_cast<const ShapeInferContext*>(ctx), index,
                          static_cast<const TensorTypeAndShapeInfo*>(info));
  api.call<void>(Slot::ReleaseTensorTypeAndShapeInfo, info);
  check(api, s, "ShapeInferContext_SetOutputTypeShape");
}

/// A node's attributes from the request's JSON object (output_types.h).
class JsonSource final : public AttributeSource {
 public:
  explicit JsonSource(const nlohmann::json& attributes) : a_(attributes) {}
  bool int64(const char* name, int64_t& out) override { return get(name, "i", out); }
  bool float32(const char* name, float& out) override { return get(name, "f", out); }
  bool string(const char* name, std::string& out) override { return get(name, "s", out); }
  bool ints(const char* name, std::vector<int64_t>& out) override { return get(name, "ints", out); }
  bool floats(const char* name, std::vector<float>& out) override { return get(name, "floats", out); }

 private:
  template <class T>
  bool get(const char* name, const char* kind, T& out) const {
    if (!a_.is_object() || !a_.contains(name) || !a_[name].is_object() || !a_[name].contains(kind)) return false;
    try {
      out = a_[name][kind].get<T>();
      return true;
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  }
  const nlohmann::json& a_;
};

std::string output_types_request(const char* text) {
  using nlohmann::json;
  json request;
  try {
    request = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("opforge.ort: the request is not valid JSON: ") + e.what());
  }
  const std::string name = request.value("op", "");
  const OpforgeOpSpec* op = core::find_loaded_op(name);
  if (op == nullptr) throw InvalidArgument("opforge.ort: no loaded op named " + name + " (load its library first)");
  std::vector<TensorType> inputs;
  for (const json& i : request.value("inputs", json::array())) {
    TensorType& t = inputs.emplace_back();
    if (i.is_null()) {
      t.present = false;
      continue;
    }
    t.element_type = i.value("type", 0);
    for (const json& d : i.value("shape", json::array()))
      t.dims.push_back(d.is_number_integer() ? Dim(d.get<int64_t>())
                       : d.is_string()       ? Dim::named(d.get<std::string>())
                                             : Dim::unknown());
  }
  JsonSource source(request.value("attributes", json::object()));
  const Params params(*op, source);
  json outputs = json::array();
  for (const TensorType& t : output_types(*op, inputs, params)) {
    if (!t.present) {
      outputs.push_back(nullptr);
      continue;
    }
    json shape = json::array();
    for (const Dim& d : t.dims)
      shape.push_back(d.number() ? json(d.value) : d.kind == Dim::kName ? json(d.name) : json(nullptr));
    outputs.push_back({{"type", t.element_type}, {"shape", shape}});
  }
  return json{{"outputs", outputs}}.dump();
}

}  // namespace

void infer_output_types(Api api, const OpforgeOpSpec& op, ShapeInferContext* ctx, AttributeSource& source) {
  size_t count = 0;
  check(api,
        api.call<Status*>(Slot::ShapeInferContext_GetInputCount, static_cast<const ShapeInferContext*>(ctx), &count),
        "ShapeInferContext_GetInputCount");
  std::vector<TensorType> inputs;
  for (size_t i = 0; i < count; ++i) inputs.push_back(input_type(api, ctx, i));
  const Params params(op, source);
  const std::vector<TensorType> outputs = output_types(op, inputs, params);
  for (size_t k = 0; k < outputs.size(); ++k)
    if (outputs[k].present) set_output_type(api, ctx, k, outputs[k]);
}

}  // namespace opforge::ort

extern "C" OpforgeStatus opforge_ort_output_types(const char* request, char** out) {
  return opforge::core::c_entry(out, [&] { return opforge::ort::output_types_request(request); });
}
