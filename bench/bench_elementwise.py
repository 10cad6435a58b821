"""Elementwise example ops against what a user would run instead, in the same process.

For each op: opforge's CUDA kernel, the native torch expression in eager, and torch.compile of
that expression; all compared with a device-to-device copy of the same bytes (the bandwidth
ceiling). Then the per-call host cost on a tiny tensor, against the native op and a Python
``torch.library.custom_op`` wrapping it.

    python3 bench/bench_elementwise.py [--gib 4] [--json out.json]

Bandwidth counts bytes read plus bytes written once each. Times are medians of
triton.testing.do_bench (CUDA events), inputs random; each row also gives the mean SM clock (NVML)
over its timing, since the H200 lowers its clock under sustained load, which slows
arithmetic-heavy kernels but not a copy.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from common import bandwidth_or_call_line, host_us_per_call, report, sm_clock, timed

import opforge


@torch.library.custom_op("bench::softshrink_py", mutates_args=())
def softshrink_py(x: torch.Tensor, lambd: float) -> torch.Tensor:
    return F.softshrink(x, lambd)


@softshrink_py.register_fake
def _(x, lambd):
    return torch.empty_like(x)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0, help="size of each input tensor in GiB (the target size)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for op in ("softshrink", "bias_gelu"):
        opforge.load_library(opforge.example_library(op))
    rows = []

    clock = sm_clock()

    def record(group, name, fn, nbytes, baseline_ms=None):
        """Time ``fn``, append its row; returns its median time in ms."""
        ms, mhz = timed(fn, clock)
        rows.append(
            {
                "group": group,
                "impl": name,
                "ms": ms,
                "GB/s": nbytes / ms / 1e6,
                "vs_copy": (baseline_ms or ms) / ms,
                "sm_mhz": mhz,
            }
        )
        return ms

    for dtype in (torch.float32, torch.bfloat16):
        n = int(args.gib * 2**30) // torch.finfo(dtype).bits * 8
        x = torch.randn(n, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()
        group = f"softshrink {str(dtype)[6:]} {args.gib:g} GiB"
        copy = record(group, "device-to-device copy", lambda: y.copy_(x), nbytes)
        record(group, "opforge examples::softshrink", lambda: torch.ops.examples.softshrink(x, 0.5), nbytes, copy)
        record(group, "torch F.softshrink", lambda: F.softshrink(x, 0.5), nbytes, copy)
        compiled = torch.compile(lambda t: F.softshrink(t, 0.5))
        compiled(x)
        record(group, "torch.compile(F.softshrink)", lambda: compiled(x), nbytes, copy)

        cols = 1536  # MiniLM's intermediate size
        h = x.view(-1, cols) if n % cols == 0 else x[: n // cols * cols].view(-1, cols)
        b = torch.randn(cols, device="cuda", dtype=dtype)
        nbytes = 2 * h.numel() * h.element_size()
        group = f"bias_gelu {str(dtype)[6:]} [{h.shape[0]}, {cols}]"
        hy = torch.empty_like(h)
        copy = record(group, "device-to-device copy", lambda: hy.copy_(h), nbytes)
        record(group, "opforge examples::bias_gelu", lambda: torch.ops.examples.bias_gelu(h, b), nbytes, copy)
        record(group, "torch F.gelu(x + b) eager", lambda: F.gelu(h + b), nbytes, copy)
        compiled = torch.compile(lambda t, bb: F.gelu(t + bb))
        compiled(h, b)
        record(group, "torch.compile(F.gelu(x + b))", lambda: compiled(h, b), nbytes, copy)
        del x, y, h, hy

    # Per-call cost on a tiny tensor: host wall time per call over many calls (dispatch,
    # checks, allocation, launch), then one synchronisation.
    # torch.ops.<ns>.<op>.default against torch.ops.aten's overload is the like-for-like pair (both
    # through the dispatcher's Python binding); F.softshrink skips that binding's argument parsing,
    # and the packet (no .default) adds overload resolution. The CPU rows, on 16 elements so that
    # the kernels' own work is negligible, are the host's part alone.
    for device, numel in (("cuda", 4096), ("cpu", 16)):
        small = torch.randn(numel, device=device)
        group = f"per-call cost, {numel} float32 on {device} (host wall time)"
        impls = [
            ("torch.ops.aten.softshrink.default", lambda: torch.ops.aten.softshrink.default(small, 0.5)),
            ("torch.ops.examples.softshrink.default", lambda: torch.ops.examples.softshrink.default(small, 0.5)),
            ("torch F.softshrink", lambda: F.softshrink(small, 0.5)),
            ("torch.ops.examples.softshrink (packet)", lambda: torch.ops.examples.softshrink(small, 0.5)),
            ("torch.library.custom_op (Python)", lambda: softshrink_py(small, 0.5)),
        ]
        per_call = {name: host_us_per_call(fn) for name, fn in impls}
        native = per_call["torch.ops.aten.softshrink.default"]
        for name, us in per_call.items():
            rows.append({"group": group, "impl": name, "us_per_call": us, "vs_native": native / us})

    report(rows, bandwidth_or_call_line(40), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
