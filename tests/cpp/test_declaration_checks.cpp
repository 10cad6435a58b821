// The checks of declarations at load (src/core/declaration_checks.h), on deliberately broken
// declarations, and the kernel-name grammar they share with the op-library runtime.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <string>
#include <vector>

#include "../../src/core/declaration_checks.h"
#include "helpers.h"
#include "opforge/detail/kernel_name.h"

namespace {

using opforge_test::declaration_problems;

using opforge::MutableTensor;
using opforge::Tensor;

void one_in_one_out(Tensor, MutableTensor) {}
void one_in_mutated(MutableTensor, MutableTensor) {}

// An out= overload takes an op's outputs as keyword arguments beside its arguments; torch.fx calls
// a "self" argument "input" there, and torch's operator methods take their own "self".
TEST(DeclarationChecks, NamesTheOutOverloadCannotTake) {
  auto input_output = opforge::detail::make_op("unit", "self_in", "f.cpp", 3)
                          .input("self", opforge::kFloat32)
                          .output("input", opforge::like("self"))
                          .reference(one_in_one_out)
                          .release();
  EXPECT_EQ(
      declaration_problems(*input_output),
      (std::vector<std::string>{"f.cpp:3: unit::self_in: input 'self': \"self\" beside an output named \"input\", "
                                "an argument of the out= overload: torch's Python signatures call a \"self\" "
                                "argument \"input\", so the two collide under torch.compile; rename one"}));
  auto self_output = opforge::detail::make_op("unit", "self_out", "f.cpp", 4)
                         .input("x", opforge::kFloat32)
                         .output("self", opforge::like("x"))
                         .reference(one_in_one_out)
                         .release();
  EXPECT_EQ(declaration_problems(*self_output),
            (std::vector<std::string>{"f.cpp:4: unit::self_out: output 'self': \"self\" is a keyword argument of the "
                                      "out= overload, which torch.compile cannot pass (torch's operator methods take "
                                      "their own \"self\"); rename it"}));
  // An op that writes an input has no out= overload: its outputs are no argument anywhere.
  auto writes = opforge::detail::make_op("unit", "writes", "f.cpp", 5)
                    .input("self", opforge::kFloat32, opforge::mutated)
                    .output("input", opforge::like("self"))
                    .reference(one_in_mutated)
                    .release();
  EXPECT_EQ(declaration_problems(*writes), std::vector<std::string>{});
}

/// A library holding the records of `defs` (finalized), whose builder reported `error`.
struct FakeLibrary {
  std::vector<const OpforgeOpSpec*> ops;
  OpforgeLibrary lib{};
  FakeLibrary(const std::vector<opforge::detail::OpDef*>& defs, const char* error) {
    for (auto* d : defs) ops.push_back(d->spec());
    lib = OpforgeLibrary{sizeof(OpforgeLibrary), OPFORGE_ABI_VERSION, static_cast<int32_t>(ops.size()), ops.data(),
                         error};
  }
};

TEST(DeclarationChecks, ALibrarysProblemsAreListedByOp) {
  auto a = opforge::detail::make_op("unit", "a", "a.cpp", 1)
               .input("x", opforge::floating)
               .output("y", opforge::like("z"))
               .reference(one_in_one_out)
               .release();
  auto b = opforge::detail::make_op("unit", "b", "b.cpp", 2).input("x", opforge::floating).release();
  auto again = opforge::detail::make_op("unit", "a", "c.cpp", 3)
                   .input("x", opforge::floating)
                   .output("y", opforge::like("x"))
                   .reference(one_in_one_out)
                   .release();
  std::string built;  // what the op library's registry puts in OpforgeLibrary::error
  for (auto* d : {a.get(), b.get(), again.get()})
    for (const auto& e : d->finalize()) built += e + "\n";
  const FakeLibrary fake({a.get(), b.get(), again.get()}, built.c_str());
  EXPECT_EQ(opforge::core::library_declaration_problems(fake.lib),
            (std::vector<std::string>{
                "a.cpp:1: unit::a: output 'y': like(): \"z\" names no tensor input (tensor inputs: x)",
                "b.cpp:2: unit::b: no CPU reference: add .reference(fn), or an .equivalent() torch expression beside a "
                "device kernel",
                "c.cpp:3: unit::a: declared twice (first at a.cpp:1)",
            }));
}

TEST(DeclarationChecks, BackwardOpsArePairedOnlyOnceEveryDeclarationIsValid) {
  auto f = opforge::detail::make_op("unit", "f", "f.cpp", 1)
               .input("x", opforge::floating)
               .output("y", opforge::like("x"))
               .backward("nowhere")
               .reference(one_in_one_out)
               .release();
  auto broken = opforge::detail::make_op("unit", "g", "f.cpp", 2)
                    .input("x", opforge::DtypeSet(0))
                    .output("y", opforge::like("x"))
                    .reference(one_in_one_out)
                    .release();
  f->finalize();
  broken->finalize();
  EXPECT_EQ(opforge::core::library_declaration_problems(FakeLibrary({f.get(), broken.get()}, nullptr).lib),
            (std::vector<std::string>{"f.cpp:2: unit::g: input 'x': the dtype set is empty"}));
  EXPECT_EQ(opforge::core::library_declaration_problems(FakeLibrary({f.get()}, nullptr).lib),
            (std::vector<std::string>{"f.cpp:1: unit::f: backward op unit::nowhere: not declared in this library "
                                      "(declare both ops in one library)"}));
}

TEST(KernelName, PiecesOfATemplate) {
  using Piece = opforge::detail::KernelNamePiece;
  std::vector<Piece> pieces;
  ASSERT_TRUE(opforge::detail::parse_kernel_name("k<{T}, {T_y}, {n}>", pieces));
  ASSERT_EQ(pieces.size(), 7u);
  const std::vector<std::pair<Piece::Kind, std::string>> expected{
      {Piece::kText, "k<"}, {Piece::kFirstType, ""}, {Piece::kText, ", "}, {Piece::kTypeOf, "y"},
      {Piece::kText, ", "}, {Piece::kParam, "n"},    {Piece::kText, ">"}};
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].kind, expected[i].first) << i;
    EXPECT_EQ(pieces[i].text, expected[i].second) << i;
  }
  EXPECT_EQ(pieces[3].key, "T_y");
  pieces.clear();
  EXPECT_FALSE(opforge::detail::parse_kernel_name("k<{T}, {n>", pieces));
  ASSERT_EQ(pieces.size(), 3u) << "the pieces before the unclosed brace";
  EXPECT_EQ(pieces[2].text, ", ");
  pieces.clear();
  EXPECT_TRUE(opforge::detail::parse_kernel_name("plain", pieces));
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].text, "plain");
}

}  // namespace
