"""Backward through an opforge op against what a user would write instead, in the same process.

``examples::softshrink`` names ``examples::softshrink_backward`` (Note [Backward ops]); the
torch adapter runs it from a C++ Autograd kernel. Compared with:

- ``torch.nn.functional.softshrink`` (torch's own forward and backward kernels);
- a Python ``torch.library.custom_op`` with ``register_autograd`` whose forward and backward
  call the same opforge ops (so the kernels are equal and only the autograd path differs);

1. per call, forward plus backward on a 64-element tensor (host wall time: the autograd path);
2. on a GPU, the backward alone at a large size against a device-to-device copy of the same
   bytes (grad_y and x read, grad_x written).

    python3 bench/bench_autograd.py [--device cuda|cpu] [--mib 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from common import bandwidth_or_call_line, host_us_per_call, median_ms, report

import opforge


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mib", type=int, default=1024, help="size of x for the GPU bandwidth group, in MiB")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("softshrink"))

    @torch.library.custom_op("bench::softshrink_py", mutates_args=())
    def softshrink_py(x: torch.Tensor, lambd: float) -> torch.Tensor:
        return torch.ops.examples.softshrink(x, lambd)

    softshrink_py.register_fake(lambda x, lambd: torch.empty_like(x))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.lambd = inputs[1]

    def backward(ctx, grad):
        return torch.ops.examples.softshrink_backward(grad, ctx.saved_tensors[0], ctx.lambd), None

    softshrink_py.register_autograd(backward, setup_context=setup_context)

    rows = []
    small = torch.randn(64, device=args.device, requires_grad=True)
    grad = torch.ones_like(small)
    group = f"per call, forward + backward, 64 float32 on {args.device} (host wall time)"
    impls = [
        ("torch F.softshrink", lambda t: F.softshrink(t, 0.5)),
        ("opforge examples::softshrink", lambda t: torch.ops.examples.softshrink(t, 0.5)),
        ("torch.library.custom_op + register_autograd", lambda t: softshrink_py(t, 0.5)),
    ]
    for _, fn in impls:  # the three agree before any is timed
        (g,) = torch.autograd.grad(fn(small), small, grad)
        torch.testing.assert_close(g, (small.detach().abs() > 0.5).float())
    per_call = {
        name: host_us_per_call(lambda fn=fn: torch.autograd.grad(fn(small), small, grad), calls=5000)
        for name, fn in impls
    }
    for name, us in per_call.items():
        rows.append({"group": group, "impl": name, "us_per_call": us, "vs_native": per_call["torch F.softshrink"] / us})

    if args.device == "cuda":
        n = args.mib * 2**20 // 4
        x = torch.randn(n, device="cuda")
        g = torch.randn_like(x)
        y = torch.empty_like(x)
        copy_ms = median_ms(lambda: y.copy_(x))
        copy_gbs = 2 * x.nbytes / copy_ms / 1e6
        group = f"backward alone, {args.mib} MiB float32 (grad_y and x read, grad_x written)"
        native = torch.ops.aten.softshrink_backward
        for name, fn in [
            ("device-to-device copy", None),
            ("opforge examples::softshrink_backward", lambda: torch.ops.examples.softshrink_backward(g, x, 0.5)),
            ("torch aten::softshrink_backward", lambda: native(g, x, 0.5)),
        ]:
            ms, nbytes = (copy_ms, 2 * x.nbytes) if fn is None else (median_ms(fn), 3 * x.nbytes)
            gbs = nbytes / ms / 1e6
            rows.append({"group": group, "impl": name, "ms": ms, "GB/s": gbs, "vs_copy": gbs / copy_gbs})

    report(rows, bandwidth_or_call_line(44), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
