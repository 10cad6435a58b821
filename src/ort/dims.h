// Dims of ONNX tensor types, for evaluating the core's shape rules (src/core/check.h) over them.
//
// Note [Symbolic dims in ONNX]
// ----------------------------
// An ONNX tensor type gives each dim as a number (dim_value), a name (dim_param: "batch", or
// torch.onnx's "s0") or nothing (unknown). Shape inference (ONNX's, and ONNX Runtime's when it
// loads a graph) asks an op for its outputs' types from such dims, so the core's rules are
// evaluated over Dim, the symbolic integer of this adapter (as torch's Meta kernels evaluate
// them over SymInt): numbers combine into numbers, a name into an expression text ("s1//2" for
// opforge::dim("x", -1) / 2, "s0 + 1"), and anything combined with an unknown dim is unknown.
// A comparison that names differ on cannot be decided before the graph runs: it is taken to
// hold, and the call checks it again with the real sizes (Note [The call protocol]); one that
// numbers or equal names decide is decided, so ONNX's shape inference of a graph whose sizes
// contradict an op's rules fails with the call's own message.
#pragma once

#include <cstdint>
#include <string>

#include "../core/check.h"

namespace opforge::ort {

/// One dim of an ONNX tensor type: a number, a name (or an expression over names), or unknown.
struct Dim {
  enum Kind : uint8_t { kNumber, kName, kUnknown };
  Kind kind = kNumber;
  int64_t value = 0;
  std::string name;  ///< kName: the dim_param text

  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT: the shape rules build dims from int64 constants
  static Dim named(std::string text) {
    Dim d;
    d.kind = kName;
    d.name = std::move(text);
    return d;
  }
  static Dim unknown() {
    Dim d;
    d.kind = kUnknown;
    return d;
  }
  bool number() const { return kind == kNumber; }
  /// Equal as texts: two numbers with one value, or one name.
  bool same(const Dim& o) const {
    return kind == o.kind && (kind == kNumber ? value == o.value : kind == kName && name == o.name);
  }
  /// The text of the dim: its number, name, or "?".
  std::string text() const { return kind == kNumber ? std::to_string(value) : kind == kName ? name : "?"; }
};

namespace detail {
/// The text of `d` as an operand of a binary expression: parenthesised when it is one itself.
inline std::string operand(const Dim& d) {
  const std::string t = d.text();
  return t.find_first_of(" */") == std::string::npos ? t : "(" + t + ")";
}
/// `a op b` over dims: numbers by `f`, otherwise the text "a<sym>b", unknown if either is.
template <class F>
Dim combine(const Dim& a, const Dim& b, const char* sym, F&& f) {
  if (a.number() && b.number()) return Dim(f(a.value, b.value));
  if (a.kind == Dim::kUnknown || b.kind == Dim::kUnknown) return Dim::unknown();
  return Dim::named(operand(a) + sym + operand(b));
}
}  // namespace detail

inline Dim operator+(const Dim& a, const Dim& b) {
  if (b.number() && b.value == 0) return a;
  if (a.number() && a.value == 0) return b;
  return detail::combine(a, b, " + ", [](int64_t x, int64_t y) { return x + y; });
}
inline Dim operator-(const Dim& a, const Dim& b) {
  if (b.number() && b.value == 0) return a;
  if (a.same(b)) return Dim(0);
  return detail::combine(a, b, " - ", [](int64_t x, int64_t y) { return x - y; });
}
inline Dim operator*(const Dim& a, const Dim& b) {
  if ((a.number() && a.value == 0) || (b.number() && b.value == 0)) return Dim(0);
  if (b.number() && b.value == 1) return a;
  if (a.number() && a.value == 1) return b;
  return detail::combine(a, b, "*", [](int64_t x, int64_t y) { return x * y; });
}

}  // namespace opforge::ort

namespace opforge::core {

/// The core's integer operations over ort::Dim (Note [Symbolic dims in ONNX]).
template <>
struct IntOps<ort::Dim> {
  using Dim = ort::Dim;
  static Dim floordiv(const Dim& a, const Dim& b) {
    if (b.number() && b.value == 1) return a;
    if (b.number() && b.value == 0) return Dim::unknown();  // the rule cannot be evaluated: the call reports it
    return ort::detail::combine(a, b, "//", [](int64_t x, int64_t y) {
      const int64_t q = x / y;
      return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
    });
  }
  static Dim min(const Dim& a, const Dim& b) { return extremum(a, b, "min", true); }
  static Dim max(const Dim& a, const Dim& b) { return extremum(a, b, "max", false); }
  static bool eq(const Dim& a, const Dim& b) { return compare(OPFORGE_EXPR_EQ, a, b); }
  static bool divisible(const Dim& a, int64_t k) { return !a.number() || a.value % k == 0; }
  /// Decided for two numbers and for one name against itself; taken to hold otherwise.
  static bool compare(int32_t op, const Dim& a, const Dim& b) {
    if (a.number() && b.number()) return IntOps<int64_t>::compare(op, a.value, b.value);
    if (!a.same(b)) return true;
    return op == OPFORGE_EXPR_EQ || op == OPFORGE_EXPR_LE || op == OPFORGE_EXPR_GE;
  }
  static std::string str(const Dim& a) { return a.text(); }
  static int64_t concrete(const Dim& a) { return a.number() ? a.value : 0; }

 private:
  static Dim extremum(const Dim& a, const Dim& b, const char* name, bool smaller) {
    if (a.number() && b.number()) return Dim(smaller ? std::min(a.value, b.value) : std::max(a.value, b.value));
    if (a.same(b)) return a;
    if (a.kind == Dim::kUnknown || b.kind == Dim::kUnknown) return Dim::unknown();
    return Dim::named(std::string(name) + "(" + a.text() + ", " + b.text() + ")");
  }
};

}  // namespace opforge::core
