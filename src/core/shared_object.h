// Opening shared objects (op libraries, C shim libraries) so that a damaged file is an error, not
// a crash: the dynamic loader maps a file by the sizes its ELF headers give, and a truncated file's
// missing pages kill the process with SIGBUS at their first touch.
#pragma once

#include <string>

namespace opforge::core {

/// "" if the ELF file at `path` holds every byte its headers describe (the program and section
/// header tables and each segment's file range, ELF specification "Program Header" and "Section
/// Header"), or if it is no 64-bit ELF file at all (dlopen then says so itself); else a message:
/// "<what> <path> is truncated: its ELF headers describe N bytes and the file has M". Throws
/// opforge::InternalError if the file cannot be read.
std::string truncation_problem(const std::string& path, const std::string& what);

/// dlopen(path, flags) after truncation_problem's check. `what` names the file in messages ("the op
/// library"). Throws opforge::InvalidArgument for a truncated file, opforge::InternalError with
/// dlerror()'s message where dlopen fails.
void* open_shared_object(const std::string& path, const std::string& what, int flags);

}  // namespace opforge::core
