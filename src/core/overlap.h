// Whether strided views share memory, decided from the views themselves (data pointer, sizes,
// strides and element size), for the call protocol's refusals of written arguments.
//
// Note [Memory overlap]
// ---------------------
// A kernel that writes an argument while reading another one that shares an element with it
// computes a result that depends on its order of reads and writes (torch refuses such calls
// with "some elements of the input tensor and the written-to tensor refer to a single memory
// location"). torch decides overlap exactly only for views that are dense in some order and
// gives up ("too hard", no error) for others; opforge decides every case:
//   - views whose byte ranges are disjoint never overlap;
//   - otherwise each view is a union of runs of adjacent bytes (its dims sorted by stride and
//     merged where one dim steps exactly over the next, the innermost dim a run when its stride
//     is 1), which are walked in address order, both views at once: an intersecting pair of
//     runs is an overlap. Head-split views of one qkv buffer (q, k and v interleaved along the
//     last dim) are told apart in one pass over their rows.
//   - a view whose runs are not in address order (its own elements overlap or interleave, as
//     an as_strided view may) or that has more than kMaxRuns runs in the shared byte range is
//     treated as overlapping: the call is refused rather than risked, and the message says so.
// A view's own elements overlap (torch's has_internal_overlap) when a dim of size > 1 has stride
// 0, or when its strides do not nest (sorted by stride, each stride larger than the span of the
// dims inside it): two indices may then reach one element.
#pragma once

#include <cstdint>

#include "opforge/c_api.h"

namespace opforge::core {

/// How two views relate in memory.
enum class Overlap {
  kNone,     ///< no element of one is an element of the other
  kShared,   ///< some element is in both
  kUnknown,  ///< not decided within the bounds of Note [Memory overlap]: treated as shared
};

/// The most runs of adjacent bytes overlap() walks per view before it answers kUnknown.
inline constexpr int64_t kMaxRuns = int64_t(1) << 20;

/// Whether views `a` and `b` (element sizes `item_a`, `item_b` bytes; non-negative strides in
/// elements) share memory (Note [Memory overlap]). Views without elements or with a null data
/// pointer share nothing.
Overlap overlap(const OpforgeTensor& a, int64_t item_a, const OpforgeTensor& b, int64_t item_b);

/// True if two indices of view `t` may reach one element: a dim of size > 1 with stride 0, or
/// strides that do not nest (Note [Memory overlap]).
bool internal_overlap(const OpforgeTensor& t);

}  // namespace opforge::core
