// The dtype combinations an op's declaration admits, for tools that test every one (opforge
// verify) without re-implementing the dtype rules, and the dtype facts the declaration checks
// and autocast read off them.
#pragma once

#include <cstdint>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// Every assignment of dtypes to `op`'s tensor arguments that its dtype rules accept: one vector
/// per combination, with an OpforgeDtype per argument (-1 for parameters), in the order of the
/// declaration (the first argument's dtypes vary slowest, each in OpforgeDtype order). An input
/// with a dtype set takes each dtype of it; a same_dtype input takes its model's dtype where its
/// own set allows it and each of its alternatives (`same_dtype("x") | kFloat32`). An optional
/// input is counted as given. A parameter whose value selects a dtype rule (Note [Rules that
/// follow a parameter] in opforge/op_constraints.h) takes each of its ruled_values (they vary
/// slowest), as -2 - k for the k-th (ruled_value_index), and the inputs it rules take the dtypes
/// of the rule that value selects; other parameters hold -1. Stops after `limit` combinations
/// (an op of many independent inputs has a product of their sets).
std::vector<std::vector<int32_t>> dtype_combinations(const OpforgeOpSpec& op, size_t limit = 256);

/// The index into ruled_values of a ruling parameter's entry `code` (-2 - k) of a dtype combination.
inline size_t ruled_value_index(int32_t code) { return static_cast<size_t>(-2 - code); }

/// The dtype_combinations that the kernel a call on `device_type` (OpforgeDeviceType) runs
/// takes (Note [Kernel dtypes] in opforge/op_builder.h): all of them on the CPU, fewer where the device
/// kernel declares kernel_dtypes(), none where the op has no kernel for the device.
std::vector<std::vector<int32_t>> dtype_combinations_on(const OpforgeOpSpec& op, int32_t device_type,
                                                        size_t limit = 256);

/// Whether `dtype` (an OpforgeDtype) is a floating one: float32, float64, float16, bfloat16 (not the
/// float8 dtypes, which autocast never casts to or from: Note [Float8 dtypes] in opforge/dtype.h).
bool is_floating(int32_t dtype);

/// Whether `dtype` (an OpforgeDtype) is a float8 one: float8_e4m3fn, float8_e5m2, float8_e8m0fnu.
bool is_float8(int32_t dtype);

/// The dtypes tensor argument `arg` of `op` takes in some call (bit 1u << OpforgeDtype each): its
/// own set, or for a same_dtype input each dtype its rule (same_dtype_allowed) accepts beside a
/// dtype its model takes (a rule that follows a parameter: each of its rules). A model that is not an earlier argument
/// (a declaration error) counts as taking nothing.
uint32_t admitted_dtypes(const OpforgeOpSpec& op, int32_t arg);
/// The same under one dtype rule `s` of the argument (a rule a parameter's value selects), for
/// an argument whose rules follow a parameter: admitted_dtypes is the union over its rules.
uint32_t admitted_dtypes(const OpforgeOpSpec& op, int32_t arg, const OpforgeTensorSpec& s);

/// Whether `op` accepts `dtype` for every tensor input that takes a floating dtype in some
/// combination (the others keep any of theirs): what casting every floating input to `dtype`
/// (autocast) needs. The second form judges over the given combinations (those of one device's
/// kernel, dtype_combinations_on).
bool accepts_floating_as(const OpforgeOpSpec& op, int32_t dtype);
bool accepts_floating_as(const OpforgeOpSpec& op, int32_t dtype, const std::vector<std::vector<int32_t>>& combinations);

/// The dtype a call's floating dtypes `combination` (one OpforgeDtype per argument, -1 for
/// parameters) promote to, as torch.promote_types: float64 over float32 over the 16-bit types,
/// float16 with bfloat16 giving float32; -1 if none is floating.
int32_t promoted_floating(const std::vector<int32_t>& combination);

}  // namespace opforge::core
