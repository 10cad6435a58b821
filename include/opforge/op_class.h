// opforge/op_class.h -- OPFORGE_CLASS: state kept between calls, as a custom class whose
// methods are ops of the same file (part of opforge/op.h).
//
// Note [Custom classes]
// ---------------------
// State kept between calls (packed or quantised weights, a table, a configuration) is a custom
// class, declared beside the ops that use it:
//
//   OPFORGE_CLASS(examples, Int8Linear)
//       .doc("y = x W^T + b with W stored as int8 per output channel")
//       .constructor("int8_linear_pack")  // (Tensor weight, Tensor? bias) -> (qweight, scales)
//       .method("forward", "int8_linear");  // (Tensor x, Tensor qweight, Tensor scales, Tensor? bias)
//
// With a constructor op, the class's `__init__` takes that op's arguments and runs it, and the
// object keeps its outputs, then those of its arguments that a method takes (bias above). With
// `.field<T>(name)` declarations instead (the parameter types of .param<T>), `__init__` takes those
// fields and the object keeps them as given.
//
// A method runs its op with the object's fields as the op's arguments of the same names, and the
// caller's arguments as the op's other ones, in order: `forward(Tensor x) -> Tensor` above. Methods
// are ops like any other (checks before any launch, CPU reference, CUDA kernels, verify, backward
// ops); errors raised in a method name the class and method. A declared field's value is checked at
// construction against the parameter constraints of every method op that takes it.
//
// Loaded through the torch adapter this becomes the torchbind class
// `torch.classes.examples.Int8Linear`: fields readable as attributes, `__getstate__`/`__setstate__`
// (torch.save and torch.load of a module holding an instance, in a process that loaded the
// library), and `__obj_flatten__` with a fake class registered for it, so
// torch.compile(fullgraph=True), torch.export and AOTInductor packages trace modules that hold an
// instance (the package carries the object; the C++ runner loads the library that defines the class
// first).
//
// Loading refuses a constructor or method op that is missing, a method op's argument named after a
// field with another type, a method op that writes a field, and a method name given twice or
// reserved.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "opforge/detail/op_detail.h"

namespace opforge {

/// Builds a custom class declaration; see Note [Custom classes] above. Produced by OPFORGE_CLASS.
class ClassBuilder {
 public:
  explicit ClassBuilder(std::unique_ptr<detail::ClassDef> def) : def_(std::move(def)) {}

  /// One-line description, shown in docs.
  ClassBuilder doc(std::string text) && {
    def_->doc = std::move(text);
    return std::move(*this);
  }

  /// A field that `__init__` takes and the object keeps as given, of C++ type T (the parameter
  /// types of OpBuilder::param, opforge/op_builder.h). Not with .constructor().
  template <class T>
  ClassBuilder field(std::string name) && {
    def_->field_names.push_back(std::move(name));
    def_->field_kinds.push_back(detail::ParamTraits<T>::kind);
    return std::move(*this);
  }

  /// The op `__init__` runs ("name" in the class's namespace, or "ns::name"): `__init__` takes
  /// its arguments, and the object keeps its outputs and those of its arguments a method takes.
  ClassBuilder constructor(std::string op) && {
    def_->constructor = std::move(op);
    return std::move(*this);
  }

  /// A method `name` that runs `op` with the object's fields as its arguments of the same names.
  ClassBuilder method(std::string name, std::string op) && {
    def_->methods.emplace_back(std::move(name), std::move(op));
    return std::move(*this);
  }

  /// \private Hands the finished declaration to the registry (used by OPFORGE_CLASS).
  std::unique_ptr<detail::ClassDef> release() && { return std::move(def_); }

 private:
  std::unique_ptr<detail::ClassDef> def_;
};

namespace detail {
inline ClassBuilder make_class(const char* ns, const char* name, const char* file, int line) {
  return ClassBuilder(std::make_unique<ClassDef>(ns, name, file, line));
}
struct ClassRegistration {
  ClassRegistration(ClassBuilder&& b) { registry().add(std::move(b).release()); }  // NOLINT: implicit by design
};
}  // namespace detail

}  // namespace opforge

/// Declares the custom class `ns::Name` in the enclosing op library (Note [Custom classes] above);
/// follow it with the builder chain and a semicolon. At namespace scope only.
#define OPFORGE_CLASS(ns, name)                                                                                    \
  [[maybe_unused]] static const ::opforge::detail::ClassRegistration OPFORGE_CONCAT(opforge_class_, __COUNTER__) = \
      ::opforge::detail::make_class(#ns, #name, __FILE__, __LINE__)
