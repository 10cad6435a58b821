// The parameters of the device value check (Note [Device value checks] in device_checks.h),
// shared by the host code that fills them and the kernel (kernels/value_checks.cu). Passed by
// value as the kernel's one parameter: no device memory is allocated for a check, so a call
// stays valid inside CUDA graph capture.
#pragma once

#include <stdint.h>

/// The most dims of an index input the check reads, and the most checked inputs per launch.
#define OPFORGE_VALUE_CHECK_MAX_DIMS 6
#define OPFORGE_VALUE_CHECK_MAX_INPUTS 4
#define OPFORGE_VALUE_CHECK_MESSAGE_BYTES 192

/// One integer input: each element in [low, high), or equal to `sentinel` where has_sentinel.
struct OpforgeValueCheck {
  const void* data;
  int64_t numel;
  int64_t low, high, sentinel;
  int64_t sizes[OPFORGE_VALUE_CHECK_MAX_DIMS];
  int64_t strides[OPFORGE_VALUE_CHECK_MAX_DIMS];  // elements
  int32_t ndim;
  int32_t item_size;  // bytes: 1, 2, 4 or 8
  int32_t is_signed;
  int32_t has_sentinel;
  /// "ns::op: name: expected values in [rule) = [low, high)": what the device prints before the
  /// element and its index (NUL-terminated, cut to fit).
  char message[OPFORGE_VALUE_CHECK_MESSAGE_BYTES];
};

struct OpforgeValueChecks {
  int32_t count;
  struct OpforgeValueCheck checks[OPFORGE_VALUE_CHECK_MAX_INPUTS];
};
