/*
 * opforge/core.h -- the C entry points of libopforge_core, for tooling in other languages
 * (Python's opforge package reaches them through ctypes).
 *
 * libopforge_core holds what every adapter shares (Note [One core for every adapter] in
 * src/core/library.h): loading and validating op libraries, the call protocol, shape rules,
 * precompile and the libraries' JSON description. Requests and responses are JSON text. Each
 * function returns an OpforgeStatus and sets `*out` to a string the caller frees with
 * opforge_core_free: on OPFORGE_STATUS_OK the response, otherwise the error as
 *   {"status": "invalid_argument" | "internal", "message": "..."}
 * where "invalid_argument" is the caller's fault (Python raises ValueError) and "internal" a
 * failure to load, compile or run (RuntimeError).
 */
#ifndef OPFORGE_CORE_H_
#define OPFORGE_CORE_H_

#include "opforge/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads and validates the op library at `path` (loading it again is a no-op) and sets *out to
 * its description (src/core/description.h documents the format). */
OpforgeStatus opforge_core_load_library(const char* path, char** out);

/* Compiles one instantiation of an op's run-time kernels ahead of time, without a GPU.
 * Request: {"op": "ns::op", "dtypes": {tensor name: "float16", ...}, "params": {name: value},
 * "arch": "sm_90", "cache_dir": path | null}; tensors left out are absent optional inputs,
 * compile-time parameters left out take their defaults. Response: {"cache_hit": bool}. */
OpforgeStatus opforge_core_precompile(const char* request, char** out);

/* Input shapes that satisfy an op's shape rules (opforge::core::example_shapes), with what a
 * generator needs besides (opforge::core::example_facts). Request: {"op": "ns::op", "lead": 3,
 * "last": 37, "leading": 1 (leading dims of a shape({leading_dims, ...}) input), "params":
 * {name: value}, "omit_optional": false (rules judged for calls that leave the optional tensor
 * inputs out)}. Response: {"shapes": {tensor name: [sizes...]},
 * "bounds": {name of an input with a value domain: [low, high]}, "rule_problems": [the
 * cross-argument rules these shapes break, as a call reports them]}. */
OpforgeStatus opforge_core_example_shapes(const char* request, char** out);

/* Checks a call and evaluates its output rules, as a call's own check does (the same messages).
 * Request: {"op": "ns::op", "args": {tensor name: {"dtype": "float32", "shape": [2, 3],
 * "device": "cpu"} | null, param name: value}}; parameters left out take their defaults.
 * Response: {"outputs": [{"name": "y", "dtype": "float32", "shape": [2, 3]} | null (an output that exists
 * only with an optional input the call left out), ...]}. */
OpforgeStatus opforge_core_output_shapes(const char* request, char** out);

/* How a view reaches the kernel for one tensor input (opforge::core::admit: the layout rule,
 * and for a mutated input the refusal of a copy). Request: {"op": "ns::op", "arg": name,
 * "dtype": "float32", "shape": [...], "strides": [...] (elements), "offset_bytes": the data
 * pointer's distance past a 16-byte boundary}. Response: {"admission": "as_is" | "dense_copy" |
 * "refuse", "refusal": the call's error line for a refused view | null}. */
OpforgeStatus opforge_core_admission(const char* request, char** out);

/* Forgets every compiled run-time kernel of every loaded library (opforge.reload()). */
void opforge_core_reload(void);

/* Fills op outputs with poison before kernels run: mode 0 off, 1 the primary pattern (NaN for
 * floating types), 2 the alternate one (Note [The call protocol] in src/core/call.h). */
void opforge_core_set_poison_outputs(int mode);

/* The poison mode outputs get now (0, 1 or 2; see opforge_core_set_poison_outputs). */
int opforge_core_poison_outputs(void);

/* The byte repeated over an output of dtype `dtype` (opforge's name, "float16") in poison mode
 * `mode` (1 or 2); -1 for a name opforge does not know. */
int opforge_core_poison_byte(const char* dtype, int mode);

/* Checks value domains of device calls on the device (1, the default) or not (0): Note [Device
 * value checks] in src/core/device_checks.h. */
void opforge_core_set_device_value_checks(int enabled);

void opforge_core_free(char* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OPFORGE_CORE_H_ */
