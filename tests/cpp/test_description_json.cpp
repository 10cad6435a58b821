// The library description as JSON (src/core/description.cpp): every declaration as data, with
// typed defaults and shape rules as text.
#include <gtest/gtest.h>
#include <opforge/op.h>

#include <limits>
#include <string>
#include <vector>

#include "../../src/core/description.h"
#include "helpers.h"

namespace {

using namespace opforge_test;  // NOLINT: the shared fixtures

TEST(Description, DescribesArgumentsOutputsAndKernels) {
  auto def = finalized(opforge::detail::make_op("ns", "req", "f.cpp", 5)
                           .doc("say \"hi\"")
                           .input("x", opforge::kFloat16 | opforge::kBFloat16, opforge::contiguous_last_dim)
                           .param<double>("alpha", 0.5, opforge::at_least(0))
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  const json j = describe({def.get()});
  EXPECT_EQ(j["abi_version"], OPFORGE_ABI_VERSION);
  const json& op = j["ops"][0];
  EXPECT_EQ(op["name"], "ns::req");
  EXPECT_EQ(op["schema"], "ns::req(Tensor x, float alpha=0.5) -> Tensor");
  EXPECT_EQ(op["out_schema"], "ns::req.out(Tensor x, float alpha=0.5, *, Tensor(a!) y) -> Tensor(a!)");
  EXPECT_EQ(op["doc"], "say \"hi\"");
  EXPECT_EQ(op["file"], "f.cpp");
  EXPECT_EQ(op["line"], 5);
  EXPECT_EQ(op["sharding"], "none");
  EXPECT_EQ(op["backward"], nullptr);
  EXPECT_EQ(op["is_backward_op"], false);
  EXPECT_EQ(op["args"][0], json::parse(R"({"name": "x", "type": "Tensor", "kind": "tensor",
      "dtypes": ["float16", "bfloat16"], "same_dtype": null, "dtype_alternatives": [], "dtype_cases": [],
      "same_shape": null,
      "min_rank": -1, "max_rank": -1, "leading_dims": false, "leading_dims_of": null,
      "layout": "contiguous_last_dim", "optional": false, "default_none": false, "mutated": false,
      "values": null, "shape": null, "shape_cases": [], "multiple_of": [], "follows": []})"));
  EXPECT_EQ(op["args"][1], json::parse(R"({"name": "alpha", "type": "float", "kind": "param", "default": 0.5,
      "min": 0.0, "choices": null, "compile_time": false})"));
  EXPECT_EQ(op["outputs"][0], json::parse(R"({"name": "y", "dtype": null, "dtype_like": "x", "like": "x",
      "present_with": null, "size_from": null, "shape": [], "with_dims": [], "cases": []})"));
  EXPECT_EQ(op["devices"], json::parse(R"(["cpu"])"));
  EXPECT_EQ(op["dtype_combinations"], json::parse(R"([{"x": "float16"}, {"x": "bfloat16"}])"));
  EXPECT_EQ(op["runtime_kernels"], json::array());
}

TEST(Description, DefaultsAreTypedValues) {
  auto def = finalized(opforge::detail::make_op("ns", "tag", "f.cpp", 1)
                           .input("x", opforge::floating)
                           .param<std::string>("tag", "it's \\ \"q\"\n")
                           .output("y", opforge::like("x"))
                           .reference(with_tag)
                           .release());
  auto inf = finalized(opforge::detail::make_op("ns", "inf", "f.cpp", 2)
                           .input("x", opforge::floating)
                           .param<double>("alpha", -std::numeric_limits<double>::infinity())
                           .output("y", opforge::like("x"))
                           .reference(one_param)
                           .release());
  auto ints = finalized(opforge::detail::make_op("ns", "ints", "f.cpp", 3)
                            .input("x", opforge::floating)
                            .param<std::vector<int64_t>>("dims", std::vector<int64_t>{})
                            .output("y", opforge::like("x"))
                            .reference(with_ints)
                            .release());
  const json j = describe({def.get(), inf.get(), ints.get()});
  EXPECT_EQ(j["ops"][0]["args"][1]["default"], "it's \\ \"q\"\n");
  EXPECT_EQ(j["ops"][1]["args"][1]["default"], "-inf");
  EXPECT_EQ(j["ops"][2]["args"][1]["default"], json::array());
}

TEST(Description, ShapeRulesAsText) {
  auto def = finalized(opforge::detail::make_op("ns", "rules", "f.cpp", 1)
                           .input("x", opforge::floating, opforge::shape({opforge::any, opforge::multiple_of(4)}))
                           .input("w", opforge::same_dtype("x"), opforge::shape({opforge::dim("x", -1) * 2}))
                           .output("y", opforge::like("x").with_dim(-1, opforge::ceildiv(opforge::dim("x", -1), 4)))
                           .reference(two_inputs)
                           .release());
  const json op = describe({def.get()})["ops"][0];
  EXPECT_EQ(op["args"][0]["shape"], json::parse(R"(["*", "multiple of 4"])"));
  EXPECT_EQ(op["args"][0]["multiple_of"], json::parse("[[1, 4]]"));
  EXPECT_EQ(op["args"][1]["shape"], json::parse(R"(["x.size(-1) * 2"])"));
  EXPECT_EQ(op["outputs"][0]["with_dims"], json::parse(R"j([[-1, "ceildiv(x.size(-1), 4)"]])j"));
  EXPECT_EQ(op["unshardable_dims"], json::parse("[-1]"));
}

}  // namespace
