// The dtype combinations an op's declaration admits, for tools that test every one (opforge
// verify) without re-implementing the dtype rules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// Every assignment of dtypes to `op`'s tensor arguments that its dtype rules accept: one vector
/// per combination, with an OpforgeDtype per argument (-1 for parameters), in the order of the
/// declaration (the first argument's dtypes vary slowest, each in OpforgeDtype order). An input
/// with a dtype set takes each dtype of it; a same_dtype input takes its model's dtype where its
/// own set allows it and each of its alternatives (`same_dtype("x") | kFloat32`). An optional
/// input is counted as given. Stops after `limit` combinations (an op of many independent
/// inputs has a product of their sets).
std::vector<std::vector<int32_t>> dtype_combinations(const OpforgeOpSpec& op, size_t limit = 256);

/// The dtype_combinations that the kernel a call on `device_type` (OpforgeDeviceType) runs
/// takes (Note [Kernel dtypes] in opforge/op_builder.h): all of them on the CPU, fewer where the device
/// kernel declares kernel_dtypes(), none where the op has no kernel for the device.
std::vector<std::vector<int32_t>> dtype_combinations_on(const OpforgeOpSpec& op, int32_t device_type,
                                                        size_t limit = 256);

/// Whether `op` accepts `dtype` for every tensor input that takes a floating dtype in some
/// combination (the others keep any of theirs): what casting every floating input to `dtype`
/// (autocast) needs.
bool accepts_floating_as(const OpforgeOpSpec& op, int32_t dtype);

/// The declaration problem of `op`'s autocast policy, "" if none: kFloat32 needs
/// accepts_floating_as(float32), kLowerPrecision float16 or bfloat16 ("file:line: ns::op: ...").
std::string autocast_problem(const OpforgeOpSpec& op);

/// The declaration problems of `op`'s verify tolerances (OpBuilder::tolerance and
/// tolerance_vs_equivalent), one line each ("file:line: ns::op: ..."): a dtype that is not
/// floating or is declared twice, an atol, rtol or factor that is negative or not finite, a
/// factor without an .equivalent() expression.
std::vector<std::string> tolerance_problems(const OpforgeOpSpec& op);

}  // namespace opforge::core
