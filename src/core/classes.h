// Custom classes (Note [Custom classes] in opforge/op_class.h): what an object keeps, what its
// __init__ takes and which of a method op's arguments come from the object, derived once from a
// library's records for every adapter.
#pragma once

#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// "ns::Name".
std::string qualified_name(const OpforgeClassSpec& c);

/// One field of an object: an output of the constructor op, or an argument of __init__ kept as
/// given.
struct ClassField {
  std::string name;
  int32_t kind = OPFORGE_ARG_TENSOR;  ///< OpforgeArgKind
  bool optional = false;              ///< a tensor that may be None (an optional output or argument)
  int32_t output = -1;                ///< the constructor op's output it is, or -1
  int32_t init_arg = -1;              ///< else the __init__ argument it is
};

/// One method: its op, and per argument of the op the field it takes (-1: the caller's).
struct MethodPlan {
  std::string name;
  const OpforgeOpSpec* op = nullptr;
  std::vector<int32_t> bound;
};

/// What a class derives: __init__ takes the constructor op's arguments (when `constructor` is
/// set) or the declared fields (kinds OpforgeClassSpec::field_kinds), in order.
struct ClassPlan {
  const OpforgeClassSpec* cls = nullptr;
  const OpforgeOpSpec* constructor = nullptr;
  std::vector<ClassField> fields;
  std::vector<MethodPlan> methods;
};

/// Derives `c`'s plan from the ops of `lib`. On a mismatch appends one line per problem to
/// `problems` ("file:line: ns::Class: ..."): a constructor or method op the library does not
/// declare, a constructor op that writes its inputs, a method op argument named after a field
/// with another type, one that writes a field (opforge::mutated), or a field that may be None
/// where the op's argument is not optional.
ClassPlan plan_class(const OpforgeLibrary& lib, const OpforgeClassSpec& c, std::vector<std::string>& problems);

/// Every problem of every class of `lib` (plan_class), one line each.
std::vector<std::string> check_classes(const OpforgeLibrary& lib);

/// "ns::Class.method", as errors raised in a method name it.
std::string method_label(const ClassPlan& plan, const MethodPlan& m);

/// Checks the value of declared field `field` against the parameter constraints (range,
/// choices) of every method op argument that takes it; one line per problem ("channels:
/// expected a value >= 1, got 0").
std::vector<std::string> field_problems(const ClassPlan& plan, int32_t field, const OpforgeValue& v);

}  // namespace opforge::core
