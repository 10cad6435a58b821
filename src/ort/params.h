// A node's attributes as an op's parameter values (Note [The ONNX node of an op] in
// registration.cpp): read once per node when ONNX Runtime creates its kernel, and when it infers
// the node's output types.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::ort {

/// Where attribute values come from (ONNX Runtime's kernel info, or its shape-inference
/// context). Each reader returns false where the node has no attribute of that name and type.
class AttributeSource {
 public:
  virtual bool int64(const char* name, int64_t& out) = 0;
  virtual bool float32(const char* name, float& out) = 0;
  virtual bool string(const char* name, std::string& out) = 0;
  virtual bool ints(const char* name, std::vector<int64_t>& out) = 0;
  virtual bool floats(const char* name, std::vector<float>& out) = 0;

 protected:
  ~AttributeSource() = default;
};

/// The parameter values of one node, by argument index (tensor slots are empty), owning the
/// strings and lists the OpforgeValues point into.
class Params {
 public:
  /// Reads every parameter of `op` from `source`: an int or bool parameter from an INT attribute
  /// (bool: nonzero), a float one from a FLOAT (ONNX attributes are float32), a string from a
  /// STRING, lists from INTS and FLOATS; one the node leaves out takes its declared default.
  /// Throws InvalidArgument (the call's message: the op's schema, one line per problem) for an
  /// attribute of another type, or a parameter without a default that the node leaves out.
  Params(const OpforgeOpSpec& op, AttributeSource& source);
  Params(const Params&) = delete;
  Params& operator=(const Params&) = delete;

  /// The value of argument `i` (a parameter).
  const OpforgeValue& operator[](int32_t i) const { return values_[static_cast<size_t>(i)]; }

 private:
  std::vector<OpforgeValue> values_;
  std::deque<std::string> strings_;
  std::deque<std::vector<int64_t>> ints_;
  std::deque<std::vector<double>> floats_;
};

}  // namespace opforge::ort
