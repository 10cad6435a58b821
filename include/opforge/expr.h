// opforge/expr.h -- shape expressions: how an op states the shapes of its inputs and outputs.
//
//   .input("bias", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1)}))
//   .output("y", opforge::shape({opforge::dim("x", 0), opforge::int_param("n")}), opforge::dtype_of("x"))
//   .output("pooled", opforge::like("x").with_dim(-1, opforge::ceildiv(opforge::dim("x", -1), 2)))
//
// Note [Shape expressions]
// ------------------------
// An expression is a small tree over integer dims: constants, a dim of an input (`dim`), an integer
// parameter (`int_param`), + - * / (floor division) %, ceildiv, min and max; two expressions
// compared (== != < <= > >=) make a cross-argument rule. An input's dim may instead be left free
// (`any`) or free up to a factor (`multiple_of(k)`).
//
// An expression is stored as data in the op library (postfix nodes, opforge/c_api.h), never as
// compiled code, so each adapter has the core evaluate the same rule its own way: with int64 at run
// time to check inputs and allocate outputs, with torch's SymInt in the Meta kernel (so
// torch.compile and torch.export keep dynamic dims symbolic and never specialise on a batch size),
// and through the core's C entry points for frameworks that trace shapes in Python (JAX). Names
// refer to any input or parameter of the op, declared before or after the rule (an out-first op
// rules its first argument by later ones); they are resolved when the library is loaded, and a bad
// name, or rules that read each other in a cycle, is reported with the declaration's file and
// line. A call checks each input after those its rules read.
//
// Note [Data-dependent sizes]
// ---------------------------
// An output whose length only the kernel knows (a compaction, as torch.nonzero and masked_select)
// declares its first dim `opforge::size_of("count", bound)`: `count` is a 0-dim int64 output of the
// same op that the kernel writes, `bound` the most it may be. Kernels get the output with `bound`
// rows; the call reads `count` (on a GPU a synchronisation, as nonzero's), checks that it is in
// [0, bound] (a kernel that reports more raises, naming both outputs) and returns the first `count`
// rows. Such an op has no out= overload and names no backward op.
//
// Under torch.compile and torch.export the size is an unbacked symbol (u0): the torch adapter
// registers a fake kernel that creates it and has the core evaluate the op's other rules with it. A
// rule of any opforge op over an unbacked size (a same_shape, a shape rule, a .require) is not
// turned into one of torch's deferred assertions, which would fail with only "Runtime assertion
// failed for expression Eq(u0, s1)": the op's own check runs when the graph runs (eager, compiled,
// exported, AOTInductor) and names the op and the argument.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opforge/c_api.h"

namespace opforge {

/// An integer shape expression (see Note [Shape expressions]). Converts from integers.
class Expr {
 public:
  struct Node {
    OpforgeExprOp op;
    std::string name;   // DIM: tensor argument; PARAM: integer parameter
    int64_t value = 0;  // CONST: the value; DIM: the dim (negative counts from the end)
    std::shared_ptr<const Node> lhs, rhs;
  };

  /// The "any size" placeholder, allowed only inside an input's `shape({...})`.
  Expr() = default;
  struct LeadingDimsTag {};
  /// The opforge::leading_dims marker.
  constexpr explicit Expr(LeadingDimsTag) : leading_dims_(true) {}
  /// The opforge::leading_dims_of(tensor) marker: leading dims equal to those of `tensor`.
  static Expr leading_dims_of(std::string tensor) {
    Expr e(LeadingDimsTag{});
    e.leading_of_ = std::move(tensor);
    return e;
  }
  Expr(int64_t v) : node_(make(OPFORGE_EXPR_CONST, "", v)) {}  // NOLINT: implicit by design
  Expr(int v) : Expr(static_cast<int64_t>(v)) {}               // NOLINT

  bool is_any() const { return node_ == nullptr && !leading_dims_; }
  bool is_leading_dims() const { return leading_dims_; }
  /// The tensor whose leading dims a leading_dims_of marker names ("" for opforge::leading_dims).
  const std::string& leading_of() const { return leading_of_; }
  const std::shared_ptr<const Node>& node() const { return node_; }

  static Expr leaf(OpforgeExprOp op, std::string name, int64_t value) {
    Expr e;
    e.node_ = make(op, std::move(name), value);
    return e;
  }
  /// The expression whose tree is `n` (nullptr: opforge::any).
  static Expr from_node(std::shared_ptr<const Node> n) {
    Expr e;
    e.node_ = std::move(n);
    return e;
  }
  static Expr binary(OpforgeExprOp op, const Expr& a, const Expr& b) {
    Expr e;
    auto n = std::make_shared<Node>();
    n->op = op;
    n->lhs = a.node_;
    n->rhs = b.node_;
    e.node_ = std::move(n);
    return e;
  }

 private:
  static std::shared_ptr<const Node> make(OpforgeExprOp op, std::string name, int64_t v) {
    auto n = std::make_shared<Node>();
    n->op = op;
    n->name = std::move(name);
    n->value = v;
    return n;
  }
  std::shared_ptr<const Node> node_;
  bool leading_dims_ = false;
  std::string leading_of_;
};

/// Dim `d` of tensor input `tensor` (negative `d` counts from the end).
inline Expr dim(std::string tensor, int64_t d) { return Expr::leaf(OPFORGE_EXPR_DIM, std::move(tensor), d); }
/// The value of integer parameter `name`.
inline Expr int_param(std::string name) { return Expr::leaf(OPFORGE_EXPR_PARAM, std::move(name), 0); }
/// Any size (an input shape constraint that leaves one dim free).
inline const Expr any{};
/// Any number of leading dims, of any sizes (torch's `(*, H)`): allowed only as the first entry
/// of an input's shape({...}), whose other entries then rule its last dims, e.g. a norm's
/// `.input("x", opforge::floating, opforge::shape({opforge::leading_dims, opforge::multiple_of(8)}))`.
/// A rank bound (opforge::min_rank, opforge::rank_between) may bound the whole rank; without
/// leading_dims a shape fixes the rank, and a rank constraint beside it is a declaration error.
inline const Expr leading_dims{Expr::LeadingDimsTag{}};
/// Leading dims equal to those of tensor input `tensor` (declared before or after), in number
/// and sizes, where the last dims differ: vLLM's `silu_and_mul(out, input)` has out `[..., d]`
/// and input `[..., 2d]`:
///   .input("out", opforge::shape({opforge::leading_dims_of("input"), opforge::dim("input", -1) / 2}), ...)
///   .input("input", opforge::shape({opforge::leading_dims, opforge::multiple_of(2)}))
/// The leading dims of `tensor` are those before the dims its own shape({opforge::leading_dims,
/// ...}) (or leading_dims_of) rules, which it must declare. Allowed only as the first entry of
/// an input's shape({...}), like opforge::leading_dims.
inline Expr leading_dims_of(std::string tensor) { return Expr::leading_dims_of(std::move(tensor)); }
/// Any size that is a multiple of `k` (> 0), for kernels that load `k` elements at a time:
/// `shape({opforge::any, opforge::multiple_of(8)})`. Allowed only as a whole dim of an input's
/// shape({...}), like opforge::any; opforge verify generates sizes that satisfy it.
inline Expr multiple_of(int64_t k) { return Expr::leaf(OPFORGE_EXPR_MULTIPLE_OF, "", k); }

/// A data-dependent size (as torch's nonzero or masked_select have): the value the kernel writes
/// into `output`, a 0-dim int64 output of the same op, at most `at_most`. Allowed only as the
/// first dim of an output's shape({...}), e.g. a compaction:
///   .output("count", opforge::shape({}), opforge::kInt64)
///   .output("kept", opforge::shape({opforge::size_of("count", opforge::dim("x", 0))}), opforge::dtype_of("x"))
/// Kernels get `kept` with at_most rows and write `count`; the call returns its first `count` rows.
/// Under torch.compile and torch.export the size is an unbacked symbol (u0); see
/// Note [Data-dependent sizes] above.
inline Expr size_of(std::string output, const Expr& at_most) {
  auto n = std::make_shared<Expr::Node>();
  n->op = OPFORGE_EXPR_SIZE_OF;
  n->name = std::move(output);
  n->lhs = at_most.node();
  return Expr::from_node(std::move(n));
}

inline Expr operator+(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_ADD, a, b); }
inline Expr operator-(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_SUB, a, b); }
inline Expr operator*(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_MUL, a, b); }
/// Floor division (sizes are non-negative).
inline Expr operator/(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_FLOORDIV, a, b); }
inline Expr ceildiv(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_CEILDIV, a, b); }
inline Expr min(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_MIN, a, b); }
inline Expr max(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_MAX, a, b); }
/// The remainder of floor division (sizes are non-negative), for rules such as
/// `opforge::dim("x", -1) % opforge::int_param("block") == 0`.
inline Expr operator%(const Expr& a, const Expr& b) { return Expr::binary(OPFORGE_EXPR_MOD, a, b); }

/// A comparison of two shape expressions: the rule of an op's `.require(...)`, checked with the
/// arguments' own constraints on every call (symbolically under torch.compile). Made by the
/// comparison operators: `opforge::dim("cos_sin_cache", 1) <= opforge::dim("query", -1)`.
struct Condition {
  OpforgeExprOp op;
  Expr lhs, rhs;
  /// Set by opforge::when_given / opforge::unless_given: the optional input whose presence
  /// decides whether the rule applies ("": every call), and which presence (true: given).
  std::string input = {};
  bool given = true;
};
inline Condition operator==(const Expr& a, const Expr& b) { return {OPFORGE_EXPR_EQ, a, b}; }
inline Condition operator!=(const Expr& a, const Expr& b) { return {OPFORGE_EXPR_NE, a, b}; }
inline Condition operator<(const Expr& a, const Expr& b) { return {OPFORGE_EXPR_LT, a, b}; }
inline Condition operator<=(const Expr& a, const Expr& b) { return {OPFORGE_EXPR_LE, a, b}; }
inline Condition operator>(const Expr& a, const Expr& b) { return {OPFORGE_EXPR_GT, a, b}; }
inline Condition operator>=(const Expr& a, const Expr& b) { return {OPFORGE_EXPR_GE, a, b}; }

/// Rules that apply only to some calls, by whether an opforge::optional input is given: made by
/// opforge::when_given and opforge::unless_given, extended by `.otherwise(rule)`.
struct PresenceRules {
  std::vector<Condition> rules;
  /// Adds `rule` for the calls the first rule's presence does not cover.
  PresenceRules otherwise(Condition rule) const {
    PresenceRules p = *this;
    rule.input = rules.front().input;
    rule.given = !rules.front().given;
    p.rules.push_back(std::move(rule));
    return p;
  }
};
/// `rule` holds for calls that give the opforge::optional input `input`, e.g. a state indexed
/// by `conv_state_indices` when it is given and by batch otherwise:
///   .require(opforge::when_given("conv_state_indices", opforge::dim("conv_state_indices", 0) == opforge::dim("x", 0))
///                .otherwise(opforge::dim("conv_state", 0) == opforge::dim("x", 0)))
/// The rule may read `input`'s dims (it is given whenever the rule is checked).
inline PresenceRules when_given(std::string input, Condition rule) {
  rule.input = std::move(input);
  rule.given = true;
  return PresenceRules{{std::move(rule)}};
}
/// `rule` holds for calls that leave the opforge::optional input `input` out:
/// `opforge::unless_given("conv_state_indices", opforge::dim("conv_state", 0) == opforge::dim("x", 0))`.
inline PresenceRules unless_given(std::string input, Condition rule) {
  rule.input = std::move(input);
  rule.given = false;
  return PresenceRules{{std::move(rule)}};
}

/// A full shape: one expression per dim. As an input constraint it fixes the rank and each
/// dim (`opforge::any` leaves a dim free); as an output rule it gives the output's shape.
struct Shape {
  std::vector<Expr> dims;
  Shape(std::initializer_list<Expr> d) : dims(d) {}
  explicit Shape(std::vector<Expr> d) : dims(std::move(d)) {}
};
inline Shape shape(std::initializer_list<Expr> dims) { return Shape(dims); }

/// Output rule: the shape and dtype of input `tensor`, optionally with some dims replaced or
/// another dtype: `opforge::like("x").with_dim(-1, opforge::int_param("n")).with_dtype(kFloat32)`.
struct Like {
  std::string tensor;
  std::vector<std::pair<int32_t, Expr>> overrides;
  int32_t dtype = -1;  // -1: the dtype of `tensor`
  Like with_dim(int32_t d, Expr e) const {
    Like l = *this;
    l.overrides.emplace_back(d, std::move(e));
    return l;
  }
  template <class D>
  Like with_dtype(D d) const {
    Like l = *this;
    l.dtype = static_cast<int32_t>(d);
    return l;
  }
};
inline Like like(std::string tensor) { return Like{std::move(tensor), {}, -1}; }

/// Output dtype rule: the dtype of input `tensor`.
struct DtypeOf {
  std::string tensor;
};
inline DtypeOf dtype_of(std::string tensor) { return DtypeOf{std::move(tensor)}; }

}  // namespace opforge
