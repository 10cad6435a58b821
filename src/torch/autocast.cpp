// The autocast kernel (see autocast.h).
#include "autocast.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

#include "../core/dtypes.h"
#include "../core/schema.h"
#include "types.h"

namespace opforge::torch {
namespace {

class AutocastKernel final : public c10::OperatorKernel {
 public:
  AutocastKernel(const OpforgeOpSpec& op, c10::DeviceType device) : op_(op), device_(device) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, ::torch::jit::Stack* stack) {
    const size_t n = handle.schema().arguments().size(), start = stack->size() - n;
    auto castable = [&](int32_t i) -> const at::Tensor* {
      if (i >= static_cast<int32_t>(n) || op_.args[i].kind != OPFORGE_ARG_TENSOR || core::is_mutated(op_.args[i]))
        return nullptr;
      const c10::IValue& v = (*stack)[start + i];
      if (!v.isTensor()) return nullptr;
      const at::Tensor& t = v.toTensor();
      // The core's floating dtypes only: float8 is floating to torch, but never cast (Note [Float8 dtypes]).
      return t.defined() && at::autocast::is_autocast_eligible(t, device_) &&
                     core::is_floating(to_opforge(t.scalar_type()))
                 ? &t
                 : nullptr;
    };
    std::optional<at::ScalarType> target;
    switch (core::autocast_policy(op_)) {
      case OPFORGE_AUTOCAST_FLOAT32:
        target = at::kFloat;
        break;
      case OPFORGE_AUTOCAST_LOWER_PRECISION:
        target = at::autocast::get_autocast_dtype(device_);
        break;
      case OPFORGE_AUTOCAST_PROMOTE:
        for (int32_t i = 0; i < op_.num_args; ++i)
          if (const at::Tensor* t = castable(i))
            target = target ? at::promote_types(*target, t->scalar_type()) : t->scalar_type();
        break;
      default:
        break;
    }
    if (target) {
      for (int32_t i = 0; i < op_.num_args; ++i)
        if (const at::Tensor* t = castable(i)) (*stack)[start + i] = at::autocast::cached_cast(*target, *t, device_);
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    handle.callBoxed(stack);
  }

 private:
  const OpforgeOpSpec& op_;
  c10::DeviceType device_;
};

}  // namespace

::torch::CppFunction make_autocast_kernel(const OpforgeOpSpec& op, c10::DeviceType device) {
  return ::torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutocastKernel>(op, device));
}

}  // namespace opforge::torch
