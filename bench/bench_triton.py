"""Triton kernels through opforge (Liger-Kernel's, ``examples/ops/liger``) against the same kernels
launched by Triton itself, against an NVRTC op, and against torch, in one process.

1. Device time of one kernel, launched by opforge (``examples::liger_softmax``,
   ``examples::liger_rms_norm``) and by Triton (``kernel[grid](...)`` with the arguments the ops'
   grid functions pass): each kernel's device time from torch.profiler, and the ratio (>= 0.99
   is the target; the same function, specialisation and options compile to the same binary).
2. Host cost per call of small inputs ([4, 64] float32; CPU wall time per call over many calls):
   ``examples::liger_rms_norm`` (Triton) against ``examples::rms_norm`` (NVRTC, the same
   arguments), Triton's own launch of the same kernel (outputs allocated beforehand), and
   Liger's Python launcher ``rms_norm_forward`` (which allocates them, as an op does).
3. First call: the time of an op's first call with an empty kernel cache (Triton compiles the
   variant in opforge's worker process), of a first call in a fresh process whose cache holds
   it, and of Triton's own first launch with an empty Triton cache; each in a process of its own.
4. Liger's RMSNorm and SwiGLU at [rows, hidden] = [16384, 4096] bf16, forward and backward,
   against the torch expression in eager and under ``torch.compile``, and a device-to-device copy
   of the same bytes (the bandwidth ceiling). SwiGLU's backward runs Liger's kernel, which writes
   the gradients over its a and b: ``examples::liger_swiglu_backward`` gives it copies of a and b
   in its outputs (two copies more than Liger's own launch, which writes into the saved a and b,
   shown too).

    python3 bench/bench_triton.py [--rows 16384] [--hidden 4096] [--parts 1,2,3,4] [--json out.json]

Each part's wall time (compiles included) is printed after it, to stderr, and kept in the JSON.

Bytes moved: RMSNorm reads x and writes y (backward: reads grad_y and x, writes grad_x); SwiGLU
reads a and b and writes c (backward: reads grad_c, a and b, writes grad_a and grad_b). Times are medians of
triton.testing.do_bench (CUDA events), inputs random.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import host_us_per_call, kernel_times, median_ms, report

import opforge

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "examples" / "ops" / "liger" / "kernels"
ops = torch.ops.examples


def liger_settings(cols: int) -> tuple[int, int]:
    """BLOCK_SIZE and num_warps as the ops' grid functions (and Liger's calculate_settings) pick them."""
    block = 1 << max(cols - 1, 0).bit_length()
    return block, 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4


def liger_module(name: str):
    """Liger's kernel file ``name``.py as a Python module (the vendored folder on sys.path, as the
    worker has it)."""
    if str(KERNELS) not in sys.path:
        sys.path.insert(0, str(KERNELS))
    return importlib.import_module(name)


def triton_rms_norm(rms_norm, x, w, y, rstd, eps: float) -> None:
    """Triton's own launch of _rms_norm_forward_kernel with the arguments of liger_rms_norm's grid."""
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    block, warps = liger_settings(cols)
    rms_norm._rms_norm_forward_kernel[(rows,)](
        y, cols, x, cols, w, 1, rstd, 1, cols, eps, 0.0, 0, elementwise_affine=True, BLOCK_SIZE=block, num_warps=warps
    )


def same_kernel(rows: int, hidden: int) -> list[dict]:
    """Part 1: each kernel's device time through opforge and through Triton's launch."""
    rms_norm, softmax = liger_module("rms_norm"), liger_module("softmax")
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(hidden, device="cuda", dtype=torch.bfloat16) + 0.5
    y, rstd = torch.empty_like(x), torch.empty(rows, 1, device="cuda")
    block, warps = liger_settings(hidden)

    def triton_softmax():
        softmax._softmax_single_block_forward_kernel[(rows,)](
            y, hidden, x, hidden, hidden, BLOCK_SIZE=block, num_warps=warps
        )

    cases = [
        ("_softmax_single_block_forward_kernel", lambda: ops.liger_softmax(x), triton_softmax),
        (
            "_rms_norm_forward_kernel",
            lambda: ops.liger_rms_norm(x, w, 1e-6),
            lambda: triton_rms_norm(rms_norm, x, w, y, rstd, 1e-6),
        ),
    ]
    out = []
    for kernel, through_opforge, through_triton in cases:
        times = {}
        for label, fn in (("opforge", through_opforge), ("triton", through_triton)):
            fn()  # the first call compiles (opforge's worker, or Triton in this process): not profiled
            torch.cuda.synchronize()
            table = kernel_times(fn, repeats=50)
            times[label] = sum(k["us"] for k in table if kernel in k["name"])
            times[label + "_median_ms"] = median_ms(fn)
        for label in ("opforge", "triton"):
            out.append(
                {
                    "group": f"1. {kernel}, bf16 [{rows}, {hidden}]: the same kernel, two launchers",
                    "impl": f"launched by {label}",
                    "kernel_us": times[label],
                    "median_ms": times[label + "_median_ms"],
                    "vs_triton": times["triton"] / times[label],
                }
            )
    return out


def host_cost() -> list[dict]:
    """Part 2: host wall time per call of small inputs."""
    rms_norm = liger_module("rms_norm")
    x, w = torch.randn(4, 64, device="cuda"), torch.rand(64, device="cuda") + 0.5
    y, rstd = torch.empty_like(x), torch.empty(4, 1, device="cuda")
    impls = [
        ("opforge examples::liger_rms_norm (Triton kernel)", lambda: ops.liger_rms_norm(x, w, 1e-6)),
        ("opforge examples::rms_norm (NVRTC kernel, same arguments)", lambda: ops.rms_norm(x, w, 1e-6)),
        ("Triton's launch, kernel[grid](...), outputs given", lambda: triton_rms_norm(rms_norm, x, w, y, rstd, 1e-6)),
        (
            "Liger's rms_norm_forward (allocates, then kernel[grid])",
            lambda: rms_norm.rms_norm_forward(x, w, 1e-6, 0.0, "llama", True),
        ),
    ]
    out = []
    for label, fn in impls:
        for _ in range(100):
            fn()
        out.append({"group": "2. host cost per call, [4, 64] float32", "impl": label, "us": host_us_per_call(fn)})
    nvrtc = out[1]["us"]
    for row in out:
        row["vs_nvrtc_op"] = row["us"] / nvrtc
    return out


FIRST_CALL = """
import sys, time, torch
sys.path.insert(0, {bench!r})
import opforge
opforge.load_library(opforge.example_library("liger"))
x, w = torch.randn(64, 1000, device="cuda"), torch.rand(1000, device="cuda") + 0.5
torch.cuda.synchronize()
t0 = time.perf_counter()
if {triton!r}:
    sys.path.insert(0, {kernels!r})
    import rms_norm
    from bench_triton import triton_rms_norm
    triton_rms_norm(rms_norm, x, w, torch.empty_like(x), torch.empty(64, 1, device="cuda"), 1e-6)
else:
    torch.ops.examples.liger_rms_norm(x, w, 1e-6)
torch.cuda.synchronize()
print(time.perf_counter() - t0)
"""


def first_call() -> list[dict]:
    """Part 3: first calls, each in a fresh process."""

    def run(cache: str, triton: bool) -> float:
        env = {**os.environ, "OPFORGE_CACHE_DIR": cache, "TRITON_CACHE_DIR": cache + "/triton"}
        script = FIRST_CALL.format(bench=str(Path(__file__).parent), kernels=str(KERNELS), triton=triton)
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise RuntimeError(f"first-call process failed:\n{proc.stderr[-3000:]}")
        return float(proc.stdout.split()[-1])

    group = "3. first call of _rms_norm_forward_kernel [64, 1000] float32, in a fresh process"
    with tempfile.TemporaryDirectory() as opforge_cache, tempfile.TemporaryDirectory() as triton_cache:
        cold = run(opforge_cache, False)
        warm = run(opforge_cache, False)
        triton_cold = run(triton_cache, True)
        triton_warm = run(triton_cache, True)
    return [
        {"group": group, "impl": "opforge, empty kernel cache (compiles)", "ms": 1e3 * cold},
        {"group": group, "impl": "opforge, the variant in the kernel cache", "ms": 1e3 * warm},
        {"group": group, "impl": "Triton's launch, empty Triton cache (compiles)", "ms": 1e3 * triton_cold},
        {"group": group, "impl": "Triton's launch, the kernel in Triton's cache", "ms": 1e3 * triton_warm},
    ]


def against_torch(rows: int, hidden: int) -> list[dict]:
    """Part 4: Liger's RMSNorm and SwiGLU against torch, torch.compile and a copy."""
    dtype, eps = torch.bfloat16, 1e-6
    out = []

    def group(name: str, nbytes: int, impls: list) -> None:
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ceiling = nbytes / median_ms(lambda: dst.copy_(src)) / 1e6
        del src, dst
        out.append({"group": name, "impl": "device-to-device copy", "ms": nbytes / ceiling / 1e6, "GB/s": ceiling})
        for label, fn in impls:
            ms = median_ms(fn)
            out.append({"group": name, "impl": label, "ms": ms, "GB/s": nbytes / ms / 1e6})
        for row in out:
            if row["group"] == name:
                row["vs_copy"] = row["GB/s"] / ceiling

    def rms_backward(g, x, w, rstd):
        m = g * w
        return rstd * (m - x * rstd * rstd * (m * x).mean(-1, keepdim=True)), (g * x * rstd).sum(0)

    def swiglu_backward(g, a, b):
        s = torch.sigmoid(a)
        return g * (a * s * (1 - s) + s) * b, g * a * s

    x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    w = torch.rand(hidden, device="cuda", dtype=dtype) + 0.5
    g = torch.randn_like(x)
    _, rstd = ops.liger_rms_norm(x, w, eps)
    rms_compiled, rms_backward_compiled = torch.compile(F.rms_norm), torch.compile(rms_backward)
    size = x.numel() * x.element_size()
    group(
        f"4. RMSNorm forward, bf16 [{rows}, {hidden}]",
        2 * size,
        [
            ("opforge examples::liger_rms_norm (Liger's Triton kernel)", lambda: ops.liger_rms_norm(x, w, eps)),
            ("torch eager F.rms_norm", lambda: F.rms_norm(x, (hidden,), w, eps)),
            ("torch.compile of the same", lambda: rms_compiled(x, (hidden,), w, eps)),
        ],
    )
    group(
        f"4. RMSNorm backward, bf16 [{rows}, {hidden}]",
        3 * size,
        [
            (
                "opforge examples::liger_rms_norm_backward (Liger's kernel, dW by sum_into)",
                lambda: ops.liger_rms_norm_backward(g, x, w, rstd, 0.0),
            ),
            ("torch eager (the gradient's expression)", lambda: rms_backward(g, x, w, rstd)),
            ("torch.compile of the same", lambda: rms_backward_compiled(g, x, w, rstd)),
        ],
    )
    a, b = torch.randn_like(x), torch.randn_like(x)
    a_saved, b_saved = a.clone(), b.clone()  # Liger's launcher overwrites them with the gradients
    liger_swiglu = liger_module("swiglu")
    swiglu = lambda a, b: F.silu(a) * b
    swiglu_compiled, swiglu_backward_compiled = torch.compile(swiglu), torch.compile(swiglu_backward)
    group(
        f"4. SwiGLU forward, bf16 [{rows}, {hidden}]",
        3 * size,
        [
            ("opforge examples::liger_swiglu (Liger's Triton kernel)", lambda: ops.liger_swiglu(a, b)),
            ("torch eager silu(a) * b", lambda: swiglu(a, b)),
            ("torch.compile of the same", lambda: swiglu_compiled(a, b)),
        ],
    )
    group(
        f"4. SwiGLU backward, bf16 [{rows}, {hidden}]",
        5 * size,
        [
            (
                "opforge examples::liger_swiglu_backward (Liger's kernel on copies of a, b)",
                lambda: ops.liger_swiglu_backward(g, a, b, 1.0),
            ),
            ("torch eager (the gradients' expression)", lambda: swiglu_backward(g, a, b)),
            ("torch.compile of the same", lambda: swiglu_backward_compiled(g, a, b)),
            (
                "Liger's swiglu_backward (kernel[grid], in place on a, b)",
                lambda: liger_swiglu.swiglu_backward(a_saved, b_saved, g, 1.0),
            ),
        ],
    )
    return out


def line(row: dict) -> str:
    """One report line: a device time, a host cost, a first call's time or a bandwidth."""
    if "kernel_us" in row:
        return (
            f"{row['impl']:<22} kernel {row['kernel_us']:9.1f} us   median {row['median_ms']:.4f} ms   "
            f"{row['vs_triton']:.3f} x Triton's speed"
        )
    if "vs_nvrtc_op" in row:
        return f"{row['impl']:<58} {row['us']:8.2f} us/call  {row['vs_nvrtc_op']:.2f} x the NVRTC op's cost"
    if "GB/s" not in row:
        return f"{row['impl']:<50} {row['ms']:9.1f} ms"
    return f"{row['impl']:<76} {row['ms']:8.3f} ms {row['GB/s']:8.0f} GB/s  {row['vs_copy']:.3f} x copy"


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rows", type=int, default=16384, help="rows of parts 1 and 4 (default 16384)")
    parser.add_argument("--hidden", type=int, default=4096, help="row width of parts 1 and 4 (default 4096)")
    parser.add_argument("--parts", default="1,2,3,4", help="the parts to run, comma-separated (default: all)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: every part times kernels on the device")
    parts = {
        "1": lambda: same_kernel(args.rows, args.hidden),
        "2": host_cost,
        "3": first_call,
        "4": lambda: against_torch(args.rows, args.hidden),
    }
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not chosen or any(p not in parts for p in chosen):
        parser.error(f"--parts: expected some of 1, 2, 3, 4 separated by commas, got {args.parts!r}")
    for name in ("liger", "rms_norm"):
        opforge.load_library(opforge.example_library(name))
    rows, seconds = [], {}
    for part in chosen:
        t0 = time.perf_counter()
        rows += parts[part]()
        seconds[part] = time.perf_counter() - t0
        print(f"part {part}: {seconds[part]:.1f} s", file=sys.stderr, flush=True)
    report(rows, line, args.json, {"seconds": sum(seconds.values()), "seconds_by_part": seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
