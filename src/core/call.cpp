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
#include "device_checks.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "overlap.h"
#include "schema.h"
#include "small_vector.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace opforge::core {
namespace {

std::atomic<int32_t> g_poison{[] {
  const char* v = std::getenv("OPFORGE_POISON_OUTPUTS");
  return v == nullptr ? 0 : std::atoi(v) == 2 ? 2 : std::atoi(v) != 0 ? 1 : 0;
}()};

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
  return internal_overlap(view) || by_layout == Admission::kDenseCopy ? Admission::kRefuse : Admission::kAsIs;
}

std::string refusal(const OpforgeArgSpec& a, const OpforgeTensor& view, int64_t item_size) {
  const std::string got =
      "got shape " + list_text(view.sizes, view.ndim) + " with strides " + list_text(view.strides, view.ndim);
  if (internal_overlap(view))
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
  for (const ValueDomain& d : value_domains(op, args)) {
    const OpforgeTensor& t = args[d.arg].tensor;
    const OpforgeTensorSpec& s = op.args[d.arg].tensor;
    const int64_t n = numel(t);
    std::map<int64_t, int64_t> seen;  // value -> first index, for unique_values
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = element(t, k);
      if (d.has_sentinel && v == d.sentinel) continue;
      if (v < d.low || v >= d.high) {
        problems.push_back(d.message + ", got " + std::to_string(v) + " at " + index_text(t, k));
        break;
      }
      if (!s.values_unique) continue;
      const auto [it, fresh] = seen.emplace(v, k);
      if (!fresh) {
        problems.push_back(std::string(op.args[d.arg].name) + ": expected distinct values" +
                           (d.has_sentinel ? " (but " + std::to_string(d.sentinel) + ")" : "") + ", got " +
                           std::to_string(v) + " at " + index_text(t, it->second) + " and " + index_text(t, k));
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

int32_t poison_mode() { return g_poison.load(std::memory_order_relaxed); }
void set_poison_mode(int32_t mode) { g_poison.store(mode == 1 || mode == 2 ? mode : 0, std::memory_order_relaxed); }

uint8_t poison_byte(int32_t dtype, int32_t mode) {
  const bool floating = dtype == OPFORGE_DTYPE_FLOAT32 || dtype == OPFORGE_DTYPE_FLOAT64 ||
                        dtype == OPFORGE_DTYPE_FLOAT16 || dtype == OPFORGE_DTYPE_BFLOAT16;
  if (dtype == OPFORGE_DTYPE_BOOL) return mode == 2 ? 0x00 : 0x01;
  if (mode == 2) return 0x5a;
  if (dtype == OPFORGE_DTYPE_FLOAT8_E4M3FN || dtype == OPFORGE_DTYPE_FLOAT8_E5M2) return 0x7f;
  return floating || dtype == OPFORGE_DTYPE_FLOAT8_E8M0FNU ? 0xff : 0x7b;
}

const OpforgeValue& default_value(const OpforgeOpSpec& op, int32_t arg) {
  const OpforgeArgSpec& a = op.args[arg];
  if (a.kind == OPFORGE_ARG_TENSOR || !a.param.has_default)
    throw InvalidArgument(invalid_arguments_message(
        op, {std::string(a.name) + ": expected a value of type " + schema_type(a.kind) + ", got None"}));
  return a.param.default_value;
}

/// Note [Subnormals in the CPU reference]
/// A CPU reference computes in IEEE arithmetic whatever floating-point mode its caller runs in.
/// XLA's CPU runtime runs every computation, custom calls included, with flush-to-zero and
/// denormals-are-zero set, and torch.set_flush_denormal(True) sets them on torch's thread; with
/// them a result below its dtype's smallest normal (gelu'(-13) in float32) is 0 through one
/// framework and not through the other. The reference is the correctness baseline, so the same
/// inputs give the same bits through every adapter: the call clears both modes while the
/// reference runs and restores the caller's afterwards (a device kernel keeps its own arithmetic).
class IeeeSubnormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  IeeeSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~kFlushModes); }
  ~IeeeSubnormals() { _mm_setcsr(saved_); }
  IeeeSubnormals(const IeeeSubnormals&) = delete;
  IeeeSubnormals& operator=(const IeeeSubnormals&) = delete;

 private:
  static constexpr unsigned kFlushModes = 0x8040;  // MXCSR: FTZ (bit 15) and DAZ (bit 6)
  unsigned saved_;
#elif defined(__aarch64__)
  IeeeSubnormals() : saved_(__builtin_aarch64_get_fpcr64()) { __builtin_aarch64_set_fpcr64(saved_ & ~kFlushMode); }
  ~IeeeSubnormals() { __builtin_aarch64_set_fpcr64(saved_); }
  IeeeSubnormals(const IeeeSubnormals&) = delete;
  IeeeSubnormals& operator=(const IeeeSubnormals&) = delete;

 private:
  static constexpr unsigned long long kFlushMode = 1ull << 24;  // FPCR.FZ
  unsigned long long saved_;
#endif
};

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
  std::optional<IeeeSubnormals> ieee;  // Note [Subnormals in the CPU reference]
  if (kernel.device_type == OPFORGE_DEVICE_CPU) ieee.emplace();
  const int32_t status = kernel.fn(&frame, kernel.user);
  if (status == OPFORGE_STATUS_OK) return;
  if (status == OPFORGE_STATUS_INVALID_ARGUMENT) throw InvalidArgument(qualified_name(op) + ": " + error);
  std::string device = device_type_name(kernel.device_type);
  if (ctx.device_index >= 0) device += ":" + std::to_string(ctx.device_index);
  throw InternalError(qualified_name(op) + " (" + device + " kernel): " + error);
}

namespace {

constexpr size_t kInline = 8;  // arguments and outputs of the usual op: no allocation per call

/// The refusals of step 3 (Note [The call protocol]): written arguments a kernel cannot write
/// safely. Empty for the usual call (nothing written but fresh outputs).
std::vector<std::string> refusals(const Call& c, Span<const OpforgeTensor> outputs) {
  const OpforgeOpSpec& op = c.op;
  std::vector<std::string> lines;
  if (!c.out_overload && !mutates_inputs(op)) return lines;
  // Every tensor argument the kernel reads or writes: inputs, then the caller's out= tensors.
  struct Arg {
    const OpforgeTensor* view;
    const char* name;
    bool written;
    bool out;
  };
  SmallVector<Arg, kInline> all;
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeTensor& t = c.args[i].tensor;
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || t.ndim < 0) continue;
    const bool mutated = is_mutated(op.args[i]);
    all.push_back({&t, op.args[i].name, mutated, false});
    const int64_t item = static_cast<int64_t>(dtype_size(t.dtype));
    if (mutated && admit(op.args[i].tensor, t, item) == Admission::kRefuse)
      lines.push_back(refusal(op.args[i], t, item));
  }
  for (int32_t k = 0; c.out_overload && k < op.num_outputs; ++k) {
    const OpforgeTensor& t = outputs[k];
    if (t.ndim < 0) continue;
    all.push_back({&t, op.outputs[k].name, true, true});
    if (internal_overlap(t))
      lines.push_back(std::string(op.outputs[k].name) +
                      ": expected a tensor whose elements do not overlap in memory (the op writes it), got shape " +
                      sizes_string<int64_t>(Span<const int64_t>(t.sizes, static_cast<size_t>(t.ndim))) +
                      " with strides " +
                      sizes_string<int64_t>(Span<const int64_t>(t.strides, static_cast<size_t>(t.ndim))));
  }
  if (!lines.empty()) return lines;
  for (size_t w = 0; w < all.size(); ++w) {
    if (!all[w].written) continue;
    for (size_t o = 0; o < all.size(); ++o) {
      if (o == w || (o < w && all[o].written)) continue;  // a pair of written arguments has its line already
      const OpforgeTensor &a = *all[w].view, &b = *all[o].view;
      const Overlap how = overlap(a, int64_t(dtype_size(a.dtype)), b, int64_t(dtype_size(b.dtype)));
      if (how == Overlap::kNone) continue;
      const std::string shared = how == Overlap::kShared
                                     ? "memory shared with " + std::string(all[o].name)
                                     : "memory that may be shared with " + std::string(all[o].name) +
                                           " (their strides interleave in a way opforge does not "
                                           "take apart)";
      lines.push_back(std::string(all[w].name) + ": expected memory of its own (" +
                      (all[w].out ? "the op writes it" : "it is written in place") + "), got " + shared + "; pass " +
                      (all[w].out ? std::string(all[o].name) : std::string(all[w].name)) + ".clone()");
      break;
    }
  }
  return lines;
}

}  // namespace

bool run_call(const Call& c, CallHooks& hooks, Span<OpforgeTensor> outputs) {
  const OpforgeOpSpec& op = c.op;
  // 1. check
  SmallVector<OutputInfo<int64_t, SmallVector<int64_t, kInline>>, kInline> plans;
  const std::string problems = c.out_overload ? check_out_call<int64_t>(op, c.info, c.given_outputs, plans)
                                              : check_call<int64_t>(op, c.info, plans);
  if (!problems.empty()) throw InvalidArgument(problems);
  if (c.kernel == nullptr && c.device_type == OPFORGE_DEVICE_CPU)
    throw InvalidArgument(qualified_name(op) +
                          " has no CPU kernel: it declares no .reference() (its device kernels are checked against "
                          "its .equivalent() expression); call it with tensors on a device it has a kernel for");
  if (c.kernel == nullptr)
    throw InvalidArgument(qualified_name(op) + " has no " + device_type_name(c.device_type) + " kernel");
  // 2. plan
  for (int32_t k = 0; k < op.num_outputs; ++k) {
    if (!plans[k].defined) {
      outputs[k] = absent_tensor(c.device_type, c.device_index);
      continue;
    }
    outputs[k] = hooks.output(k, plans[k].dtype, Span<const int64_t>(plans[k].sizes.data(), plans[k].sizes.size()));
  }
  // 3. refuse
  const std::vector<std::string> refused = refusals(c, outputs);
  if (!refused.empty()) throw InvalidArgument(invalid_arguments_message(op, refused, c.out_overload));
  // What the kernel writes: the outputs, or dense temporaries for out= tensors it cannot write as they are.
  SmallVector<OpforgeTensor, kInline> targets;
  SmallVector<uint8_t, kInline> temporary(static_cast<size_t>(op.num_outputs), 0);
  const OpforgeTensorSpec dense{};  // the layout every output has
  for (int32_t k = 0; k < op.num_outputs; ++k) {
    const OpforgeTensor& t = outputs[k];
    temporary[k] = c.out_overload && t.ndim >= 0 && admit(dense, t, int64_t(dtype_size(t.dtype))) != Admission::kAsIs;
    targets.push_back(temporary[k] ? hooks.temporary(k) : t);
  }
  // 4. skip
  if (skip_launch(targets)) return false;
  // 5. poison
  if (const int32_t mode = poison_mode(); mode != 0)
    for (const OpforgeTensor& t : targets)
      if (t.ndim >= 0 && t.data != nullptr && numel(t) > 0) hooks.fill(t, poison_byte(t.dtype, mode));
  // 6. admit
  for (int32_t i = 0; i < op.num_args; ++i) {
    OpforgeTensor& t = c.args[i].tensor;
    if (op.args[i].kind != OPFORGE_ARG_TENSOR || t.ndim < 0) continue;
    if (admit(op.args[i].tensor, t, int64_t(dtype_size(t.dtype))) == Admission::kDenseCopy) t = hooks.dense_copy(i);
  }
  // 7. domains
  OpforgeContext ctx = hooks.context();
  std::vector<OpforgeValueDomain> kernel_domains;  // read by the kernel through ctx
  if (c.device_type == OPFORGE_DEVICE_CPU) {
    const std::vector<std::string> bad = value_problems(op, c.args);
    if (!bad.empty()) throw InvalidArgument(invalid_arguments_message(op, bad, c.out_overload));
  } else if (c.kernel->checks_values != 0) {  // the kernel checks its indices itself: no launch
    kernel_domains = kernel_value_domains(op, c.args, device_value_checks());
    ctx.struct_size = std::max(ctx.struct_size, offsetof(OpforgeContext, num_value_domains) + sizeof(int32_t));
    ctx.value_domains = kernel_domains.data();
    ctx.num_value_domains = static_cast<int32_t>(kernel_domains.size());
  } else if (device_value_checks()) {
    const std::vector<ValueDomain> domains = value_domains(op, c.args);
    if (!domains.empty() && launch_value_checks(op, c.args, domains, ctx.stream)) {
      ctx.struct_size = std::max(ctx.struct_size, offsetof(OpforgeContext, after_value_check) + sizeof(int32_t));
      ctx.after_value_check = 1;
    }
  }
  // 8. launch
  call_kernel(op, *c.kernel, ctx, c.args, targets);
  // 9. finish
  for (int32_t k = 0; k < op.num_outputs; ++k)
    if (temporary[k]) hooks.copy_back(k);
  return true;
}

}  // namespace opforge::core
