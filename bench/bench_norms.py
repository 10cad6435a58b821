"""Norm example ops against what a user would run instead, in the same process.

``examples::rms_norm`` against ``F.rms_norm`` and ``torch.compile`` of it (for 16-bit inputs
also with a float32 weight, against ``F.rms_norm`` of the weight cast to x's dtype), and
``examples::add_layer_norm`` against ``F.layer_norm(x + residual)`` in eager and compiled; all
compared with a device-to-device copy (the bandwidth ceiling), at [32768, 4096] by default.

    python3 bench/bench_norms.py [--rows 32768] [--cols 4096] [--json out.json]

Bandwidth counts bytes read plus bytes written once each (rms_norm: x and y; add_layer_norm:
x, residual and y; the [cols] weight and bias are negligible). Times are medians of
triton.testing.do_bench (CUDA events), inputs random.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from common import median_ms, report

import opforge


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for op in ("rms_norm", "add_layer_norm"):
        opforge.load_library(opforge.example_library(op))
    rows = []

    def record(group, name, ms, nbytes, copy_gbs):
        gbs = nbytes / ms / 1e6
        rows.append({"group": group, "impl": name, "ms": ms, "GB/s": gbs, "vs_copy": gbs / copy_gbs})

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.randn(args.rows, args.cols, device="cuda", dtype=dtype)
        r = torch.randn_like(x)
        w = torch.rand(args.cols, device="cuda", dtype=dtype) + 0.5
        b = torch.randn(args.cols, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        size = x.numel() * x.element_size()
        copy_ms = median_ms(lambda: y.copy_(x))
        copy_gbs = 2 * size / copy_ms / 1e6
        shape = f"{str(dtype)[6:]} [{args.rows}, {args.cols}]"

        group = f"rms_norm {shape}"
        record(group, "device-to-device copy", copy_ms, 2 * size, copy_gbs)
        record(
            group,
            "opforge examples::rms_norm",
            median_ms(lambda: torch.ops.examples.rms_norm(x, w, 1e-6)),
            2 * size,
            copy_gbs,
        )
        record(group, "torch F.rms_norm", median_ms(lambda: F.rms_norm(x, (args.cols,), w, 1e-6)), 2 * size, copy_gbs)
        compiled = torch.compile(lambda t, ww: F.rms_norm(t, (args.cols,), ww, 1e-6))
        compiled(x, w)
        record(group, "torch.compile(F.rms_norm)", median_ms(lambda: compiled(x, w)), 2 * size, copy_gbs)
        if dtype != torch.float32:  # a float32 weight beside 16-bit activations, as under autocast
            w32 = w.float()
            record(
                group,
                "opforge examples::rms_norm, float32 weight",
                median_ms(lambda: torch.ops.examples.rms_norm(x, w32, 1e-6)),
                2 * size,
                copy_gbs,
            )
            record(
                group,
                "torch F.rms_norm(x, w32.to(x.dtype))",
                median_ms(lambda: F.rms_norm(x, (args.cols,), w32.to(dtype), 1e-6)),
                2 * size,
                copy_gbs,
            )

        group = f"add_layer_norm {shape}"
        record(group, "device-to-device copy", copy_ms, 2 * size, copy_gbs)
        record(
            group,
            "opforge examples::add_layer_norm",
            median_ms(lambda: torch.ops.examples.add_layer_norm(x, r, w, b, 1e-5)),
            3 * size,
            copy_gbs,
        )
        record(
            group,
            "torch F.layer_norm(x + r) eager",
            median_ms(lambda: F.layer_norm(x + r, (args.cols,), w, b, 1e-5)),
            3 * size,
            copy_gbs,
        )
        compiled = torch.compile(lambda t, res, ww, bb: F.layer_norm(t + res, (args.cols,), ww, bb, 1e-5))
        compiled(x, r, w, b)
        record(group, "torch.compile(F.layer_norm(x + r))", median_ms(lambda: compiled(x, r, w, b)), 3 * size, copy_gbs)
        del x, r, y

    report(
        rows, lambda r: f"{r['impl']:<36} {r['ms']:8.3f} ms {r['GB/s']:8.0f} GB/s  {r['vs_copy']:.3f} x copy", args.json
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
