// Ahead-of-time compilation of run-time kernels (see precompile.h).
#include "precompile.h"

#include "check.h"
#include "opforge/detail/names.h"
#include "opforge/error.h"
#include "records.h"
#include "schema.h"
#include "span.h"

namespace opforge::core {

bool precompile(const OpforgeOpSpec& op, const std::vector<int32_t>& given, const std::vector<OpforgeValue>& values,
                const std::string& arch, const std::string& cache_dir,
                const std::vector<std::vector<int64_t>>& shapes) {
  OPFORGE_ICHECK(given.size() == static_cast<size_t>(op.num_args) && values.size() == given.size());
  // A required input's dtype the description fixes need not be given: same_dtype's, or the only
  // one its set allows (in rule order, a same_dtype model comes first, so one pass settles it).
  std::vector<int32_t> dtypes(given);
  for (int32_t i : rule_order(op, kReadsDtype)) {
    const OpforgeArgSpec& a = op.args[i];
    if (a.kind != OPFORGE_ARG_TENSOR || dtypes[i] >= 0 || is_optional(a)) continue;
    if (a.tensor.dtype_like >= 0) dtypes[i] = dtypes[a.tensor.dtype_like];
    else if (__builtin_popcount(a.tensor.dtypes) == 1) dtypes[i] = __builtin_ctz(a.tensor.dtypes);
  }
  std::vector<std::string> why;
  std::vector<bool> bad(op.num_args,
                        false);  // as a call's check: a bad dtype is reported once, not again by same_dtype
  for (int32_t i : rule_order(op, kReadsDtype)) {
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
  // With shapes: the call's checks and output rules, and every tensor's rank and sizes for the request.
  std::vector<int32_t> ndims;
  std::vector<const int64_t*> sizes;
  std::vector<OutputInfo<int64_t>> outs;
  if (!shapes.empty()) {
    OPFORGE_ICHECK(shapes.size() == static_cast<size_t>(op.num_args));
    std::vector<ArgInfo<int64_t>> info(op.num_args);
    for (int32_t i = 0; i < op.num_args; ++i) {
      info[i].value = values[i];
      if (op.args[i].kind != OPFORGE_ARG_TENSOR) continue;
      info[i].defined = dtypes[i] >= 0;
      info[i].dtype = dtypes[i];
      info[i].dtype_label = dtypes[i] >= 0 ? dtype_name(dtypes[i]) : "unknown";
      info[i].device_type = "cuda";
      info[i].device_index = 0;
      info[i].sizes = Span<const int64_t>(shapes[i].data(), shapes[i].size());
    }
    const std::string problems = check_call<int64_t>(op, info, outs);
    if (!problems.empty()) throw InvalidArgument(problems);
    for (int32_t i = 0; i < op.num_args; ++i) {
      const bool tensor = op.args[i].kind == OPFORGE_ARG_TENSOR && dtypes[i] >= 0;
      ndims.push_back(tensor ? static_cast<int32_t>(shapes[i].size()) : -1);
      sizes.push_back(tensor ? shapes[i].data() : nullptr);
    }
    for (const auto& o : outs) {
      ndims.push_back(o.defined ? static_cast<int32_t>(o.sizes.size()) : -1);
      sizes.push_back(o.defined ? o.sizes.data() : nullptr);
    }
  }
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
    r.num_shapes = static_cast<int32_t>(ndims.size());
    r.ndims = ndims.data();
    r.sizes = sizes.data();
    const int32_t status = op.kernels[k].precompile(&r, op.kernels[k].user);
    if (status == OPFORGE_STATUS_INVALID_ARGUMENT) throw InvalidArgument(qualified_name(op) + ": " + message);
    if (status != OPFORGE_STATUS_OK) throw InternalError(qualified_name(op) + ": " + message);
    hit = hit && r.cache_hit;
  }
  return hit;
}

}  // namespace opforge::core
