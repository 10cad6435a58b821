"""A chain of opforge ops: each custom op's output feeds the next.

    x, residual [batch, seq, hidden]
      -> examples::add_layer_norm(x, residual)       post-norm residual block
      -> matmul, examples::bias_gelu                 feed-forward up-projection, fused bias + GELU
      -> Linear                                      down-projection (plain torch)
      -> examples::rms_norm -> examples::softshrink
      -> examples::identity_conv                     [batch, seq, hidden], float32

``python examples/models/pipeline.py [--device cpu|cuda] [--out DIR]`` exports it with a
dynamic batch dim, AOTInductor-compiles it, runs the package in the C++ runner for batch sizes
3, 1 and 8 and compares every output with the same weights in plain torch, in eager on the CPU
(see ``model_check.main``); exits 1 on a mismatch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_check  # noqa: E402

HIDDEN, FFN, SEQ = 32, 64, 6


class Pipeline(torch.nn.Module):
    """Inputs ``x`` and ``residual``: float32 [batch, seq, hidden]. Output: float32 [batch,
    seq, hidden]. ``plain=True`` computes with plain torch instead of the opforge ops."""

    def __init__(self, hidden: int = HIDDEN, ffn: int = FFN, plain: bool = False):
        super().__init__()
        self.plain = plain
        self.norm_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.norm_bias = torch.nn.Parameter(0.1 * torch.randn(hidden))
        self.up = torch.nn.Linear(hidden, ffn)
        self.down = torch.nn.Linear(ffn, hidden)
        self.rms_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        ops = model_check.ops(self.plain)
        h = ops.add_layer_norm(x, residual, self.norm_weight, self.norm_bias, 1e-5)
        h = ops.bias_gelu(torch.nn.functional.linear(h, self.up.weight), self.up.bias)
        h = ops.rms_norm(self.down(h), self.rms_weight, 1e-6)
        return ops.identity_conv(ops.softshrink(h, 0.3))


def make_model(plain: bool = False, seed: int = 0) -> Pipeline:
    """The model in eval mode, its weights drawn from ``seed`` (the same for either ``plain``)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Pipeline(plain=plain).eval()


def example_inputs(batch: int) -> list[torch.Tensor]:
    """``[x, residual]``, float32 [batch, SEQ, HIDDEN], drawn from a seed made of ``batch``."""
    gen = torch.Generator().manual_seed(1000 + batch)
    return [torch.randn(batch, SEQ, HIDDEN, generator=gen) for _ in range(2)]


_batch = torch.export.Dim("batch", min=1, max=1024)
SPEC = model_check.ModelSpec("pipeline", make_model, example_inputs, dynamic_shapes=({0: _batch}, {0: _batch}))


def main(argv: Sequence[str] | None = None) -> int:
    """Checks the model in the C++ runner (see the module docstring); returns the exit status."""
    return model_check.main(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
