// Helpers for C entry points (opforge/core.h and the adapters' own): exceptions become an
// OpforgeStatus and the error JSON, so nothing crosses the C boundary.
#pragma once

#include <exception>
#include <string>

#include "opforge/c_api.h"
#include "opforge/error.h"

namespace opforge::core {

/// A malloc'ed copy of `s` (freed with opforge_core_free).
char* copy_string(const std::string& s);

/// {"status": "invalid_argument" | "internal", "message": message}.
std::string error_json(OpforgeStatus status, const std::string& message);

/// Runs `body` (returning the response text) and sets *out: the response and OPFORGE_STATUS_OK,
/// or the error JSON with OPFORGE_STATUS_INVALID_ARGUMENT for opforge::InvalidArgument and
/// OPFORGE_STATUS_INTERNAL for any other exception.
template <class Body>
OpforgeStatus c_entry(char** out, Body&& body) {
  try {
    *out = copy_string(body());
    return OPFORGE_STATUS_OK;
  } catch (const InvalidArgument& e) {
    *out = copy_string(error_json(OPFORGE_STATUS_INVALID_ARGUMENT, e.what()));
    return OPFORGE_STATUS_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    *out = copy_string(error_json(OPFORGE_STATUS_INTERNAL, e.what()));
    return OPFORGE_STATUS_INTERNAL;
  } catch (...) {
    *out = copy_string(error_json(OPFORGE_STATUS_INTERNAL, "unknown C++ exception"));
    return OPFORGE_STATUS_INTERNAL;
  }
}

}  // namespace opforge::core
