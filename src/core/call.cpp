// The call protocol (see call.h).
#include "call.h"

#include <atomic>
#include <cstring>
#include <string>

#include "check.h"
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

bool rows_aligned(const OpforgeTensor& t, int64_t item) {
  if (t.ndim == 0 || !aligned(t.data)) return false;
  if (t.sizes[t.ndim - 1] > 1 && t.strides[t.ndim - 1] != 1) return false;
  for (int32_t d = 0; d + 1 < t.ndim; ++d)
    if (t.sizes[d] > 1 && (t.strides[d] * item) % 16 != 0) return false;
  return true;
}

}  // namespace

Admission admit(const OpforgeTensorSpec& spec, const OpforgeTensor& view, int64_t item_size) {
  switch (spec.layout) {
    case OPFORGE_LAYOUT_STRIDED:
      return Admission::kAsIs;
    case OPFORGE_LAYOUT_CONTIGUOUS_LAST_DIM:
      return rows_aligned(view, item_size) ? Admission::kAsIs : Admission::kDenseCopy;
    default:
      return dense(view) && aligned(view.data) ? Admission::kAsIs : Admission::kDenseCopy;
  }
}

OpforgeTensor absent_tensor(int32_t device_type, int32_t device_index) {
  return {nullptr, -1, device_type, device_index, /*ndim=*/-1, nullptr, nullptr};
}

bool skip_launch(const std::vector<OpforgeTensor>& outputs) {
  if (outputs.empty()) return false;
  for (const OpforgeTensor& o : outputs)
    if (numel(o) != 0) return false;
  return true;
}

bool poison_outputs() { return g_poison.load(std::memory_order_relaxed); }
void set_poison_outputs(bool enabled) { g_poison.store(enabled, std::memory_order_relaxed); }

const OpforgeValue& default_value(const OpforgeOpSpec& op, int32_t arg) {
  const OpforgeArgSpec& a = op.args[arg];
  if (a.kind == OPFORGE_ARG_TENSOR || !a.param.has_default)
    throw InvalidArgument(invalid_arguments_message(
        op, {std::string(a.name) + ": expected a value of type " + schema_type(a.kind) + ", got None"}));
  return a.param.default_value;
}

void call_kernel(const OpforgeOpSpec& op, const OpforgeKernel& kernel, const OpforgeContext& ctx,
                 const std::vector<OpforgeArg>& args, const std::vector<OpforgeTensor>& outputs) {
  char error[4096] = {0};
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
  std::string device = kernel.device_type == OPFORGE_DEVICE_CUDA ? "cuda" : "cpu";
  if (ctx.device_index >= 0) device += ":" + std::to_string(ctx.device_index);
  throw InternalError(qualified_name(op) + " (" + device + " kernel): " + error);
}

}  // namespace opforge::core
