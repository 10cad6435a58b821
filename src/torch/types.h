// Translation between torch and opforge's C ABI: dtypes, device names, tensor views, symbolic
// sizes, and opforge's errors as torch's.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <string>

#include "../core/check.h"
#include "opforge/c_api.h"
#include "opforge/error.h"

namespace opforge::core {
/// Symbolic sizes: c10::SymInt arithmetic builds sympy expressions under torch.compile and
/// torch.export; comparisons add guards rather than specialising on a value.
template <>
struct IntOps<c10::SymInt> {
  static c10::SymInt floordiv(const c10::SymInt& a, const c10::SymInt& b) { return a / b; }
  static c10::SymInt min(const c10::SymInt& a, const c10::SymInt& b) { return a.min(b); }
  static c10::SymInt max(const c10::SymInt& a, const c10::SymInt& b) { return a.max(b); }
  // A backed size is guarded on (expect_true). A rule over an unbacked (data-dependent) size is
  // assumed to hold while tracing and left to the op's own check when the graph runs, which
  // names the op and the argument (a deferred assertion of torch's would read only "Runtime
  // assertion failed for expression Eq(u0, s1)"; Note [Data-dependent sizes] in opforge/expr.h).
  static bool unbacked(const c10::SymInt& a, const c10::SymInt& b) { return !a.has_hint() || !b.has_hint(); }
  static bool eq(const c10::SymInt& a, const c10::SymInt& b) {
    return unbacked(a, b) || a.sym_eq(b).expect_true(__FILE__, __LINE__);
  }
  static bool divisible(const c10::SymInt& a, int64_t k) {
    return !a.has_hint() || (a % c10::SymInt(k)).sym_eq(c10::SymInt(0)).expect_true(__FILE__, __LINE__);
  }
  static bool compare(int32_t op, const c10::SymInt& a, const c10::SymInt& b) {
    if (unbacked(a, b)) return true;
    switch (op) {
      case OPFORGE_EXPR_EQ:
        return a.sym_eq(b).expect_true(__FILE__, __LINE__);
      case OPFORGE_EXPR_NE:
        return a.sym_ne(b).expect_true(__FILE__, __LINE__);
      case OPFORGE_EXPR_LT:
        return a.sym_lt(b).expect_true(__FILE__, __LINE__);
      case OPFORGE_EXPR_LE:
        return a.sym_le(b).expect_true(__FILE__, __LINE__);
      case OPFORGE_EXPR_GT:
        return a.sym_gt(b).expect_true(__FILE__, __LINE__);
      default:
        return a.sym_ge(b).expect_true(__FILE__, __LINE__);
    }
  }
  static int64_t concrete(const c10::SymInt& a) { return a.guard_int(__FILE__, __LINE__); }
  // Printed through the symbolic node, not iostreams (Note [No iostreams across the torch boundary]).
  static std::string str(const c10::SymInt& a) {
    if (auto v = a.maybe_as_int()) return std::to_string(*v);
    return a.toSymNodeImplUnowned()->str();
  }
};
}  // namespace opforge::core

namespace opforge::torch {

/// The OpforgeDtype of a torch dtype, or -1 for one opforge does not know.
int32_t to_opforge(at::ScalarType t);
/// The torch dtype of an OpforgeDtype.
at::ScalarType to_torch(int32_t dtype);
/// torch's Python name of a dtype ("bfloat16", "complex64").
const char* torch_dtype_name(at::ScalarType t);
/// Lower-case device type name ("cuda"), a static string.
const char* device_type_name(c10::DeviceType type);
/// The C ABI view of a defined tensor (its storage offset applied).
OpforgeTensor view(const at::Tensor& t);

/// Runs `body`, raising opforge's errors as torch's: opforge::InvalidArgument as c10::ValueError
/// (Python's ValueError), any other opforge::Error as c10::Error (RuntimeError). The message is
/// passed on unchanged.
template <class Body>
decltype(auto) with_torch_errors(Body&& body) {
  try {
    return body();
  } catch (const InvalidArgument& e) {
    C10_THROW_ERROR(ValueError, e.what());
  } catch (const Error& e) {
    C10_THROW_ERROR(Error, e.what());
  }
}

}  // namespace opforge::torch
