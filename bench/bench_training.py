"""A training step of examples/models/train_amp.py's DigitsMLP with opforge ops against the same
model in torch's ops, in eager mode and with the model under torch.compile, in the same process.

A step is forward and loss under ``torch.autocast(bfloat16)``, backward and an AdamW update, on
random inputs; batch 64 (train_amp's, bound by per-call host cost) and 4096 rows with a hidden
size of 1024 (bound by the kernels). Times are medians of triton.testing.do_bench.

    python3 bench/bench_training.py [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from common import median_ms, report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
import train_amp  # noqa: E402


def step_fn(model: torch.nn.Module, compiled: bool, x: torch.Tensor, y: torch.Tensor):
    forward = torch.compile(model, fullgraph=True) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for lib in ("bias_gelu", "rms_norm", "softshrink"):
        train_amp.opforge.load_library(train_amp.opforge.example_library(lib))
    rows = []
    for batch, hidden in ((64, train_amp.HIDDEN), (4096, 1024)):
        torch.manual_seed(0)
        init = train_amp.DigitsMLP(train_amp.Ops(True), hidden).state_dict()
        x = torch.rand(batch, train_amp.FEATURES, device="cuda")
        y = torch.randint(0, train_amp.CLASSES, (batch,), device="cuda")
        group = f"training step, batch {batch}, hidden {hidden}, autocast bfloat16"
        times = {}
        for compiled in (False, True):
            for use_opforge in (True, False):
                model = train_amp.DigitsMLP(train_amp.Ops(use_opforge), hidden).cuda()
                model.load_state_dict(init)
                step = step_fn(model, compiled, x, y)
                for _ in range(3):  # compile, and the optimizer's state
                    step()
                name = f"{'opforge ops' if use_opforge else 'torch ops'}, {'compiled' if compiled else 'eager'}"
                times[name] = median_ms(step)
        for mode in ("eager", "compiled"):
            ours, theirs = times[f"opforge ops, {mode}"], times[f"torch ops, {mode}"]
            rows.append({"group": group, "impl": f"opforge ops, {mode}", "ms": ours, "vs_torch_ops": theirs / ours})
            rows.append({"group": group, "impl": f"torch ops, {mode}", "ms": theirs, "vs_torch_ops": 1.0})
    report(
        rows, lambda r: f"{r['impl']:<24} {r['ms']:8.3f} ms  {r['vs_torch_ops']:.2f} x the torch-ops step", args.json
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
