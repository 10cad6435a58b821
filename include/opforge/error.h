// opforge/error.h -- the two kinds of error a kernel or reference can raise.
//
//   OPFORGE_CHECK(n % 8 == 0, "n must be a multiple of 8, got ", n);   // the caller's fault
//   OPFORGE_ICHECK(ptr != nullptr, "scratch allocation failed");         // a bug or device failure
//
// Adapters map InvalidArgument to Python's ValueError (c10::ValueError) and InternalError to
// RuntimeError, and prefix the message with the op's name. Exceptions never cross the C ABI:
// the generated kernel entry catches them and returns an OpforgeStatus.
#pragma once

#include <stdexcept>
#include <string>

#include "opforge/detail/str.h"

namespace opforge {

/// Base of opforge's exceptions.
class Error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The caller passed something the op does not accept (OpforgeStatus INVALID_ARGUMENT).
class InvalidArgument : public Error {
  using Error::Error;
};

/// A bug in an op or in opforge, or a failing device call (OpforgeStatus INTERNAL).
class InternalError : public Error {
  using Error::Error;
};

}  // namespace opforge

/// Throws opforge::InvalidArgument if `cond` is false; the message is the arguments' text
/// concatenated (strings, characters and numbers; see opforge/detail/str.h).
#define OPFORGE_CHECK(cond, ...)                                                        \
  do {                                                                                  \
    if (!(cond)) throw ::opforge::InvalidArgument(::opforge::detail::cat(__VA_ARGS__)); \
  } while (0)

/// Throws opforge::InternalError (with file and line) if `cond` is false.
#define OPFORGE_ICHECK(cond, ...)                                                                          \
  do {                                                                                                     \
    if (!(cond))                                                                                           \
      throw ::opforge::InternalError(::opforge::detail::cat("internal error at ", __FILE__, ":", __LINE__, \
                                                            ": " #cond " failed: ", ##__VA_ARGS__));       \
  } while (0)
