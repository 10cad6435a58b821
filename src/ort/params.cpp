// A node's attributes as an op's parameter values (params.h).
#include "params.h"

#include "../core/call.h"
#include "../core/check.h"
#include "../core/schema.h"
#include "opforge/error.h"

namespace opforge::ort {
namespace {

/// The ONNX attribute type a parameter of `kind` is written as (in messages).
const char* attribute_type(int32_t kind) {
  switch (kind) {
    case OPFORGE_ARG_INT:
    case OPFORGE_ARG_BOOL:
      return "INT";
    case OPFORGE_ARG_FLOAT:
      return "FLOAT";
    case OPFORGE_ARG_STRING:
      return "STRING";
    case OPFORGE_ARG_INT_LIST:
      return "INTS";
    default:
      return "FLOATS";
  }
}

/// Whether the node has an attribute `name` of a type other than the one a parameter of `kind` takes.
bool has_other_type(AttributeSource& source, const char* name, int32_t kind) {
  int64_t i;
  float f;
  std::string s;
  std::vector<int64_t> is;
  std::vector<float> fs;
  const bool integer = kind == OPFORGE_ARG_INT || kind == OPFORGE_ARG_BOOL;
  return (!integer && source.int64(name, i)) || (kind != OPFORGE_ARG_FLOAT && source.float32(name, f)) ||
         (kind != OPFORGE_ARG_STRING && source.string(name, s)) ||
         (kind != OPFORGE_ARG_INT_LIST && source.ints(name, is)) ||
         (kind != OPFORGE_ARG_FLOAT_LIST && source.floats(name, fs));
}

}  // namespace

Params::Params(const OpforgeOpSpec& op, AttributeSource& source) : values_(static_cast<size_t>(op.num_args)) {
  std::vector<std::string> problems;
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    OpforgeValue& v = values_[static_cast<size_t>(i)];
    v.kind = a.kind;
    if (a.kind == OPFORGE_ARG_TENSOR) continue;
    bool found = false;
    switch (a.kind) {
      case OPFORGE_ARG_INT:
      case OPFORGE_ARG_BOOL: {
        int64_t x = 0;
        found = source.int64(a.name, x);
        v.i = a.kind == OPFORGE_ARG_BOOL ? (x != 0) : x;
        break;
      }
      case OPFORGE_ARG_FLOAT: {
        float x = 0;
        found = source.float32(a.name, x);
        v.f = x;
        break;
      }
      case OPFORGE_ARG_STRING: {
        std::string& s = strings_.emplace_back();
        found = source.string(a.name, s);
        v.s = s.c_str();
        v.len = s.size();
        break;
      }
      case OPFORGE_ARG_INT_LIST: {
        std::vector<int64_t>& list = ints_.emplace_back();
        found = source.ints(a.name, list);
        v.ints = list.data();
        v.len = list.size();
        break;
      }
      default: {
        std::vector<float> list;
        found = source.floats(a.name, list);
        std::vector<double>& wide = floats_.emplace_back(list.begin(), list.end());
        v.floats = wide.data();
        v.len = wide.size();
        break;
      }
    }
    if (found) continue;
    if (has_other_type(source, a.name, a.kind)) {
      problems.push_back(std::string(a.name) + ": expected an attribute of type " + attribute_type(a.kind) + " (" +
                         core::schema_type(a.kind) + "), got one of another type");
    } else if (!a.param.has_default) {
      problems.push_back(std::string(a.name) + ": expected an attribute of type " + attribute_type(a.kind) + " (" +
                         core::schema_type(a.kind) + "), got none");
    } else {
      v = core::default_value(op, i);
    }
  }
  if (!problems.empty()) throw InvalidArgument(core::invalid_arguments_message(op, problems));
}

}  // namespace opforge::ort
