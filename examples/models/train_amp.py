"""Mixed-precision training with opforge ops, side by side with the same model in torch's ops.

A 7-layer MLP classifies scikit-learn's bundled handwritten digits (``load_digits``: 1797 8x8
images, 10 classes; shipped with the package, no download). Its activations and norms are
opforge ops: ``examples::bias_gelu`` (the Linear layers' bias added inside the activation),
``examples::rms_norm`` (float32 weight) and ``examples::softshrink``; the twin model computes the
same with ``F.gelu(x + bias)``, ``F.rms_norm`` in float32 and ``F.softshrink``, from the same
initial weights and the same batches. Both train under ``torch.autocast`` in bfloat16, and in
float16 with ``torch.amp.GradScaler``, in eager mode and with the model under ``torch.compile``
(its backward graph built by AOTAutograd from the ops' backward ops).

    python examples/models/train_amp.py --device cuda [--epochs 30] [--out out/train_amp] [--no-compile]

Says first what it will run, then prints a line as each run ends (on a terminal, a progress bar
over the epochs runs meanwhile). Writes ``<out>/loss.png`` (the loss curves of every run) and
``<out>/results.json``; exits 1 unless, for each precision and mode, the opforge model's per-epoch
training loss stays within ``LOSS_TOLERANCE`` of the torch model's and its test accuracy within
``ACCURACY_TOLERANCE``; exits 2 on a device this machine does not have (``--device cuda`` without a
GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch._functorch.config
import torch.nn.functional as F

import opforge

#: Largest |loss_opforge - loss_torch| over the epochs' mean training losses (cross-entropy,
#: nats): both models round differently inside the activations and norms (the opforge ops
#: compute in float32 and round once), so the runs drift apart by the noise of 16-bit training.
LOSS_TOLERANCE = 0.05
#: Largest difference of the final test accuracies (a fraction: 0.02 is 7 of 360 test images).
ACCURACY_TOLERANCE = 0.02
HIDDEN, CLASSES, FEATURES = 256, 10, 64


class Ops:
    """The activations and norm the model uses, as opforge ops or as torch expressions."""

    def __init__(self, use_opforge: bool):
        self.use_opforge = use_opforge

    def bias_gelu(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if self.use_opforge:
            return torch.ops.examples.bias_gelu(x, bias)  # under autocast: promoted to float32
        return F.gelu(x + bias)  # bfloat16 + float32 promotes to float32 as well

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.use_opforge:
            return torch.ops.examples.rms_norm(x, weight, 1e-6)  # float32 weight beside 16-bit x
        return F.rms_norm(x.float(), (x.shape[-1],), weight, 1e-6).to(x.dtype)

    def softshrink(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_opforge:
            return torch.ops.examples.softshrink(x, 0.1)
        return F.softshrink(x, 0.1)


class DigitsMLP(torch.nn.Module):
    """Input: float32 [batch, 64] (pixels scaled to [0, 1]); output: logits [batch, 10]; hidden
    layers of `hidden` features. Seven
    Linear layers, the five hidden ones residual, alternating a norm block and an activation:

        h = bias_gelu(W0 x, b0)
        k = 1, 3, 5: h = h + softshrink(rms_norm(Wk h, gk))
        k = 2, 4:    h = h + bias_gelu(Wk h, bk)
        logits = W6 h + b6

    The same parameter names with either Ops, so one state_dict initialises both."""

    def __init__(self, ops: Ops, hidden: int = HIDDEN):
        super().__init__()
        self.ops = ops
        self.inp = torch.nn.Linear(FEATURES, hidden, bias=False)
        self.inp_bias = torch.nn.Parameter(torch.zeros(hidden))
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, bias=False) for _ in range(5))
        # rms_norm weights (ones) for the norm blocks, biases (zeros) for the activation blocks
        self.hidden_param = torch.nn.ParameterList(
            torch.nn.Parameter(torch.ones(hidden) if k % 2 == 0 else torch.zeros(hidden)) for k in range(5)
        )
        self.out = torch.nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ops.bias_gelu(self.inp(x), self.inp_bias)
        for k, (linear, p) in enumerate(zip(self.hidden, self.hidden_param)):
            z = linear(h)
            h = h + (self.ops.softshrink(self.ops.rms_norm(z, p)) if k % 2 == 0 else self.ops.bias_gelu(z, p))
        return self.out(h)


def load_digits(device: str):
    """(train x, train y, test x, test y): an 80/20 split with a fixed seed; x float32 [n, 64]."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    data = sklearn_digits()
    xtr, xte, ytr, yte = train_test_split(
        data.data / 16.0, data.target, test_size=0.2, random_state=0, stratify=data.target
    )

    def t(a, dtype):
        return torch.tensor(a, dtype=dtype, device=device)

    return t(xtr, torch.float32), t(ytr, torch.int64), t(xte, torch.float32), t(yte, torch.int64)


@dataclass
class Run:
    """One training run: per-epoch mean training loss, final test accuracy, and the mean wall
    time of a step (forward, backward, optimizer; synchronised on CUDA) after the first epoch."""

    model: str
    precision: str
    mode: str
    losses: list[float] = field(default_factory=list)
    accuracy: float = 0.0
    ms_per_step: float = 0.0


def train(
    use_opforge: bool,
    precision: str,
    compiled: bool,
    init: dict,
    data,
    device: str,
    epochs: int,
    batch: int,
    on_epoch: Callable[[], None] = lambda: None,
) -> Run:
    """Trains a DigitsMLP from `init` under autocast(`precision`); float16 uses a GradScaler.
    Batches come in the same order for every run (a generator with a fixed seed); the last
    partial batch of an epoch is dropped so compiled code sees one shape. `on_epoch` is called
    after each epoch."""
    xtr, ytr, xte, yte = data
    model = DigitsMLP(Ops(use_opforge)).to(device)
    model.load_state_dict(init)
    forward = torch.compile(model, fullgraph=True) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    steps_per_epoch = len(xtr) // batch
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    dtype = getattr(torch, precision)
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    run = Run("opforge" if use_opforge else "torch", precision, "compiled" if compiled else "eager")
    order = torch.Generator().manual_seed(0)
    steps, step_time = 0, 0.0
    for epoch in range(epochs):
        perm = torch.randperm(len(xtr), generator=order).to(device)
        total, count = torch.zeros((), device=device), 0
        for i in range(0, len(xtr) - batch + 1, batch):
            idx = perm[i : i + batch]
            t0 = time.perf_counter()
            with torch.autocast(device, dtype=dtype):
                logits = forward(xtr[idx])
                loss = F.cross_entropy(logits, ytr[idx])
            if logits.dtype != dtype:  # the output Linear runs in the autocast dtype
                raise RuntimeError(f"{run.model} {run.mode}: logits in {logits.dtype} under autocast({precision})")
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() >= scale:  # a step the scaler skipped (inf gradients) leaves the schedule alone
                schedule.step()
            if device == "cuda":
                torch.cuda.synchronize()
            if epoch > 0 or epochs == 1:  # the first epoch's steps include compilation
                step_time += time.perf_counter() - t0
                steps += 1
            total += loss.detach().float()
            count += 1
        run.losses.append(float(total) / count)
        on_epoch()
    with torch.no_grad(), torch.autocast(device, dtype=dtype):
        run.accuracy = float((model(xte).argmax(-1) == yte).float().mean())
    run.ms_per_step = 1e3 * step_time / max(steps, 1)
    return run


def compare(runs: list[Run]) -> list[str]:
    """One line per opforge/torch pair of the same precision and mode, with the largest loss
    difference and the accuracy difference, prefixed FAIL where a tolerance is exceeded."""
    lines = []
    by_key = {(r.model, r.precision, r.mode): r for r in runs}
    for (model, precision, mode), ours in by_key.items():
        if model != "opforge":
            continue
        ref = by_key[("torch", precision, mode)]
        dloss = max(abs(a - b) for a, b in zip(ours.losses, ref.losses))
        dacc = abs(ours.accuracy - ref.accuracy)
        ok = dloss <= LOSS_TOLERANCE and dacc <= ACCURACY_TOLERANCE
        lines.append(
            f"{'ok  ' if ok else 'FAIL'} {precision:<8} {mode:<8} max |loss difference| {dloss:.4f} "
            f"(<= {LOSS_TOLERANCE}), accuracy opforge {ours.accuracy:.4f} torch {ref.accuracy:.4f} "
            f"(difference <= {ACCURACY_TOLERANCE}), ms/step opforge {ours.ms_per_step:.2f} torch {ref.ms_per_step:.2f}"
        )
    return lines


def plot(runs: list[Run], path: Path) -> None:
    """Loss curves, one panel per precision, opforge solid and torch dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    precisions = sorted({r.precision for r in runs})
    fig, axes = plt.subplots(1, len(precisions), figsize=(6 * len(precisions), 4), squeeze=False)
    for ax, precision in zip(axes[0], precisions):
        for r in (r for r in runs if r.precision == precision):
            ax.plot(
                range(1, len(r.losses) + 1),
                r.losses,
                linestyle="-" if r.model == "opforge" else "--",
                label=f"{r.model} {r.mode} (test accuracy {r.accuracy:.3f})",
            )
        scaler = " + GradScaler" if precision == "float16" else ""
        ax.set(title=f"autocast {precision}{scaler}", xlabel="epoch", ylabel="mean training loss", yscale="log")
        ax.legend()
    fig.suptitle("DigitsMLP on load_digits: opforge ops against torch ops")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@contextlib.contextmanager
def epochs_bar(total: int) -> Iterator[Callable[[str], Callable[[], None]]]:
    """On a terminal (standard error), a progress bar over `total` epochs; yields a function that
    names the run in progress and returns the callback that advances the bar by one epoch.
    Elsewhere nothing is drawn."""
    if not sys.stderr.isatty():
        yield lambda name: lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("epochs", total=total)

        def start(name: str) -> Callable[[], None]:
            bar.update(task, description=name)
            return lambda: bar.advance(task)

        yield start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", nargs="+", default=["bfloat16", "float16"], choices=["bfloat16", "float16"])
    parser.add_argument("--no-compile", action="store_true", help="eager runs only")
    parser.add_argument("--out", type=Path, default=Path("out/train_amp"))
    args = parser.parse_args(argv)
    if (problem := opforge.missing_device(args.device)) is not None:
        parser.exit(2, f"{parser.prog}: {problem}\n")
    for lib in ("bias_gelu", "rms_norm", "softshrink"):
        opforge.load_library(opforge.example_library(lib))
    # torch 2.11 keys its AOTAutograd cache on whether autocast is enabled, not on its dtype
    # (pytorch/pytorch#181564, fixed after 2.11): a model compiled under bfloat16 autocast can
    # be served the bfloat16 graph under float16 as well, in this process and in later ones
    # sharing the on-disk cache. Each precision here compiles the same graph, so the cache is off.
    torch._functorch.config.enable_autograd_cache = False
    torch.manual_seed(0)
    init = DigitsMLP(Ops(True)).state_dict()
    data = load_digits(args.device)
    modes = [False] if args.no_compile else [False, True]
    plan = [(p, c, u) for p in args.precision for c in modes for u in (True, False)]
    print(
        f"{len(plan)} training runs of {args.epochs} epochs on {args.device} ({' and '.join(args.precision)}; "
        f"{'eager' if args.no_compile else 'eager and compiled, a compiled run compiling first'}; "
        "opforge and torch ops), a line as each ends:",
        flush=True,
    )
    runs = []
    with epochs_bar(len(plan) * args.epochs) as start:
        for precision, compiled, use_opforge in plan:
            name = f"{'opforge' if use_opforge else 'torch'} {precision} {'compiled' if compiled else 'eager'}"
            run = train(use_opforge, precision, compiled, init, data, args.device, args.epochs, args.batch, start(name))
            print(
                f"{run.model:<8} {run.precision:<8} {run.mode:<8} loss {run.losses[0]:.3f} -> "
                f"{run.losses[-1]:.4f}, test accuracy {run.accuracy:.4f}, {run.ms_per_step:.2f} ms/step",
                flush=True,
            )
            runs.append(run)
    lines = compare(runs)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(runs, args.out / "loss.png")
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "device": args.device,
                "epochs": args.epochs,
                "batch": args.batch,
                "loss_tolerance": LOSS_TOLERANCE,
                "accuracy_tolerance": ACCURACY_TOLERANCE,
                "runs": [asdict(r) for r in runs],
            },
            indent=2,
        )
    )
    print(f"wrote {args.out / 'loss.png'} and {args.out / 'results.json'}")
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
