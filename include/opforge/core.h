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

/* Input shapes that satisfy an op's rules (opforge::core::example_shapes).
 * Request: {"op": "ns::op", "lead": 3, "last": 37, "params": {name: value}}. Response:
 * {"shapes": {tensor name: [sizes...]}}. */
OpforgeStatus opforge_core_example_shapes(const char* request, char** out);

/* Checks a call and evaluates its output rules, as a call's own check does (the same messages).
 * Request: {"op": "ns::op", "args": {tensor name: {"dtype": "float32", "shape": [2, 3],
 * "device": "cpu"} | null, param name: value}}; parameters left out take their defaults.
 * Response: {"outputs": [{"name": "y", "dtype": "float32", "shape": [2, 3]}, ...]}. */
OpforgeStatus opforge_core_output_shapes(const char* request, char** out);

/* Forgets every compiled run-time kernel of every loaded library (opforge.reload()). */
void opforge_core_reload(void);

/* Fills op outputs with poison before kernels run (see opforge::core::poison_outputs). */
void opforge_core_set_poison_outputs(int enabled);

void opforge_core_free(char* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OPFORGE_CORE_H_ */
