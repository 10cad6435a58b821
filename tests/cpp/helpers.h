// What the C++ tests of several sources share: kernel stubs of the common signatures, finalized
// declarations, a library's JSON description, an exception's message, and the ops whose rules the
// tests of checks, dtypes, sizes and sharding read alike.
#pragma once

#include <gtest/gtest.h>
#include <opforge/op.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../src/core/declaration_checks.h"
#include "../../src/core/description.h"

namespace opforge_test {

using nlohmann::json;
using opforge::MutableTensor;
using opforge::Tensor;

// Kernel stubs, named by signature: a declaration reads only their types.
inline void unary(Tensor, MutableTensor) {}
inline void one_param(Tensor, double, MutableTensor) {}
inline void two_inputs(Tensor, Tensor, MutableTensor) {}
inline void three_inputs(Tensor, Tensor, Tensor, MutableTensor) {}
inline void with_tag(Tensor, std::string_view, MutableTensor) {}
inline void with_ints(Tensor, std::span<const int64_t>, MutableTensor) {}
inline void with_size(Tensor, Tensor, int64_t, MutableTensor) {}

/// What loading a library that declares `def` reports about it: what its builder could not write
/// into the record (OpDef::finalize), then what the core's checks find in the record.
inline std::vector<std::string> declaration_problems(opforge::detail::OpDef& def) {
  std::vector<std::string> problems = def.finalize();
  for (std::string& p : opforge::core::op_declaration_problems(*def.spec())) problems.push_back(std::move(p));
  return problems;
}

/// `def` after OpDef::finalize and the core's declaration checks, which must report no problem.
inline std::unique_ptr<opforge::detail::OpDef> finalized(std::unique_ptr<opforge::detail::OpDef> def) {
  auto errors = declaration_problems(*def);
  EXPECT_TRUE(errors.empty()) << errors.front();
  return def;
}

/// The description of a library holding `defs`.
inline json describe(std::vector<const opforge::detail::OpDef*> defs) {
  std::vector<const OpforgeOpSpec*> ops;
  for (auto* d : defs) ops.push_back(d->spec());
  OpforgeLibrary lib{sizeof(OpforgeLibrary), OPFORGE_ABI_VERSION, static_cast<int32_t>(ops.size()), ops.data(),
                     nullptr};
  return json::parse(opforge::core::description_json(lib));
}

/// The message of the E that `f` throws, or "(nothing thrown)".
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

/// x: [*, H] (any number of leading dims, H a multiple of 4); weight: [H] in x's dtype or float32.
inline std::unique_ptr<opforge::detail::OpDef> norm_op() {
  auto def = opforge::detail::make_op("ns", "norm", "f.cpp", 5)
                 .input("x", opforge::floating, opforge::shape({opforge::leading_dims, opforge::multiple_of(4)}))
                 .input("weight", opforge::same_dtype("x") | opforge::kFloat32, opforge::shape({opforge::dim("x", -1)}))
                 .output("y", opforge::like("x"))
                 .reference(two_inputs)
                 .release();
  EXPECT_TRUE(def->finalize().empty());
  return def;
}

/// x and cache of rank 2 with two cross-argument rules: cache.size(1) <= x.size(-1) and
/// x.size(-1) % block == 0.
inline std::unique_ptr<opforge::detail::OpDef> rules_op() {
  return finalized(opforge::detail::make_op("ns", "rot", "f.cpp", 1)
                       .input("x", opforge::floating, opforge::rank(2))
                       .input("cache", opforge::same_dtype("x"), opforge::rank(2))
                       .param<int64_t>("block", 4)
                       .require(opforge::dim("cache", 1) <= opforge::dim("x", -1))
                       .require(opforge::dim("x", -1) % opforge::int_param("block") == 0)
                       .output("y", opforge::like("x"))
                       .reference(with_size)
                       .release());
}

/// x in {float16, bfloat16, float32, float64} with w following it; the CUDA kernel takes 16-bit x only.
inline std::unique_ptr<opforge::detail::OpDef> half_kernel_op() {
  return finalized(opforge::detail::make_op("ns", "hk", "f.cpp", 1)
                       .input("x", opforge::floating)
                       .input("w", opforge::same_dtype("x"))
                       .output("y", opforge::like("x"))
                       .reference(two_inputs)
                       .cuda_source("hk.cu", "hk<{T}>")
                       .launch(opforge::elementwise("y"))
                       .kernel_dtypes("x", opforge::half_precision)
                       .release());
}

}  // namespace opforge_test
