"""The fp8 quantisers (examples/ops/fp8_quant) against the torch expression of vLLM's rules in
eager and under ``torch.compile``, each compared with a device-to-device copy of the bytes it
moves (the bandwidth ceiling), in one process.

At [tokens, hidden] = [16384, 4096] from bf16 to float8_e4m3fn by default:
``examples::static_scaled_fp8_quant`` (one float32 scale) and
``examples::dynamic_per_token_scaled_fp8_quant`` (a scale per token, with an upper bound).

    python3 bench/bench_fp8_quant.py [--tokens 16384] [--hidden 4096] [--json out.json]

Bytes moved: the input read (2 bytes an element in bf16) and the result written (1 byte), plus a
float32 scale per token for the per-token form. Times are medians of triton.testing.do_bench
(CUDA events), inputs random.
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import bandwidth_group, bandwidth_or_call_line, report

import opforge

FP8 = torch.float8_e4m3fn
TOP = torch.finfo(FP8).max


def static_torch(result: torch.Tensor, x: torch.Tensor, scale: torch.Tensor) -> None:
    """vLLM's static quantisation in torch: x times the scale's reciprocal, saturated."""
    result.copy_((x.float() * scale.reciprocal()).clamp(-TOP, TOP).to(FP8))


def per_token_torch(result: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, scale_ub: torch.Tensor) -> None:
    """vLLM's dynamic per-token quantisation in torch."""
    absmax = x.float().abs().amax(-1, keepdim=True).clamp(max=scale_ub)
    scale.copy_((absmax / TOP).clamp(min=1 / (TOP * 512)))
    result.copy_((x.float() / scale).clamp(-TOP, TOP).to(FP8))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("fp8_quant"))
    T, H = args.tokens, args.hidden
    rows = []

    def group(name: str, nbytes: int, impls: list) -> None:
        bandwidth_group(rows, name, nbytes, impls)

    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16) * 10
    result = torch.empty(T, H, device="cuda", dtype=FP8)
    scale = torch.tensor([0.05], device="cuda")
    scales = torch.empty(T, 1, device="cuda")
    scale_ub = torch.tensor([20.0], device="cuda")
    static_compiled = torch.compile(static_torch)
    per_token_compiled = torch.compile(per_token_torch)
    static_compiled(result, x, scale)
    per_token_compiled(result, x, scales, scale_ub)
    group(
        f"static_scaled_fp8_quant bf16 -> float8_e4m3fn [{T}, {H}]",
        x.numel() * 3,
        [
            (
                "opforge examples::static_scaled_fp8_quant",
                lambda: torch.ops.examples.static_scaled_fp8_quant(result, x, scale),
            ),
            ("torch eager", lambda: static_torch(result, x, scale)),
            ("torch.compile of the same", lambda: static_compiled(result, x, scale)),
        ],
    )
    group(
        f"dynamic_per_token_scaled_fp8_quant bf16 -> float8_e4m3fn [{T}, {H}], scale_ub",
        x.numel() * 3 + T * 4,
        [
            (
                "opforge examples::dynamic_per_token_scaled_fp8_quant",
                lambda: torch.ops.examples.dynamic_per_token_scaled_fp8_quant(result, x, scales, scale_ub),
            ),
            ("torch eager", lambda: per_token_torch(result, x, scales, scale_ub)),
            ("torch.compile of the same", lambda: per_token_compiled(result, x, scales, scale_ub)),
        ],
    )

    report(rows, bandwidth_or_call_line(58), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
