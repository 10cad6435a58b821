// Memory overlap of strided views (see overlap.h, Note [Memory overlap]).
#include "overlap.h"

#include <algorithm>
#include <array>

namespace opforge::core {
namespace {

constexpr int kMaxDims = 64;

struct Dim {
  int64_t size;
  int64_t stride;  // bytes
};

/// A view as runs of adjacent bytes: `run` bytes at base + sum(index[d] * dims[d].stride), dims
/// outermost first. `ordered`: the strides nest, so runs in index order are in address order and
/// do not intersect.
struct Runs {
  uintptr_t base = 0;
  std::array<Dim, kMaxDims> dims{};
  int nd = 0;
  int64_t run = 0;
  bool ordered = true;
  int64_t end_offset = 0;  // one past the last byte, from base

  Runs(const OpforgeTensor& t, int64_t item) : base(reinterpret_cast<uintptr_t>(t.data)), run(item) {
    for (int32_t d = 0; d < t.ndim && nd < kMaxDims; ++d)
      if (t.sizes[d] > 1) dims[nd++] = {t.sizes[d], t.strides[d] * item};
    std::stable_sort(dims.begin(), dims.begin() + nd, [](const Dim& x, const Dim& y) { return x.stride > y.stride; });
    int64_t span = item;  // bytes spanned by the dims inside the current one
    for (int d = nd - 1; d >= 0; --d) {
      if (dims[d].stride < span) ordered = false;
      span = (dims[d].size - 1) * dims[d].stride + span;
    }
    end_offset = span;
    if (!ordered) return;
    while (nd > 0 && dims[nd - 1].stride == run) run *= dims[--nd].size;  // the innermost dims are one run
    int out = 0;  // merge a dim into the one outside it where it steps exactly over it
    for (int d = 0; d < nd; ++d) {
      if (out > 0 && dims[out - 1].stride == dims[d].stride * dims[d].size) {
        dims[out - 1] = {dims[out - 1].size * dims[d].size, dims[d].stride};
      } else {
        dims[out++] = dims[d];
      }
    }
    nd = out;
  }
};

/// Walks the runs of a Runs in address order, from the first run that ends past `from`.
class RunCursor {
 public:
  RunCursor(const Runs& r, uintptr_t from) : r_(r) {
    int64_t rem = from > r.base ? static_cast<int64_t>(from - r.base) : 0;
    for (int d = 0; d < r.nd; ++d) {
      index_[d] = std::min(r.dims[d].size - 1, rem / r.dims[d].stride);
      rem -= index_[d] * r.dims[d].stride;
      offset_ += index_[d] * r.dims[d].stride;
    }
    while (valid_ && end() <= from) next();
  }
  bool valid() const { return valid_; }
  uintptr_t start() const { return r_.base + static_cast<uintptr_t>(offset_); }
  uintptr_t end() const { return start() + static_cast<uintptr_t>(r_.run); }
  void next() {
    for (int d = r_.nd - 1; d >= 0; --d) {
      if (++index_[d] < r_.dims[d].size) {
        offset_ += r_.dims[d].stride;
        return;
      }
      offset_ -= (index_[d] - 1) * r_.dims[d].stride;
      index_[d] = 0;
    }
    valid_ = false;  // past the last run
  }

 private:
  const Runs& r_;
  std::array<int64_t, kMaxDims> index_{};
  int64_t offset_ = 0;
  bool valid_ = true;
};

int64_t numel(const OpforgeTensor& t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.ndim; ++d) n *= t.sizes[d];
  return n;
}

}  // namespace

Overlap overlap(const OpforgeTensor& a, int64_t item_a, const OpforgeTensor& b, int64_t item_b) {
  if (a.ndim < 0 || b.ndim < 0 || a.data == nullptr || b.data == nullptr || numel(a) == 0 || numel(b) == 0)
    return Overlap::kNone;
  if (a.ndim > kMaxDims || b.ndim > kMaxDims) return Overlap::kUnknown;
  const Runs ra(a, item_a), rb(b, item_b);
  const uintptr_t lo = std::max(ra.base, rb.base);
  const uintptr_t hi =
      std::min(ra.base + static_cast<uintptr_t>(ra.end_offset), rb.base + static_cast<uintptr_t>(rb.end_offset));
  if (lo >= hi) return Overlap::kNone;
  if (!ra.ordered || !rb.ordered) return Overlap::kUnknown;
  RunCursor x(ra, lo), y(rb, lo);
  for (int64_t steps = 0; x.valid() && y.valid() && x.start() < hi && y.start() < hi; ++steps) {
    if (steps > 2 * kMaxRuns) return Overlap::kUnknown;
    if (x.end() <= y.start()) {
      x.next();
    } else if (y.end() <= x.start()) {
      y.next();
    } else {
      return Overlap::kShared;
    }
  }
  return Overlap::kNone;
}

bool internal_overlap(const OpforgeTensor& t) {
  std::array<Dim, kMaxDims> dims{};
  int nd = 0;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.sizes[d] <= 1) continue;
    if (t.strides[d] == 0 || nd == kMaxDims) return true;
    dims[nd++] = {t.sizes[d], t.strides[d]};
  }
  std::sort(dims.begin(), dims.begin() + nd, [](const Dim& x, const Dim& y) { return x.stride < y.stride; });
  int64_t span = 1;  // elements spanned by the dims inside the current one
  for (int d = 0; d < nd; ++d) {
    if (dims[d].stride < span) return true;
    span += (dims[d].size - 1) * dims[d].stride;
  }
  return false;
}

}  // namespace opforge::core
