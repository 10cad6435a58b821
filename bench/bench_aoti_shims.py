"""Per-op cost of opforge ops in an AOTInductor package: called through generated C shims
(``opforge.aoti.package(..., c_shims=True)``, Note [AOTInductor C shims]) against AOTInductor's
proxy executor (the default), and against the same chain of torch's own ops compiled by
AOTInductor without custom ops (what a user would package instead), all run by ``opforge-runner``.

    python3 bench/bench_aoti_shims.py [--device cpu|cuda] [--ops 64] [--repeats 5] [--json out.json]

The model is a chain of ``--ops`` softshrink calls on 16 float32 elements, so a run is the
per-call cost of the ops (the kernels do next to nothing); torch's chain is
``torch.nn.functional.softshrink``, which Inductor fuses into one kernel, so its row is the floor
of a package that runs no custom op at all, not a like-for-like call. Latency: the runner's
median wall time per model run (``AOTIModelPackageLoader::run`` plus a device synchronisation)
over 2000 runs, each package run ``--repeats`` times in fresh runner processes; the table gives
the median of those medians and their spread (min-max).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from common import report

import opforge
from opforge import aoti


class Chain(torch.nn.Module):
    def __init__(self, n: int, native: bool):
        super().__init__()
        self.n, self.native = n, native

    def forward(self, x):
        for _ in range(self.n):
            x = F.softshrink(x, 0.01) if self.native else torch.ops.examples.softshrink(x, 0.01)
        return x


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ops", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("softshrink"))
    x = torch.randn(16, device=args.device)
    rows = []
    group = f"{args.ops} softshrink calls on 16 float32, {args.device}, per model run"
    with tempfile.TemporaryDirectory() as tmp:
        variants = [
            ("opforge ops, C shims", False, True),
            ("opforge ops, proxy executor", False, False),
            ("torch ops (F.softshrink), no custom ops", True, False),
        ]
        for name, native, shims in variants:
            program = torch.export.export(Chain(args.ops, native).to(args.device).eval(), (x,))
            pt2 = aoti.package(program, Path(tmp) / name.replace(" ", "_"), c_shims=shims, archs=[])
            medians = [
                aoti.run(pt2, [x], device=args.device, warmup=200, iters=2000).latency_ms["median"]
                for _ in range(args.repeats)
            ]
            rows.append(
                {
                    "group": group,
                    "impl": name,
                    "us": 1000 * statistics.median(medians),
                    "us_min": 1000 * min(medians),
                    "us_max": 1000 * max(medians),
                }
            )
    proxy = next(r["us"] for r in rows if r["impl"] == "opforge ops, proxy executor")
    for r in rows:
        r["per_op_us"] = r["us"] / args.ops
        r["vs_proxy"] = proxy / r["us"]

    def line(r: dict) -> str:
        return (
            f"{r['impl']:<42} {r['us']:9.1f} us/run ({r['us_min']:.1f}-{r['us_max']:.1f})  "
            f"{r['per_op_us']:6.2f} us/op  {r['vs_proxy']:.2f} x the proxy executor's speed"
        )

    report(rows, line, args.json, {"ops": args.ops, "device": args.device})
    return 0


if __name__ == "__main__":
    sys.exit(main())
