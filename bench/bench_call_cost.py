"""Per-call host cost of an opforge op against torch's own: issue 46's target 4.

    python3 bench/bench_call_cost.py [--rounds 21] [--calls 5000] [--json out.json]

Times ``torch.ops.examples.softshrink.default(x, 0.5)`` against
``torch.ops.aten.softshrink.default(x, 0.5)`` and against the same op written by hand with
``TORCH_LIBRARY`` (``torch_library_softshrink/``, built with ``torch.utils.cpp_extension.load``:
what a kernel author registers without opforge), all three through the dispatcher's Python
binding, on 4096 float32 on CUDA (when there is a GPU) and 16 float32 on the CPU, where the
kernels' own work is negligible and what is measured is the host's part: argument parsing,
dispatch, checks, the output's allocation, the launch. A custom op (any namespace but aten) pays
more than aten's own in torch's Python binding (its namespace and name are looked up under a lock
on every call), so the hand-written op is the floor a custom op starts from.

Host wall time per call, in microseconds: each round runs ``--calls`` calls back to back, then
one synchronisation; rounds of the three ops alternate (aten, opforge, hand-written, aten, ...),
so that a change in the machine's load reaches each, and each op's figure is the median of its
rounds. The cost ratio is opforge's time over aten's (lower is better; the target is <= 0.9),
with the spread of the per-round ratios (their lowest and highest); the hand-written op's ratio
to aten's is printed beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import report

import opforge


def round_us(fn: Callable[[], object], calls: int, sync: bool) -> float:
    """Host wall time per call of ``fn`` over ``calls`` calls, in microseconds (the GPU
    synchronised before and after when ``sync``)."""
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def alternating(fns: list[Callable[[], object]], rounds: int, calls: int, sync: bool) -> list[list[float]]:
    """Per-round times (us per call) of each of ``fns``, their rounds alternating, after one
    warm-up round of each."""
    for fn in fns:
        round_us(fn, calls, sync)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, t in zip(fns, times):
            t.append(round_us(fn, calls, sync))
    return times


def load_handwritten(cuda: bool) -> None:
    """Builds (cached by torch.utils.cpp_extension) and loads the hand-written ``handwritten::softshrink``."""
    from torch.utils.cpp_extension import load

    folder = Path(__file__).resolve().parent / "torch_library_softshrink"
    sources = [folder / "softshrink.cpp"] + ([folder / "softshrink.cu"] if cuda else [])
    load(
        name="handwritten_softshrink_cuda" if cuda else "handwritten_softshrink",
        sources=[str(s) for s in sources],
        extra_cflags=["-O2"] + (["-DWITH_CUDA"] if cuda else []),
        with_cuda=cuda,
        is_python_module=False,
        verbose=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21, help="rounds of each op (odd: a true median)")
    parser.add_argument("--calls", type=int, default=5000, help="calls per round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("softshrink"))
    load_handwritten(torch.cuda.is_available())
    cases = [("cpu", 16)]
    if torch.cuda.is_available():
        cases.insert(0, ("cuda", 4096))
    rows = []
    for device, numel in cases:
        x = torch.randn(numel, device=device)

        def aten(x=x):
            return torch.ops.aten.softshrink.default(x, 0.5)

        def ours(x=x):
            return torch.ops.examples.softshrink.default(x, 0.5)

        def handwritten(x=x):
            return torch.ops.handwritten.softshrink.default(x, 0.5)

        torch.testing.assert_close(ours(), aten())
        torch.testing.assert_close(handwritten(), aten())
        a, o, h = alternating([aten, ours, handwritten], args.rounds, args.calls, sync=device == "cuda")
        pairs = [oi / ai for ai, oi in zip(a, o)]
        aten_us, ours_us, hand_us = statistics.median(a), statistics.median(o), statistics.median(h)
        rows.append(
            {
                "group": f"per-call host cost, {numel} float32 on {device} ({args.rounds} alternating rounds of "
                f"{args.calls} calls, medians)",
                "aten_us": aten_us,
                "opforge_us": ours_us,
                "handwritten_us": hand_us,
                "cost_ratio": ours_us / aten_us,
                "handwritten_ratio": hand_us / aten_us,
                "pair_ratio_min": min(pairs),
                "pair_ratio_max": max(pairs),
            }
        )

    def line(r: dict) -> str:
        return (
            f"aten::softshrink {r['aten_us']:.3f} us/call, examples::softshrink {r['opforge_us']:.3f} us/call: "
            f"cost ratio {r['cost_ratio']:.3f} (round pairs {r['pair_ratio_min']:.3f}-{r['pair_ratio_max']:.3f}; "
            "target <= 0.9)\n"
            f"  hand-written TORCH_LIBRARY op {r['handwritten_us']:.3f} us/call: "
            f"{r['handwritten_ratio']:.3f} x aten's, opforge {r['opforge_us'] / r['handwritten_us']:.3f} x its"
        )

    report(rows, line, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
