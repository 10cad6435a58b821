#!/usr/bin/env bash
# Calls on the GPU machine: build against its python3 and torch, run every test (CUDA ones
# included), compute-sanitizer on the example kernels, the demo on CUDA, and the benchmarks.
# Logs go to $OUT (or ./out/device when run elsewhere). Usage: tools/device_check.sh [steps...]
# with steps from: build test verify sanitize demo bench (default: all), cpp (the C++ unit tests),
# tests K/N (the build, then the K-th of N groups of the Python tests, in $PYTEST_WORKERS processes), pytest (the tests
# named by $PYTEST_SELECT), bench_elementwise, bench_norms, bench_attention, bench_autograd, bench_backward, bench_training,
# bench_serving, bench_triton, bench_int8_linear, bench_jax, bench_aoti_shims, bench_minilm, bench_decode and
# bench_cache_write (with $BENCH_ARGS, e.g. "--graphs" or "--tokens 4096 65536"), bench_call_cost,
# train_amp (the AMP training run, its plot in $OUT/train_amp), memcheck,
# racecheck, ncu (issue-slot, DRAM, occupancy and stall figures of the kernels of tools/ncu_kernels.py's group
# $NCU_GROUP whose names match $NCU_KERNELS).
#
# The whole suite does not fit one call of the GPU machine (10 minutes; DESIGN.md, "Where things
# run"): one after the other its tests take over an hour there, most of it compiling on the CPU, so
# a group runs them in $PYTEST_WORKERS processes (pytest-xdist, default 14 of the 16 cores; they
# share the one GPU). Run it as two calls, each under the limit (a group took under 4 minutes on an
# H100, with the tests' shared kernel cache):
#   tools/device_check.sh cpp tests 1/2;  tools/device_check.sh tests 2/2
# A group past $PYTEST_LIMIT seconds (default 480) is interrupted (SIGINT), so that pytest still
# prints its summary, which names the failures so far, before the call's own limit stops it. The
# log ends with the group's 30 slowest tests: what to make quicker when a group nears the limit.
# A group is pytest's own selection (--group K/N, tests/python/run_options.py): the collected tests
# in collection order (files by name, tests in file order) dealt out in turn, so the N groups take
# every test once and each about an N-th of every file, whatever files are added. Where a group
# comes near the limit, run more groups (tests 1/3 ... 3/3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/device}"
mkdir -p "$OUT"
export OPFORGE_PYTHON="${OPFORGE_PYTHON:-python3}" PYTHONUNBUFFERED=1
export OPFORGE_MINILM_DIR="${OPFORGE_MINILM_DIR:-$PWD/.weights/minilm}"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX beside torch on one GPU
steps=("${@:-build test verify sanitize demo bench}")
status=0
run() {  # run <name> <command...>: log to $OUT/<name>.log, print the tail, remember failures
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
}
sanitizer() {  # sanitizer <memcheck|racecheck>: compute-sanitizer over the example kernels ($SANITIZE_GROUPS, default all)
  run "$1" compute-sanitizer --tool "$1" --error-exitcode 9 python3 tools/sanitize.py ${SANITIZE_GROUPS:-}
}
set -- ${steps[*]}
while [ $# -gt 0 ]; do
  step=$1
  shift
  case $step in
    build) run build make build ;;
    test) run test make test PYTEST_ARGS="-q -rs" ;;
    cpp) run cpp make test-cpp ;;
    tests)
      group=${1:-}
      if [[ ! $group =~ ^[0-9]+/[0-9]+$ ]]; then
        echo "device_check.sh: tests takes the group to run, K/N (tools/device_check.sh tests 1/3), got '$group'" >&2
        status=1
        continue
      fi
      shift
      run build make build
      run "tests_${group%/*}_of_${group#*/}" timeout --signal=INT --kill-after=30 "${PYTEST_LIMIT:-480}" \
        python3 -m pytest -q -rfEs --durations=30 -p no:logging -n "${PYTEST_WORKERS:-14}" tests/python --group "$group" ;;
    pytest) run pytest python3 -m pytest -q -rs -p no:logging ${PYTEST_SELECT:-tests/python} ;;
    verify) run verify python3 -m opforge verify $(ls examples/ops) --json "$OUT/verify.json" ;;
    sanitize) sanitizer memcheck; sanitizer racecheck ;;
    memcheck | racecheck) sanitizer "$step" ;;
    demo) run demo make demo; cp out/demo/results.json "$OUT/demo_results.json" 2>/dev/null ;;
    bench | bench_elementwise) run bench python3 bench/bench_elementwise.py --json "$OUT/bench_elementwise.json" ;;&
    bench) run bench_rtc python3 bench/bench_runtime_kernels.py --json "$OUT/bench_runtime_kernels.json" ;;
    bench_norms) run bench_norms python3 bench/bench_norms.py --json "$OUT/bench_norms.json" ;;
    bench_attention) run bench_attention python3 bench/bench_attention.py --json "$OUT/bench_attention.json" ;;
    bench_autograd) run bench_autograd python3 bench/bench_autograd.py --json "$OUT/bench_autograd.json" ;;
    bench_backward) run bench_backward python3 bench/bench_backward.py --json "$OUT/bench_backward.json" ;;
    bench_training) run bench_training python3 bench/bench_training.py --json "$OUT/bench_training.json" ;;
    train_amp) run train_amp python3 examples/models/train_amp.py --device cuda --out "$OUT/train_amp" ;;
    bench_serving) run bench_serving python3 bench/bench_serving.py --json "$OUT/bench_serving.json" ;;
    bench_triton) run bench_triton python3 bench/bench_triton.py --json "$OUT/bench_triton.json" ;;
    bench_int8_linear) run bench_int8_linear python3 bench/bench_int8_linear.py --json "$OUT/bench_int8_linear.json" ;;
    bench_jax) run bench_jax python3 bench/bench_jax.py --json "$OUT/bench_jax.json" ;;
    bench_aoti_shims) run bench_aoti_shims python3 bench/bench_aoti_shims.py --device cuda --json "$OUT/bench_aoti_shims.json" ;;
    ncu) run "ncu_${NCU_GROUP:-elementwise}" ncu --kernel-name-base demangled --kernel-name "regex:${NCU_KERNELS:-bias_gelu|rms_norm}" --csv --metrics \
      gpu__time_duration.sum,sm__inst_issued.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct,dram__bytes_read.sum,lts__t_bytes.sum \
      python3 tools/ncu_kernels.py ${NCU_GROUP:-elementwise} ;;
    bench_decode) run bench_decode python3 bench/bench_decode.py ${BENCH_ARGS:-} --json "$OUT/bench_decode.json" ;;
    bench_cache_write) run bench_cache_write python3 bench/bench_cache_write.py ${BENCH_ARGS:-} --json "$OUT/bench_cache_write.json" ;;
    bench_call_cost) run bench_call_cost python3 bench/bench_call_cost.py --json "$OUT/bench_call_cost.json" ;;
    bench_minilm) run bench_minilm python3 bench/bench_minilm.py --profile --json "$OUT/bench_minilm.json" ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
exit $status
