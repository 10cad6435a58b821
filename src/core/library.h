// Op libraries loaded into this process: opening, validating and describing them, once, for
// every adapter.
//
// Note [One core for every adapter]
// ---------------------------------
// An adapter (torch, JAX, ONNX Runtime) translates between its framework and the C ABI and
// registers ops with its framework; it contains no dlopen, ABI, declaration, layout, call-frame
// or precompile code. Those live here, in libopforge_core, which every adapter links and tooling
// reaches through the C entry points of opforge/core.h:
//   - loading (this file): dlopen, the ABI version, the declaration checks
//     (declaration_checks.h: each declaration's meaning, backward pairing, classes), ops
//     declared by two libraries; a library that fails any check is not loaded at all;
//   - the call protocol (call.h): input checks and output shape rules (check.h), which inputs
//     reach the kernel as they are and which as a dense copy, skipping a launch whose outputs
//     are all empty, the call frame, and the kernel's status turned into an error that names
//     the op once;
//   - precompile (precompile.h) and the library's JSON description (description.h).
// A rule that a second adapter would otherwise copy belongs here.
//
// Note [Where a rule goes]
// ------------------------
// A rule of what an op declares (its names, kinds, ranges, defaults, dtype sets, kernels) is
// checked once, at load, on the library's C ABI records: in declaration_checks.cpp, or where it
// needs a plan that adapters use too (backward ops, classes), beside that plan, called from
// there. The op-library runtime (OpDef::finalize, src/oplib/op_library.cpp) reports only what
// keeps it from writing a record that says what was declared: a name that resolves to nothing a
// record may point at, an expression the postfix form cannot hold, declarations it merges or
// orders (a rank beside a fixed shape, .launch() after its .cuda_source()), a value the record
// cannot hold (an empty kernel_dtypes() set, a shard dim past 31), and launch rules, which
// records do not carry. Both write "file:line: ns::op: ..." lines; loading lists each op's
// together (library_declaration_problems), and a test pins each message with a broken
// declaration (tests/cpp/test_declaration_checks.cpp and its neighbours).
//
// A rule of one call (what its arguments must be, how its outputs are made, the order of its
// steps) goes into the call protocol (call.h; checks of arguments and shape rules in check.h),
// which every adapter runs, so it holds for all of them.
//
// A new field of a record is appended to a struct reached through a pointer, with "Since ABI n."
// in opforge/c_api.h and its offset pinned in tests/cpp/test_abi_layout.cpp; it is written by the
// op-library runtime and read only through an accessor in records.h that tests
// OPFORGE_HAS_FIELD. A field of a struct embedded by value or held in an array changes
// OPFORGE_ABI_VERSION (Note [ABI versioning] in opforge/c_api.h).
#pragma once

#include <string>
#include <vector>

#include "opforge/c_api.h"

namespace opforge::core {

/// An op library loaded into this process.
struct Library {
  std::string path;  ///< the shared object, resolved (realpath)
  const OpforgeLibrary* lib = nullptr;
  std::string json;  ///< description_json(*this), computed once at load
};

/// Loads the op library at `path` and validates it; loading the same file again returns the
/// same Library. A library is added only if every check passes: it exports
/// `opforge_library_v1`, was built for this OPFORGE_ABI_VERSION, its declarations are valid, its
/// backward ops pair up (Note [Backward ops]), its classes' constructor and method ops match
/// (Note [Custom classes]), and none of its ops or classes is declared by a library loaded earlier. Thread-safe.
///
/// Throws opforge::InvalidArgument for a file that is not a valid op library (every problem on
/// its own line, "file:line: ns::op: ..."), opforge::InternalError if it cannot be opened or
/// loaded (dlopen's message).
const Library& load_library(const std::string& path);

/// Every library loaded so far, in load order.
std::vector<const Library*> loaded_libraries();

/// The loaded op `qualified` ("ns::name") and the library declaring it; nullptr if none.
const OpforgeOpSpec* find_loaded_op(const std::string& qualified, const Library** owner = nullptr);

/// The loaded class `qualified` ("ns::Name") and the library declaring it; nullptr if none.
const OpforgeClassSpec* find_loaded_class(const std::string& qualified, const Library** owner = nullptr);

/// Forgets every compiled run-time kernel of every loaded library (OpforgeLibrary::reload), so
/// the next call of each op re-reads its kernel source.
void reload_kernels();

}  // namespace opforge::core
