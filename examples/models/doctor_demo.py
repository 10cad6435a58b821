"""opforge doctor on a model whose activation runs on the host, before and after the fix.

The model is research code as it is often written: an MLP whose Mish activation is computed with
NumPy (the tensor goes to the host and back at every layer) and whose forward checks for
non-finite values with ``if not torch.isfinite(h).all(): raise``, which makes the host wait for
the GPU and splits the compiled graph. ``opforge doctor`` finds both and prints the command for
an op at the shape and dtype the layer is called with; ``examples/models/doctor_demo/mish/`` is
that scaffold (``opforge new demo::mish ...``) with its math and CUDA kernel written. The fixed
model calls ``torch.ops.demo.mish`` and checks with ``torch._assert_async`` (on the device, no
synchronisation, no graph break). Doctor runs again on it.

    python examples/models/doctor_demo.py [--device cuda|cpu] [--out out/doctor_demo]

Prints both reports, each with the median time of an eager step of its model (the GPU
synchronised around each), and how much faster or slower the fixed model's step is; writes
``<out>/timelines.png`` (the two steps' GPU timelines, one above the other on one time axis),
``<out>/before_trace.json`` and ``<out>/after_trace.json`` (Chrome/Perfetto traces) and
``<out>/results.json``. Exits 1 unless the fixed model gives the same
output as the original, doctor finds the graph break in the original (and, on CUDA, its copies
and a GPU idle gap at the activation), and finds no copy, CPU fallback, synchronisation or graph
break in the fixed one, nor an op there without its CUDA kernel, fake kernel or backward.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

import opforge

FOLDER = Path(__file__).resolve().parent / "doctor_demo" / "mish"
HIDDEN, TOKENS, LAYERS = 1024, 4096, 4


class NumpyMish(torch.nn.Module):
    """Mish written with NumPy, as research code does: through host memory."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.detach().cpu().numpy()
        y = y * np.tanh(np.logaddexp(0.0, y))  # softplus(y) = log(1 + e^y)
        return torch.from_numpy(y).to(x.device)


class OpforgeMish(torch.nn.Module):
    """The same activation as the opforge op demo::mish."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.demo.mish(x)


class Block(torch.nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.up = torch.nn.Linear(HIDDEN, HIDDEN)
        self.act = OpforgeMish() if fixed else NumpyMish()
        self.down = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.up(x))
        if self.fixed:
            torch._assert_async(torch.isfinite(h).all(), "non-finite activation")
        elif not torch.isfinite(h).all():
            raise FloatingPointError("non-finite activation")
        return x + self.down(h)


class Model(torch.nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(fixed) for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def comparison(before_ms: float, after_ms: float) -> str:
    """One line comparing the eager steps of the two models, the ratio stated the way it goes:
    "... the fixed model is 279.0 x faster", "... is 1.3 x slower", or "... about as fast" when the
    ratio rounds to 1.0."""
    ratio = before_ms / after_ms
    if f"{ratio:.1f}" == "1.0" or f"{1 / ratio:.1f}" == "1.0":
        verdict = "about as fast"
    elif ratio > 1:
        verdict = f"{ratio:.1f} x faster"
    else:
        verdict = f"{1 / ratio:.1f} x slower"
    return f"eager step: before {before_ms:.2f} ms, after {after_ms:.2f} ms: the fixed model is {verdict}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="out/doctor_demo")
    parser.add_argument("--tokens", type=int, default=TOKENS)
    args = parser.parse_args(argv)
    if (problem := opforge.missing_device(args.device)) is not None:
        parser.exit(2, f"{parser.prog}: {problem}\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:  # the plot at the end needs matplotlib: say so before the minute of work
        plot = opforge.checked_plot_file(out / "timelines.png")
    except ImportError as e:
        parser.exit(2, f"{parser.prog}: {e}\n")
    opforge.load_library(opforge.build_library("mish", folder=FOLDER, build_dir=opforge.build_dir() / "doctor_demo"))

    torch.manual_seed(0)
    before = Model(fixed=False).to(args.device)
    after = Model(fixed=True).to(args.device)
    after.load_state_dict(before.state_dict())
    x = torch.randn(args.tokens, HIDDEN, device=args.device)
    with torch.no_grad():
        torch.testing.assert_close(after(x), before(x), atol=1e-4, rtol=1e-4)

    reports = {}
    for name, model in (("before", before), ("after", after)):
        reports[name] = opforge.doctor(model, x, trace=out / f"{name}_trace.json")
        reports[name].print_table()
    times = {name: r.step_ms for name, r in reports.items()}  # the step times the tables show
    print(comparison(times["before"], times["after"]))
    if args.device == "cpu":
        print(
            "on the CPU demo::mish runs its CPU reference (a loop in double, written to be exact, not fast): "
            "the speed-up this demo shows is a CUDA model's"
        )
    opforge.plot_timelines({f"{name} ({args.device})": r for name, r in reports.items()}, plot)

    kinds = {name: {f.kind for f in r.findings} for name, r in reports.items()}
    expected_before = {"graph_break"} | ({"copy", "gpu_idle", "sync"} if args.device == "cuda" else set())
    problems = [f"doctor missed {k} in the original model" for k in sorted(expected_before - kinds["before"])]
    fixed = {"copy", "cpu_fallback", "sync", "graph_break", "compile_error"}  # and missing_*: demo::mish's parts
    problems += [
        f"doctor still finds {k} in the fixed model"
        for k in sorted(kinds["after"])
        if k in fixed or k.startswith("missing_")
    ]
    results = {
        "device": args.device,
        "tokens": args.tokens,
        "step_ms": times,
        "speedup": times["before"] / times["after"],
        "findings": {name: r.to_dict()["findings"] for name, r in reports.items()},
        "problems": problems,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {out / 'timelines.png'}, {out / 'before_trace.json'}, {out / 'after_trace.json'}")
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
