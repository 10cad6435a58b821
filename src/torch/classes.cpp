// torchbind classes derived from opforge class declarations (classes.h).
//
// Note [Fields as attributes]
// ---------------------------
// A class written with torch::class_<T> keeps a C++ object in one capsule attribute. An opforge
// class has no C++ type of its own: its ClassType is created here, with one attribute per field
// (a Tensor, Tensor?, int, float, bool, str, int[] or float[]), and every method is a boxed
// BuiltinOpFunction, as torch::class_::_def_unboxed makes them. The object is then an ordinary
// ivalue::Object: TorchScript's pickler and unpickler run its __getstate__/__setstate__, Python
// reads fields as attributes (ScriptObject.__getattr__ falls back to attributes), and
// AOTInductor's proxy executor calls its methods by name.
#include "classes.h"

#include <ATen/core/builtin_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <torch/custom_class.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../core/check.h"
#include "../core/classes.h"
#include "../core/schema.h"
#include "types.h"

namespace opforge::torch {
namespace {

using ::torch::jit::Stack;

c10::TypePtr field_type(const core::ClassField& f) {
  switch (f.kind) {
    case OPFORGE_ARG_TENSOR:
      return f.optional ? c10::OptionalType::create(c10::TensorType::get()) : c10::TypePtr(c10::TensorType::get());
    case OPFORGE_ARG_INT:
      return c10::IntType::get();
    case OPFORGE_ARG_FLOAT:
      return c10::FloatType::get();
    case OPFORGE_ARG_BOOL:
      return c10::BoolType::get();
    case OPFORGE_ARG_STRING:
      return c10::StringType::get();
    case OPFORGE_ARG_INT_LIST:
      return c10::ListType::ofInts();
    default:
      return c10::ListType::ofFloats();
  }
}

/// The C ABI value of a declared field's IValue, for core::field_problems; `text` and `ints`/
/// `floats` keep what it points into.
struct FieldValue {
  OpforgeValue v{};
  std::string text;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  FieldValue(int32_t kind, const c10::IValue& iv) {
    v.kind = kind;
    switch (kind) {
      case OPFORGE_ARG_INT:
        v.i = iv.toInt();
        break;
      case OPFORGE_ARG_BOOL:
        v.i = iv.toBool();
        break;
      case OPFORGE_ARG_FLOAT:
        v.f = iv.toDouble();
        break;
      case OPFORGE_ARG_STRING:
        text = iv.toStringRef();
        v.s = text.c_str();
        v.len = text.size();
        break;
      case OPFORGE_ARG_INT_LIST:
        ints = iv.toIntVector();
        v.ints = ints.data();
        v.len = ints.size();
        break;
      case OPFORGE_ARG_FLOAT_LIST:
        floats = iv.toDoubleVector();
        v.floats = floats.data();
        v.len = floats.size();
        break;
    }
  }
};

c10::OperatorHandle op_handle(const OpforgeOpSpec& op) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(core::qualified_name(op).c_str(), "");
}

/// Runs `body`, naming `label` ("ns::Class.method") in front of any error it raises, with the
/// error's type kept (ValueError, NotImplementedError, RuntimeError; opforge's errors as
/// with_torch_errors maps them).
template <class Body>
void naming(const std::string& label, Body&& body) {
  try {
    with_torch_errors(body);
  } catch (const c10::ValueError& e) {
    C10_THROW_ERROR(ValueError, label + ": " + e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    C10_THROW_ERROR(NotImplementedError, label + ": " + e.what_without_backtrace());
  } catch (const c10::Error& e) {
    C10_THROW_ERROR(Error, label + ": " + e.what_without_backtrace());
  }
}

class ClassRegistration {
 public:
  ClassRegistration(const OpforgeLibrary& lib, const OpforgeClassSpec& c) {
    std::vector<std::string> problems;
    plan_ = std::make_shared<core::ClassPlan>(core::plan_class(lib, c, problems));  // checked at load
    const std::string qualified = std::string("__torch__.torch.classes.") + c.ns + "." + c.name;
    type_ = c10::ClassType::create(c10::QualifiedName(qualified), std::weak_ptr<::torch::jit::CompilationUnit>(),
                                   /*is_module=*/false, c.doc ? c.doc : "");
    for (const auto& f : plan_->fields) type_->addAttribute(f.name, field_type(f));
    ::torch::registerCustomClass(type_);
    define_init();
    for (size_t m = 0; m < plan_->methods.size(); ++m) define_method(m);
    define_state();
  }

 private:
  c10::Argument self() const { return c10::Argument("self", type_); }

  void add(const std::string& name, std::vector<c10::Argument> args, std::vector<c10::Argument> returns,
           std::function<void(Stack&)> body) {
    args.insert(args.begin(), self());
    c10::FunctionSchema schema(name, "", std::move(args), std::move(returns));
    auto fn = std::make_unique<::torch::jit::BuiltinOpFunction>(c10::QualifiedName(*type_->name(), name),
                                                                std::move(schema), std::move(body), "");
    type_->addMethod(fn.get());
    ::torch::registerCustomClassMethod(std::move(fn));
  }

  /// __init__(self, <constructor op's arguments | declared fields>) -> None.
  void define_init() {
    std::vector<c10::Argument> args;
    std::optional<c10::OperatorHandle> ctor;
    if (plan_->constructor) {
      ctor = op_handle(*plan_->constructor);
      args = ctor->schema().arguments();
    } else {
      for (const auto& f : plan_->fields) args.emplace_back(f.name, field_type(f));
    }
    const size_t n = args.size();
    auto plan = plan_;
    const std::string label = core::qualified_name(*plan->cls) + ".__init__";
    add("__init__", std::move(args), {c10::Argument("", c10::NoneType::get())}, [plan, ctor, n, label](Stack& stack) {
      auto object = stack[stack.size() - n - 1].toObject();
      std::vector<c10::IValue> given(stack.end() - n, stack.end());
      naming(label, [&] {
        std::vector<c10::IValue> results;
        if (ctor) {
          Stack call(given.begin(), given.end());
          ctor->callBoxed(call);
          results = std::move(call);
        } else {
          std::vector<std::string> problems;
          for (size_t k = 0; k < plan->fields.size(); ++k) {
            FieldValue v(plan->fields[k].kind, given[k]);
            for (auto& p : core::field_problems(*plan, static_cast<int32_t>(k), v.v)) problems.push_back(p);
          }
          if (!problems.empty()) {
            std::string message = "invalid arguments:";
            for (const auto& p : problems) message += "\n  " + p;
            throw InvalidArgument(message);
          }
        }
        for (size_t k = 0; k < plan->fields.size(); ++k) {
          const core::ClassField& f = plan->fields[k];
          object->setSlot(k, f.output >= 0 ? results[f.output] : given[f.init_arg]);
        }
      });
      ::torch::jit::drop(stack, n + 1);
      stack.emplace_back();
    });
  }

  /// <method>(self, <the op's arguments not bound to fields>) -> the op's returns.
  void define_method(size_t m) {
    const core::MethodPlan& mp = plan_->methods[m];
    const c10::OperatorHandle op = op_handle(*mp.op);
    std::vector<c10::Argument> args;
    for (size_t i = 0; i < mp.bound.size(); ++i)
      if (mp.bound[i] < 0) args.push_back(op.schema().arguments()[i]);
    const size_t n = args.size();
    auto plan = plan_;
    const std::string label = core::method_label(*plan_, mp);
    add(mp.name, std::move(args), op.schema().returns(), [plan, m, op, n, label](Stack& stack) {
      const core::MethodPlan& mp = plan->methods[m];
      auto object = stack[stack.size() - n - 1].toObject();
      Stack call;
      size_t next = stack.size() - n;
      for (int32_t field : mp.bound) call.push_back(field >= 0 ? object->getSlot(field) : stack[next++]);
      naming(label, [&] { op.callBoxed(call); });
      ::torch::jit::drop(stack, n + 1);
      for (auto& r : call) stack.push_back(std::move(r));
    });
  }

  /// __getstate__ (the fields as a tuple), __setstate__ (from one), __obj_flatten__ ((name,
  /// value) pairs, what torch._library.fake_class_registry turns into the fake class).
  void define_state() {
    std::vector<c10::TypePtr> types, pairs;
    for (const auto& f : plan_->fields) {
      types.push_back(field_type(f));
      pairs.push_back(c10::TupleType::create({c10::StringType::get(), field_type(f)}));
    }
    const c10::TypePtr state = c10::TupleType::create(types), flat = c10::TupleType::create(pairs);
    auto plan = plan_;
    add("__getstate__", {}, {c10::Argument("", state)}, [](Stack& stack) {
      auto object = stack.back().toObject();
      stack.pop_back();
      stack.emplace_back(c10::ivalue::Tuple::create(object->slots()));
    });
    add("__setstate__", {c10::Argument("state", state)}, {c10::Argument("", c10::NoneType::get())},
        [plan](Stack& stack) {
          auto values = stack.back().toTupleRef().elements();
          auto object = stack[stack.size() - 2].toObject();
          TORCH_CHECK_VALUE(values.size() == plan->fields.size(), core::qualified_name(*plan->cls),
                            ".__setstate__: expected a state of ", plan->fields.size(), " fields, got ", values.size());
          for (size_t k = 0; k < values.size(); ++k) object->setSlot(k, values[k]);
          ::torch::jit::drop(stack, 2);
          stack.emplace_back();
        });
    add("__obj_flatten__", {}, {c10::Argument("", flat)}, [plan](Stack& stack) {
      auto object = stack.back().toObject();
      stack.pop_back();
      std::vector<c10::IValue> items;
      for (size_t k = 0; k < plan->fields.size(); ++k)
        items.emplace_back(c10::ivalue::Tuple::create({c10::IValue(plan->fields[k].name), object->getSlot(k)}));
      stack.emplace_back(c10::ivalue::Tuple::create(std::move(items)));
    });
  }

  std::shared_ptr<core::ClassPlan> plan_;
  c10::ClassTypePtr type_;
};

}  // namespace

void register_classes(const OpforgeLibrary& lib) {
  for (const OpforgeClassSpec* c : core::library_classes(lib)) ClassRegistration(lib, *c);
}

}  // namespace opforge::torch
