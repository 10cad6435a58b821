// The checks of what an op library declares, run once at load on its C ABI records: every rule
// of a declaration's meaning (Note [Where a rule goes] in library.h). Each problem is one line,
// "file:line: ns::op: ..." (the declaration's site, then the rule it breaks and the fix).
#pragma once

#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// The problems of `op`'s declaration that its record shows, in the order of the declaration:
/// the op's names, CPU reference, tensor inputs and CUDA kernels; each argument (names that
/// torch.compile cannot take or that repeat, an optional or defaulted argument out of schema
/// order, same_dtype and same_shape naming a later input, rank ranges, dtype sets, value domains,
/// parameter ranges, defaults and choices); each output (names, data-dependent sizes, outputs an
/// op with a backward op cannot have); run-time kernels (parameter kinds, the source's path, the
/// name template's placeholders); kernel_dtypes() that admit nothing; shard_dims() past the
/// first input's rank; then, for a declaration with no other problem, its autocast policy; its
/// verify tolerances.
std::vector<std::string> op_declaration_problems(const OpforgeOpSpec& op);

/// The problems of class `c`'s declaration that its record shows ("file:line: ns::Class: ..."):
/// its name, fields beside a constructor, no method, field and method names.
std::vector<std::string> class_declaration_problems(const OpforgeClassSpec& c);

/// Every declaration problem of `lib`, one line each: per op, what its builder reported
/// (OpforgeLibrary::error, the records it could not write) and then op_declaration_problems,
/// then a second declaration of its name; per class, class_declaration_problems and a second
/// declaration; and only where all of those find nothing (the checks across ops read complete
/// records), backward ops that do not pair up (check_backward_ops) and classes whose ops do not
/// match (check_classes).
std::vector<std::string> library_declaration_problems(const OpforgeLibrary& lib);

/// The problem of `op`'s autocast policy, "" if none: kFloat32 needs accepts_floating_as(float32),
/// kLowerPrecision float16 or bfloat16, kPromote each combination's promoted dtype, for the
/// declaration's dtypes and for those of its CUDA kernel ("file:line: ns::op: ...").
std::string autocast_problem(const OpforgeOpSpec& op);

/// The problems of `op`'s verify tolerances (OpBuilder::tolerance and tolerance_vs_equivalent),
/// one line each ("file:line: ns::op: ..."): a dtype that is not floating or is declared twice,
/// an atol, rtol or factor that is negative or not finite, a factor without an .equivalent()
/// expression.
std::vector<std::string> tolerance_problems(const OpforgeOpSpec& op);

}  // namespace opforge::core
