// For tests: the problems loading reports for one op declaration.
#pragma once

#include <opforge/op.h>

#include <string>
#include <utility>
#include <vector>

#include "../../src/core/declaration_checks.h"

/// What loading a library that declares `def` reports about it: what its builder could not write
/// into the record (OpDef::finalize), then what the core's checks find in the record.
inline std::vector<std::string> declaration_problems(opforge::detail::OpDef& def) {
  std::vector<std::string> problems = def.finalize();
  for (std::string& p : opforge::core::op_declaration_problems(*def.spec())) problems.push_back(std::move(p));
  return problems;
}
