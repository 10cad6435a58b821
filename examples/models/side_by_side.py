"""Several opforge ops side by side with standard torch modules: two branches over a
[batch, channels, length] signal, merged.

    x [batch, channels, length]
      conv branch:     Conv1d -> transpose -> matmul -> examples::bias_gelu
      sequence branch: examples::identity_conv(x.transpose(1, 2))   a permuted view, read
                       with its strides -> examples::rms_norm -> Linear -> examples::softshrink
      merge:           examples::add_layer_norm(conv, sequence)     tokens [batch, length, hidden]
      head:            mean over length -> Linear -> GELU -> Linear logits [batch, classes]

``python examples/models/side_by_side.py [--device cpu|cuda] [--out DIR]`` exports it with a
dynamic batch dim, AOTInductor-compiles it, runs the package in the C++ runner for batch sizes
3, 1 and 8 and compares both outputs with the same weights in plain torch, in eager on the CPU
(see ``model_check.main``); exits 1 on a mismatch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_check  # noqa: E402

CHANNELS, LENGTH, HIDDEN, CLASSES = 8, 12, 32, 5


class SideBySide(torch.nn.Module):
    """Input ``x``: float32 [batch, channels, length]. Outputs: ``tokens`` float32 [batch,
    length, hidden] and ``logits`` float32 [batch, classes]. ``plain=True`` computes with plain
    torch instead of the opforge ops."""

    def __init__(self, channels: int = CHANNELS, hidden: int = HIDDEN, classes: int = CLASSES, plain: bool = False):
        super().__init__()
        self.plain = plain
        self.conv = torch.nn.Conv1d(channels, hidden, kernel_size=3, padding=1)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.rms_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(channels))
        self.seq = torch.nn.Linear(channels, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.add_(0.1 * torch.randn(hidden))
            self.norm.bias.add_(0.1 * torch.randn(hidden))
        self.head = torch.nn.Sequential(
            torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, classes)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ops = model_check.ops(self.plain)
        conv = self.conv(x).transpose(1, 2)  # [batch, length, hidden]
        conv = ops.bias_gelu(torch.nn.functional.linear(conv, self.proj.weight), self.proj.bias)
        seq = ops.identity_conv(x.transpose(1, 2))  # [batch, length, channels], dense
        seq = ops.softshrink(self.seq(ops.rms_norm(seq, self.rms_weight, 1e-6)), 0.1)
        tokens = ops.add_layer_norm(conv, seq, self.norm.weight, self.norm.bias, self.norm.eps)
        return tokens, self.head(tokens.mean(1))


def make_model(plain: bool = False, seed: int = 0) -> SideBySide:
    """The model in eval mode, its weights drawn from ``seed`` (the same for either ``plain``)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return SideBySide(plain=plain).eval()


def example_inputs(batch: int) -> list[torch.Tensor]:
    """``[x]``, float32 [batch, CHANNELS, LENGTH], drawn from a seed made of ``batch``."""
    return [torch.randn(batch, CHANNELS, LENGTH, generator=torch.Generator().manual_seed(2000 + batch))]


SPEC = model_check.ModelSpec(
    "side_by_side", make_model, example_inputs, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},)
)


def main(argv: Sequence[str] | None = None) -> int:
    """Checks the model in the C++ runner (see the module docstring); returns the exit status."""
    return model_check.main(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
