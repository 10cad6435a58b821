"""opforge ops under ``jax.jit`` against the ``jax.numpy`` expression a JAX user would write, in
the same process, and a device-to-device copy of the same bytes (the bandwidth ceiling).

    python3 bench/bench_jax.py [--rows 16384] [--hidden 4096] [--device cuda] [--json out.json]

Ops: softshrink (a run-time kernel, NVRTC), bias_gelu and rms_norm (row-wise, float32
statistics), each in float32 and bfloat16 on x [rows, hidden]. The jnp expressions are jitted
(XLA fuses each into one or two kernels). Bandwidth counts the bytes each op must move (inputs
read once, outputs written once); a time is the median over 7 rounds of 50 calls enqueued back to
back and waited for once (:func:`ms_per_call`), so the host's dispatch cost overlaps the GPU's work. The copy is torch's
``dst.copy_(src)`` over the same number of bytes, timed with CUDA events. Per-call cost: the
median host wall time of one call on a 16-element array: the opforge op and the jnp expression
each under jax.jit (one compiled computation dispatched per call), and the opforge op called
eagerly.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in this process

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
from common import median_ms, report  # noqa: E402

import opforge  # noqa: E402
import opforge.jax  # noqa: E402


def ms_per_call(fn, *args, calls: int = 50, rounds: int = 7) -> float:
    """GPU time per call in ms: the median over ``rounds`` of the wall time of ``calls`` calls
    enqueued back to back (JAX dispatches asynchronously, so the device never waits for the host
    while a call takes longer than its dispatch), then one wait for the last, over ``calls``."""
    for _ in range(5):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times)


def us_per_call(fn, *args, calls: int = 2000) -> float:
    """Median over 5 rounds of host wall time per call, in microseconds (synchronised per round)."""
    rounds = []
    for _ in range(5):
        jax.block_until_ready(fn(*args))
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(rounds)[2]


def rms_norm_jnp(x, w, eps=1e-6):
    h = x.astype(jnp.float32)
    return (h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + eps)).astype(x.dtype) * w


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for lib in ("softshrink", "bias_gelu", "rms_norm"):
        opforge.jax.load_library(opforge.example_library(lib))
    ops = opforge.jax.ops.examples
    device = jax.devices("gpu" if args.device == "cuda" else "cpu")[0]
    cases = {
        "softshrink": (
            lambda x, w: ops.softshrink(x, 0.5),
            lambda x, w: jnp.where(abs(x) > 0.5, x - jnp.sign(x) * 0.5, 0),
        ),
        "bias_gelu": (ops.bias_gelu, lambda x, b: jax.nn.gelu(x + b, approximate=False)),
        "rms_norm": (ops.rms_norm, rms_norm_jnp),
    }
    rows = []
    key = jax.random.key(0)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jax.device_put(jax.random.normal(key, (args.rows, args.hidden), dtype), device)
        w = jax.device_put(jax.random.uniform(key, (args.hidden,), dtype) + 0.5, device)
        nbytes = 2 * x.size * x.dtype.itemsize  # read x, write y (the vector is small)
        if args.device == "cuda":
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            copy_ms = median_ms(lambda: dst.copy_(src))
        else:
            copy_ms = ms_per_call(jax.jit(lambda x: x + 1), x)
        for name, (mine, theirs) in cases.items():
            group = f"{name} [{args.rows}, {args.hidden}] {jnp.dtype(dtype).name} on {args.device}"
            rows.append({"group": group, "impl": "copy (same bytes)", "ms": copy_ms, "GB/s": nbytes / copy_ms / 1e6})
            ours_ms = ms_per_call(jax.jit(mine), x, w)
            jnp_ms = ms_per_call(jax.jit(theirs), x, w)
            for impl, ms in (("opforge op, jax.jit", ours_ms), ("jnp expression, jax.jit", jnp_ms)):
                rows.append(
                    {
                        "group": group,
                        "impl": impl,
                        "ms": ms,
                        "GB/s": nbytes / ms / 1e6,
                        "vs_copy": copy_ms / ms,
                        "vs_jnp": jnp_ms / ms,
                    }
                )
    small = jax.device_put(jnp.linspace(-1.0, 1.0, 16), device)
    theirs = us_per_call(jax.jit(cases["softshrink"][1]), small, small)
    group = f"per call, softshrink on 16 elements on {args.device}"
    for impl, fn in (
        ("opforge op, jax.jit", jax.jit(cases["softshrink"][0])),
        ("jnp expression, jax.jit", jax.jit(cases["softshrink"][1])),
        ("opforge op, eager", cases["softshrink"][0]),
    ):
        us = theirs if impl.startswith("jnp") else us_per_call(fn, small, small)
        rows.append({"group": group, "impl": impl, "us_per_call": us, "vs_jnp": theirs / us})

    def line(r):
        if "us_per_call" in r:
            return f"{r['impl']:<26} {r['us_per_call']:8.2f} us/call  {r['vs_jnp']:.3f} x jnp speed"
        text = f"{r['impl']:<26} {r['ms']:8.3f} ms {r['GB/s']:8.0f} GB/s"
        if "vs_copy" in r:
            text += f"  {r['vs_copy']:.3f} x copy  {r['vs_jnp']:.3f} x jnp speed"
        return text

    report(rows, line, args.json, {"jax": jax.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
