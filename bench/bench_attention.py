"""``examples::attention`` and its backward against ``torch.nn.functional.scaled_dot_product_attention``.

bf16 (or fp16: --dtype), batch 8, 16 heads, sequence 4096, head dim 128 (and 64), causal and not, in the same
process: opforge's kernels against SDPA as a user calls it (torch picks the backend) and
against each SDPA backend forced (flash, cuDNN, memory-efficient), so the table shows which
kernel the default is. The backward pass is timed the same way for both: torch.autograd.grad of
q, k and v from a retained forward graph (only the backward kernels run).

    python3 bench/bench_attention.py [--batch 8] [--heads 16] [--seq 4096] [--pass forward|backward|both]
                                     [--dtype bfloat16|float16] [--head-dims 128 64] [--no-backends]
                                     [--sweep] [--json out.json]

--sweep times every sequence length of SWEEP_SEQS at the token count batch x seq (by default
32768 tokens: batch 64 at 512 down to batch 2 at 16384) instead of the one shape.
--no-backends leaves out the forced SDPA backends (SDPA as a user calls it stays the baseline),
for quick runs while a kernel is being changed.

FLOPs: forward 4 * batch * heads * seq^2 * head_dim (two matmuls), backward 2.5 times that
(five matmuls; FlashAttention-2's convention, which leaves out the recomputation), halved for
causal; TFLOP/s from medians of triton.testing.do_bench (CUDA events), inputs random.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F
from common import median_ms, report
from torch.nn.attention import SDPBackend, sdpa_kernel

import opforge

#: Sequence lengths of --sweep, each at batch x seq tokens.
SWEEP_SEQS = (512, 1024, 2048, 4096, 8192, 16384)

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def timings(run_forward, q, k, v, grad_o, backward: bool) -> float:
    """Median ms of `run_forward(q, k, v)`, or with ``backward`` of the gradients of q, k, v from
    one retained forward graph."""
    if not backward:
        return median_ms(lambda: run_forward(q, k, v))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = run_forward(*leaves)
    return median_ms(lambda: torch.autograd.grad(out, leaves, grad_o, retain_graph=True))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--pass", dest="passes", choices=("forward", "backward", "both"), default="both")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--head-dims", type=int, nargs="+", choices=(32, 64, 128), default=[128, 64])
    parser.add_argument("--no-backends", action="store_true", help="only opforge and SDPA's default backend")
    parser.add_argument("--sweep", action="store_true", help="every length of SWEEP_SEQS at batch x seq tokens")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("attention"))
    dtype = getattr(torch, args.dtype)
    rows = []
    tokens = args.batch * args.seq
    shapes = [(tokens // seq, seq) for seq in SWEEP_SEQS if seq <= tokens] if args.sweep else [(args.batch, args.seq)]
    for backward, head_dim, causal, (batch, seq) in itertools.product(
        {"forward": (False,), "backward": (True,), "both": (False, True)}[args.passes],
        args.head_dims,
        (False, True),
        shapes,
    ):
        q, k, v, grad_o = (torch.randn(batch, args.heads, seq, head_dim, device="cuda", dtype=dtype) for _ in range(4))
        flops = 4 * batch * args.heads * seq**2 * head_dim / (2 if causal else 1)
        flops *= 2.5 if backward else 1
        group = (
            f"{'backward' if backward else 'forward'} {args.dtype} [{batch}, {args.heads}, {seq}, "
            f"{head_dim}] {'causal' if causal else 'non-causal'}"
        )

        def sdpa_forward(q, k, v, causal=causal):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def opforge_forward(q, k, v, causal=causal, head_dim=head_dim):
            return torch.ops.examples.attention(q, k, v, head_dim, causal=causal)[0]

        sdpa = timings(sdpa_forward, q, k, v, grad_o, backward)
        impls = [
            ("opforge examples::attention", timings(opforge_forward, q, k, v, grad_o, backward)),
            ("torch SDPA (default backend)", sdpa),
        ]
        for name, backend in ({} if args.no_backends else BACKENDS).items():
            try:
                with sdpa_kernel(backend):
                    impls.append((f"torch SDPA, {name} backend", timings(sdpa_forward, q, k, v, grad_o, backward)))
            except RuntimeError as e:  # a backend that does not take these inputs
                print(f"{group}: SDPA {name} backend unavailable: {str(e).splitlines()[0]}", file=sys.stderr)
        for name, ms in impls:
            rows.append({"group": group, "impl": name, "ms": ms, "TFLOP/s": flops / ms / 1e9, "vs_sdpa": sdpa / ms})
        del q, k, v, grad_o

    report(
        rows,
        lambda r: f"{r['impl']:<34} {r['ms']:8.3f} ms {r['TFLOP/s']:7.1f} TFLOP/s  {r['vs_sdpa']:.3f} x SDPA",
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
