// opforge/detail/kernel_name.h -- the grammar of a run-time kernel's name template (C++17):
// parsed here only, for the op-library runtime, which instantiates the name, and the core, which
// checks it at load.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace opforge::detail {

/// One piece of a run-time kernel's name template ("softshrink<{T}, {k}>"; Note [Run-time
/// kernels] in opforge/op.h): text copied as it is, or a placeholder between braces: `{T}`, the
/// type of the first tensor input; `{T_<tensor>}`, that input's or output's type; `{<param>}`,
/// a compile-time parameter's value.
struct KernelNamePiece {
  enum Kind { kText, kFirstType, kTypeOf, kParam };
  Kind kind = kText;
  std::string text;  ///< kText: the text; kTypeOf: the tensor's name; kParam: the parameter's name
  std::string key;   ///< a placeholder's text between its braces ("T_y"), for messages
};

/// The pieces of the name template `name`, in order, and whether every '{' has its '}'; where
/// one does not, the pieces stop before it.
inline bool parse_kernel_name(std::string_view name, std::vector<KernelNamePiece>& pieces) {
  size_t at = 0;
  while (at < name.size()) {
    const size_t open = name.find('{', at);
    if (open != at) {
      const size_t end = open == std::string_view::npos ? name.size() : open;
      pieces.push_back({KernelNamePiece::kText, std::string(name.substr(at, end - at)), {}});
      at = end;
      continue;
    }
    const size_t close = name.find('}', open);
    if (close == std::string_view::npos) return false;
    KernelNamePiece p;
    p.key = std::string(name.substr(open + 1, close - open - 1));
    if (p.key == "T") {
      p.kind = KernelNamePiece::kFirstType;
    } else if (p.key.rfind("T_", 0) == 0) {
      p.kind = KernelNamePiece::kTypeOf;
      p.text = p.key.substr(2);
    } else {
      p.kind = KernelNamePiece::kParam;
      p.text = p.key;
    }
    pieces.push_back(std::move(p));
    at = close + 1;
  }
  return true;
}

}  // namespace opforge::detail
