// The call protocol (see call.h).
#include "call.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "check.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "schema.h"

namespace opforge::core {
namespace {

std::atomic<bool> g_poison{false};

int64_t numel(const OpforgeTensor& t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.ndim; ++d) n *= t.sizes[d];
  return n;
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Dense and row-major, as torch's is_contiguous: size-1 dims may have any stride, and a tensor
/// without elements is dense.
bool dense(const OpforgeTensor& t) {
  if (numel(t) == 0) return true;
  int64_t expected = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.sizes[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.sizes[d];
  }
  return true;
}

/// A last dim of adjacent elements and other strides that are multiples of 16 bytes (strides
/// of size-1 dims never move a pointer and are not looked at); the data pointer aside.
bool rows_aligned_strides(const OpforgeTensor& t, int64_t item) {
  if (t.ndim == 0) return false;
  if (t.sizes[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1) return false;
  for (int32_t d = 0; d + 1 < t.ndim; ++d)
    if (t.sizes[d] > 1 && (t.strides[d] * item) % 16 != 0) return false;
  return true;
}

bool rows_aligned(const OpforgeTensor& t, int64_t item) { return aligned(t.data) && rows_aligned_strides(t, item); }

/// True if two of the view's elements share memory: a dim of size > 1 with stride 0 (torch's
/// has_internal_overlap, whose other cases need a dense layout, which the rules check anyway).
bool overlaps(const OpforgeTensor& t) {
  for (int32_t d = 0; d < t.ndim; ++d)
    if (t.sizes[d] > 1 && t.strides[d] == 0) return true;
  return false;
}

Admission admit_by_layout(const OpforgeTensorSpec& spec, const OpforgeTensor& view, int64_t item_size) {
  switch (spec.layout) {
    case OPFORGE_LAYOUT_STRIDED:
      return Admission::kAsIs;
    case OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM:
      return rows_aligned(view, item_size) ? Admission::kAsIs : Admission::kDenseCopy;
    default:
      return dense(view) && aligned(view.data) ? Admission::kAsIs : Admission::kDenseCopy;
  }
}

std::string list_text(const int64_t* v, int32_t n) {
  std::string s = "[";
  for (int32_t d = 0; d < n; ++d) s += (d ? ", " : "") + std::to_string(v[d]);
  return s + "]";
}

}  // namespace

Admission admit(const OpforgeTensorSpec& spec, const OpforgeTensor& view, int64_t item_size) {
  const Admission by_layout = admit_by_layout(spec, view, item_size);
  if (!spec.mutated) return by_layout;
  return overlaps(view) || by_layout == Admission::kDenseCopy ? Admission::kRefuse : Admission::kAsIs;
}

std::vector<std::string> overlap_refusals(const OpforgeOpSpec& op, Span<const OpforgeTensor> views) {
  auto span = [&](int32_t i) -> std::optional<std::pair<uintptr_t, uintptr_t>> {
    const OpforgeTensor& t = views[static_cast<size_t>(i)];
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || t.data == nullptr || numel(t) == 0 || !dense(t)) return std::nullopt;
    const auto begin = reinterpret_cast<uintptr_t>(t.data);
    return std::make_pair(begin, begin + static_cast<uintptr_t>(numel(t) * int64_t(dtype_size(t.dtype))));
  };
  std::vector<std::string> lines;
  for (int32_t i = 0; i < op.num_args; ++i) {
    if (!is_mutated(op.args[i])) continue;
    const auto mine = span(i);
    if (!mine) continue;
    for (int32_t j = 0; j < op.num_args; ++j) {
      if (j < i && is_mutated(op.args[j])) continue;  // that pair has its line already
      const auto theirs = j == i ? std::nullopt : span(j);
      if (!theirs || mine->second <= theirs->first || theirs->second <= mine->first) continue;
      lines.push_back(std::string(op.args[i].name) + ": expected memory of its own (it is written in place), got " +
                      "memory shared with " + op.args[j].name + "; pass " + op.args[i].name + ".clone()");
      break;
    }
  }
  return lines;
}

std::string refusal(const OpforgeArgSpec& a, const OpforgeTensor& view, int64_t item_size) {
  const std::string got =
      "got shape " + list_text(view.sizes, view.ndim) + " with strides " + list_text(view.strides, view.ndim);
  if (overlaps(view))
    return std::string(a.name) + ": expected a tensor whose elements do not overlap in memory (it is written in " +
           "place), " + got;
  const bool rows = a.tensor.layout == OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM;
  const bool strides_ok = rows ? rows_aligned_strides(view, item_size) : dense(view);
  const std::string offset = strides_ok
                                 ? " at a data pointer " + std::to_string(reinterpret_cast<uintptr_t>(view.data) % 16) +
                                       " bytes past a 16-byte boundary"
                                 : "";
  const std::string need = rows ? "rows of adjacent elements whose data pointer and other strides are multiples of "
                                  "16 bytes"
                                : "a dense, row-major tensor whose data pointer is a multiple of 16 bytes";
  return std::string(a.name) + ": expected " + need + " (it is written in place, so it cannot be copied), " + got +
         offset;
}

namespace {

/// Element `flat` (row-major order) of an integer view, as int64.
int64_t element(const OpforgeTensor& t, int64_t flat) {
  int64_t offset = 0;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    offset += (flat % t.sizes[d]) * t.strides[d];
    flat /= t.sizes[d];
  }
  const char* p = static_cast<const char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype));
  switch (t.dtype) {
    case OPFORGE_DTYPE_INT8:
      return *reinterpret_cast<const int8_t*>(p);
    case OPFORGE_DTYPE_INT16:
      return *reinterpret_cast<const int16_t*>(p);
    case OPFORGE_DTYPE_INT32:
      return *reinterpret_cast<const int32_t*>(p);
    case OPFORGE_DTYPE_INT64:
      return *reinterpret_cast<const int64_t*>(p);
    default:
      return *reinterpret_cast<const uint8_t*>(p);
  }
}

std::string index_text(const OpforgeTensor& t, int64_t flat) {
  std::vector<int64_t> index(t.ndim);
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    index[d] = flat % t.sizes[d];
    flat /= t.sizes[d];
  }
  return list_text(index.data(), t.ndim);
}

}  // namespace

std::vector<std::string> value_problems(const OpforgeOpSpec& op, Span<const OpforgeArg> args) {
  std::vector<std::string> problems;
  // Every CPU call asks: an op whose inputs declare no value domain costs no more than this scan.
  bool any_domain = false;
  for (int32_t i = 0; i < op.num_args; ++i)
    any_domain |= op.args[i].kind == OPFORGE_ARG_TENSOR && op.args[i].tensor.has_values;
  if (!any_domain) return problems;
  std::vector<ArgInfo<int64_t>> info(op.num_args);
  for (int32_t i = 0; i < op.num_args; ++i) {
    info[i].value = args[i].value;
    const OpforgeTensor& t = args[i].tensor;
    if (op.args[i].kind == OPFORGE_ARG_TENSOR && t.ndim >= 0) info[i].sizes = Span<const int64_t>(t.sizes, t.ndim);
    info[i].defined = op.args[i].kind != OPFORGE_ARG_TENSOR || t.ndim >= 0;
  }
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeTensorSpec& s = op.args[i].tensor;
    const OpforgeTensor& t = args[i].tensor;
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || !s.has_values || t.ndim < 0) continue;
    const std::optional<int64_t> low = eval_expr<int64_t>(s.values_low, info),
                                 high = eval_expr<int64_t>(s.values_high, info);
    if (!low || !high) continue;
    const std::string name = op.args[i].name;
    const std::string marker = s.has_sentinel ? " or " + std::to_string(s.sentinel) : "";
    int64_t n = 1;
    for (int32_t d = 0; d < t.ndim; ++d) n *= t.sizes[d];
    std::map<int64_t, int64_t> seen;  // value -> first index, for unique_values
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = element(t, k);
      if (s.has_sentinel && v == s.sentinel) continue;
      if (v < *low || v >= *high) {
        const std::string rule = "[" + expr_string(op, s.values_low) + ", " + expr_string(op, s.values_high) + ")";
        const std::string range = "[" + std::to_string(*low) + ", " + std::to_string(*high) + ")";
        problems.push_back(name + ": expected values in " + rule + (rule == range ? "" : " = " + range) + marker +
                           ", got " + std::to_string(v) + " at " + index_text(t, k));
        break;
      }
      if (!s.values_unique) continue;
      const auto [it, fresh] = seen.emplace(v, k);
      if (!fresh) {
        problems.push_back(name + ": expected distinct values" +
                           (s.has_sentinel ? " (but " + marker.substr(4) + ")" : "") + ", got " + std::to_string(v) +
                           " at " + index_text(t, it->second) + " and " + index_text(t, k));
        break;
      }
    }
  }
  return problems;
}

OpforgeTensor absent_tensor(int32_t device_type, int32_t device_index) {
  return {nullptr, -1, device_type, device_index, /*ndim=*/-1, nullptr, nullptr};
}

bool skip_launch(Span<const OpforgeTensor> outputs) {
  if (outputs.empty()) return false;
  for (const OpforgeTensor& o : outputs)
    if (o.ndim >= 0 && numel(o) != 0) return false;  // an absent output holds nothing
  return true;
}

bool poison_outputs() { return g_poison.load(std::memory_order_relaxed); }
void set_poison_outputs(bool enabled) { g_poison.store(enabled, std::memory_order_relaxed); }

double poison_value(int32_t dtype) {
  switch (dtype) {
    case OPFORGE_DTYPE_FLOAT32:
    case OPFORGE_DTYPE_FLOAT64:
    case OPFORGE_DTYPE_FLOAT16:
    case OPFORGE_DTYPE_BFLOAT16:
      return NAN;
    case OPFORGE_DTYPE_BOOL:
      return 1;
    default:
      return 123;
  }
}

namespace {
template <class T>
void fill(void* data, int64_t n, T value) {
  std::fill_n(static_cast<T*>(data), n, value);
}
}  // namespace

void poison_host(Span<const OpforgeTensor> outputs) {
  for (const OpforgeTensor& o : outputs) {
    if (o.ndim < 0 || o.data == nullptr) continue;
    const int64_t n = numel(o);
    switch (o.dtype) {
      case OPFORGE_DTYPE_FLOAT32:
        fill<float>(o.data, n, NAN);
        break;
      case OPFORGE_DTYPE_FLOAT64:
        fill<double>(o.data, n, NAN);
        break;
      case OPFORGE_DTYPE_FLOAT16:
        fill<uint16_t>(o.data, n, 0x7e00);
        break;  // a quiet NaN's bits
      case OPFORGE_DTYPE_BFLOAT16:
        fill<uint16_t>(o.data, n, 0x7fc0);
        break;
      case OPFORGE_DTYPE_INT8:
        fill<int8_t>(o.data, n, 123);
        break;
      case OPFORGE_DTYPE_INT16:
        fill<int16_t>(o.data, n, 123);
        break;
      case OPFORGE_DTYPE_INT32:
        fill<int32_t>(o.data, n, 123);
        break;
      case OPFORGE_DTYPE_INT64:
        fill<int64_t>(o.data, n, 123);
        break;
      case OPFORGE_DTYPE_UINT8:
        fill<uint8_t>(o.data, n, 123);
        break;
      case OPFORGE_DTYPE_BOOL:
        fill<uint8_t>(o.data, n, 1);
        break;
      default:
        break;
    }
  }
}

const OpforgeValue& default_value(const OpforgeOpSpec& op, int32_t arg) {
  const OpforgeArgSpec& a = op.args[arg];
  if (a.kind == OPFORGE_ARG_TENSOR || !a.param.has_default)
    throw InvalidArgument(invalid_arguments_message(
        op, {std::string(a.name) + ": expected a value of type " + schema_type(a.kind) + ", got None"}));
  return a.param.default_value;
}

void call_kernel(const OpforgeOpSpec& op, const OpforgeKernel& kernel, const OpforgeContext& ctx,
                 Span<const OpforgeArg> args, Span<const OpforgeTensor> outputs) {
  char error[4096];  // the kernel writes a NUL-terminated message; not cleared: 4 KiB a call
  error[0] = '\0';
  OpforgeCallFrame frame{};
  frame.struct_size = sizeof(OpforgeCallFrame);
  frame.ctx = &ctx;
  frame.num_args = static_cast<int32_t>(args.size());
  frame.args = args.data();
  frame.num_outputs = static_cast<int32_t>(outputs.size());
  frame.outputs = outputs.data();
  frame.error = error;
  frame.error_capacity = sizeof(error);
  const int32_t status = kernel.fn(&frame, kernel.user);
  if (status == OPFORGE_STATUS_OK) return;
  if (status == OPFORGE_STATUS_INVALID_ARGUMENT) throw InvalidArgument(qualified_name(op) + ": " + error);
  std::string device = device_type_name(kernel.device_type);
  if (ctx.device_index >= 0) device += ":" + std::to_string(ctx.device_index);
  throw InternalError(qualified_name(op) + " (" + device + " kernel): " + error);
}

}  // namespace opforge::core
