"""Backward kernels of the example norms and activations against what a user would run instead,
in the same process, at [32768, 4096] by default.

For each of ``examples::bias_gelu``, ``examples::rms_norm``, ``examples::add_layer_norm`` and the
in-place ``examples::fused_add_rms_norm``:

- ``opforge <op>_backward``: the backward op called directly (what the op's Autograd kernel runs);
- ``opforge through autograd``: ``torch.autograd.grad`` of the op's output (the graph built once,
  outside the timing), i.e. the backward op plus autograd's own work;
- ``torch eager``: ``torch.autograd.grad`` of the torch expression (``F.gelu(x + bias)``,
  ``F.rms_norm``, ``F.layer_norm(x + residual)``, ``F.rms_norm(x + residual)`` and the sum), torch's
  own backward kernels;
- ``torch.compile``: the same through the backward graph Inductor generates for the compiled
  expression;
- a device-to-device copy of x, the bandwidth ceiling.

Bandwidth (``x copy``) counts what the opforge backward op must move, each tensor once: bias_gelu
reads grad_y and x and writes grad_x (3 x the bytes of x); rms_norm the same (3 x); add_layer_norm
reads grad_y, x and residual and writes the one gradient of x and residual (4 x; torch's saves
x + residual in the forward, 3 x); fused_add_rms_norm reads the gradients of x and residual after
the op and residual, and writes the one gradient of x and residual as given (4 x). Parameter gradients ([cols]) and the
per-block partial sums are negligible beside them. Times are medians of triton.testing.do_bench.

With ``--profile``, the GPU kernels of each opforge backward op are traced (common.kernel_times):
the row kernel's and the parameter gradients' column sums' device times apart.

    python3 bench/bench_backward.py [--rows 32768] [--cols 4096] [--dtype bfloat16 ...] [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from common import kernel_times, median_ms, print_kernel_times, report

import opforge

ex = torch.ops.examples


def fused_add_rms_norm(x, residual, weight):
    """examples::fused_add_rms_norm on copies of x and residual: (x, residual) after it."""
    x, residual = x.clone(), residual.clone()
    ex.fused_add_rms_norm(x, residual, weight, 1e-6)
    return x, residual


def cases(rows: int, cols: int, dtype: torch.dtype):
    """(op, opforge backward call, opforge forward, torch forward, leaves, the gradients of the
    forward's results, bytes moved / size of x)."""
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.rand(cols, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(cols, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    yield (
        "bias_gelu",
        lambda: ex.bias_gelu_backward(g, x, b),
        ex.bias_gelu,
        lambda x, b: F.gelu(x + b),
        (x, b),
        g,
        3,
    )
    yield (
        "rms_norm",
        lambda: ex.rms_norm_backward(g, x, w, 1e-6),
        lambda x, w: ex.rms_norm(x, w, 1e-6),
        lambda x, w: F.rms_norm(x, (cols,), w, 1e-6),
        (x, w),
        g,
        3,
    )
    yield (
        "add_layer_norm",
        lambda: ex.add_layer_norm_backward(g, x, r, w, 1e-5),
        lambda x, r, w, b: ex.add_layer_norm(x, r, w, b, 1e-5),
        lambda x, r, w, b: F.layer_norm(x + r, (cols,), w, b, 1e-5),
        (x, r, w, b),
        g,
        4,
    )
    g2 = torch.randn_like(x)
    yield (
        "fused_add_rms_norm",
        lambda: ex.fused_add_rms_norm_backward(g, g2, r, w, 1e-6),
        fused_add_rms_norm,
        lambda x, r, w: (F.rms_norm(x + r, (cols,), w, 1e-6), x + r),
        (x, r, w),
        (g, g2),
        4,
    )


def backward_ms(forward, leaves, grad_y) -> float:
    """Median time of torch.autograd.grad through `forward`'s graph, built once beforehand."""
    inputs = [t.detach().requires_grad_() for t in leaves]
    out = forward(*inputs)
    return median_ms(lambda: torch.autograd.grad(out, inputs, grad_y, retain_graph=True))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float16", "float32"])
    parser.add_argument("--profile", action="store_true", help="trace each opforge backward op's GPU kernels")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for op in ("bias_gelu", "rms_norm", "add_layer_norm", "fused_add_rms_norm"):
        opforge.load_library(opforge.example_library(op))
    rows, profiles = [], {}
    for dtype in (getattr(torch, d) for d in args.dtype):
        x = torch.randn(args.rows, args.cols, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        size = x.numel() * x.element_size()
        copy_ms = median_ms(lambda: y.copy_(x))
        copy_gbs = 2 * size / copy_ms / 1e6
        del x, y
        for op, direct, opforge_fwd, torch_fwd, leaves, grad_y, moved in cases(args.rows, args.cols, dtype):
            group = f"{op} backward {str(dtype)[6:]} [{args.rows}, {args.cols}]"
            nbytes = moved * size
            compiled = torch.compile(torch_fwd)
            timings = [
                ("device-to-device copy (ceiling)", copy_ms, 2 * size),
                (f"opforge examples::{op}_backward", median_ms(direct), nbytes),
                ("opforge through autograd", backward_ms(opforge_fwd, leaves, grad_y), nbytes),
                ("torch eager backward", backward_ms(torch_fwd, leaves, grad_y), nbytes),
                ("torch.compile backward", backward_ms(compiled, leaves, grad_y), nbytes),
            ]
            ours = timings[1][1]
            if args.profile:
                profiles[group] = kernel_times(direct)
            for impl, ms, moved_bytes in timings:
                gbs = moved_bytes / ms / 1e6
                rows.append(
                    {
                        "group": group,
                        "impl": impl,
                        "ms": ms,
                        "GB/s": gbs,
                        "vs_copy": gbs / copy_gbs,
                        "opforge_speedup": ms / ours,
                    }
                )
            torch.cuda.empty_cache()
    report(
        rows,
        lambda r: (
            f"{r['impl']:<36} {r['ms']:8.3f} ms {r['GB/s']:8.0f} GB/s  {r['vs_copy']:.3f} x copy"
            f"  opforge op {r['opforge_speedup']:.2f} x faster"
        ),
        args.json,
        {"profiles": profiles},
    )
    for group, table in profiles.items():
        print_kernel_times(f"GPU kernels of opforge's backward op, {group}", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
