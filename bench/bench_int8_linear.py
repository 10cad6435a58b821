"""examples::Int8Linear (int8 weights per output channel, dequantised in the kernel) against what a
user would run instead, in the same process: ``F.linear`` in float16 (cuBLAS) with the float
weight, and a device-to-device copy of the int8 weight's bytes (the bandwidth ceiling).

    python3 bench/bench_int8_linear.py [--rows 1 2 4 8 16 4096] [--json out.json]

Weights [N, K] of 4096 x 4096, 14336 x 4096 (an MLP's up projection) and 4096 x 14336 (its down
projection), and two with tails past the kernels' strips of 8 output channels and chunks of 64
input channels: 1000 x 1000 (both tails) and 50257 x 768 (GPT-2's vocabulary projection, N % 8 = 1);
x [M, K] in float16. Bytes moved count the int8 weight, the scales, x and y once each;
the copy moves the same number of bytes. Accuracy against F.linear in float32 with the float
weight: max abs error and max error relative to the output's largest magnitude, for the int8
path and for float16 cuBLAS. TFLOP/s count 2 M N K. Times are medians of triton.testing.do_bench
(CUDA events; it clears the L2 cache before each run, so weights come from device memory).
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
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 4096])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("int8_linear"))
    rows = []
    torch.manual_seed(0)
    for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (1000, 1000), (50257, 768)):
        weight = torch.randn(n, k, device="cuda") / k**0.5
        q8 = torch.classes.examples.Int8Linear(weight, None)
        w16 = weight.half()
        for m in args.rows:
            x = torch.randn(m, k, device="cuda")
            x16 = x.half()
            nbytes = n * k + 4 * n + 2 * m * k + 2 * m * n
            src = torch.empty(nbytes // 2, device="cuda", dtype=torch.int8)
            dst = torch.empty_like(src)
            copy_ms = median_ms(lambda: dst.copy_(src))  # reads and writes nbytes // 2 each
            cublas_ms = median_ms(lambda: F.linear(x16, w16))
            int8_ms = median_ms(lambda: q8.forward(x16))
            exact = F.linear(x16.float(), weight)
            scale = exact.abs().max().item()
            err8 = (q8.forward(x16).float() - exact).abs().max().item()
            err16 = (F.linear(x16, w16).float() - exact).abs().max().item()
            group = f"[{m}, {k}] x [{n}, {k}]^T float16"
            copy_gbs = nbytes / copy_ms / 1e6
            rows.append({"group": group, "impl": "device-to-device copy (same bytes)", "ms": copy_ms, "GB/s": copy_gbs})
            rows.append(
                {
                    "group": group,
                    "impl": "F.linear float16 (cuBLAS)",
                    "ms": cublas_ms,
                    "TFLOP/s": 2 * m * n * k / cublas_ms / 1e9,
                    "max_abs_err": err16,
                    "max_rel_err": err16 / scale,
                }
            )
            rows.append(
                {
                    "group": group,
                    "impl": "opforge Int8Linear.forward",
                    "ms": int8_ms,
                    "TFLOP/s": 2 * m * n * k / int8_ms / 1e9,
                    "GB/s": nbytes / int8_ms / 1e6,
                    "vs_copy": copy_ms / int8_ms,
                    "speedup_vs_cublas": cublas_ms / int8_ms,
                    "max_abs_err": err8,
                    "max_rel_err": err8 / scale,
                }
            )

    def line(r):
        text = f"{r['impl']:<36} {r['ms']:8.4f} ms"
        if "GB/s" in r:
            text += f"  {r['GB/s']:7.0f} GB/s"
        if "TFLOP/s" in r:
            text += f"  {r['TFLOP/s']:6.1f} TFLOP/s"
        if "vs_copy" in r:
            text += f"  {r['vs_copy']:.2f} x copy bandwidth  {r['speedup_vs_cublas']:.2f} x cuBLAS"
        if "max_abs_err" in r:
            text += f"  max err {r['max_abs_err']:.2e} (rel {r['max_rel_err']:.2e})"
        return text

    report(rows, line, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
