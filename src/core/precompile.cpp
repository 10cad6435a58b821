// Ahead-of-time compilation of run-time kernels (see precompile.h).
#include "precompile.h"

#include "check.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "records.h"
#include "schema.h"

namespace opforge::core {

bool precompile(const OpforgeOpSpec& op, const std::vector<int32_t>& given, const std::vector<OpforgeValue>& values,
                const std::string& arch, const std::string& cache_dir) {
  OPFORGE_ICHECK(given.size() == static_cast<size_t>(op.num_args) && values.size() == given.size());
  // A required input's dtype the description fixes need not be given: same_dtype's, or the only
  // one its set allows (same_dtype names an earlier input, so one pass in order settles it).
  std::vector<int32_t> dtypes(given);
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind != OPFORGE_ARG_TENSOR || dtypes[i] >= 0 || is_optional(a)) continue;
    if (a.tensor.dtype_like >= 0) dtypes[i] = dtypes[a.tensor.dtype_like];
    else if (__builtin_popcount(a.tensor.dtypes) == 1) dtypes[i] = __builtin_ctz(a.tensor.dtypes);
  }
  std::vector<std::string> why;
  std::vector<bool> bad(op.num_args,
                        false);  // as a call's check: a bad dtype is reported once, not again by same_dtype
  for (int32_t i = 0; i < op.num_args; ++i) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind != OPFORGE_ARG_TENSOR) {
      if (a.param.compile_time) check_param(a, values[i], why);
      continue;
    }
    const int32_t d = dtypes[i], like = a.tensor.dtype_like;
    const size_t before = why.size();
    if (d < 0) {
      if (!is_optional(a)) why.push_back(std::string(a.name) + ": expected a dtype, got none");
    } else if (like < 0 || !(bad[like] || dtypes[like] < 0)) {  // not judged against a dtype already reported
      const int32_t model = like < 0 ? d : dtypes[like];
      const std::string w = dtype_problem(op, a, d, dtype_name(d), model, dtype_name(model));
      if (!w.empty()) why.push_back(std::string(a.name) + ": " + w);
    }
    bad[i] = why.size() > before || d < 0;
  }
  if (!why.empty()) throw InvalidArgument(invalid_arguments_message(op, why));
  // A request for dtypes the CUDA kernel does not take (Note [Kernel dtypes]), whether it is a
  // run-time kernel or one compiled ahead of time, as a call on that device would be refused.
  const OpforgeKernel* cuda = device_kernel(op, OPFORGE_DEVICE_CUDA);
  if (cuda != nullptr && restricts_dtypes(*cuda) && !kernel_takes(*cuda, cuda->dtype_arg, dtypes[cuda->dtype_arg]))
    throw InvalidArgument(
        invalid_arguments_message(op, {kernel_dtype_problem(op, *cuda, dtype_name(dtypes[cuda->dtype_arg]))}));
  bool hit = true;
  for (int32_t k = 0; k < op.num_kernels; ++k) {
    if (!has_runtime_source(op.kernels[k])) continue;
    char message[8192] = {0};
    OpforgePrecompileRequest r{};
    r.struct_size = sizeof(r);
    r.dtypes = dtypes.data();
    r.values = values.data();
    r.arch = arch.c_str();
    r.cache_dir = cache_dir.empty() ? nullptr : cache_dir.c_str();
    r.error = message;
    r.error_capacity = sizeof(message);
    const int32_t status = op.kernels[k].precompile(&r, op.kernels[k].user);
    if (status == OPFORGE_STATUS_INVALID_ARGUMENT) throw InvalidArgument(qualified_name(op) + ": " + message);
    if (status != OPFORGE_STATUS_OK) throw InternalError(qualified_name(op) + ": " + message);
    hit = hit && r.cache_hit;
  }
  return hit;
}

}  // namespace opforge::core
