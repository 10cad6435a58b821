"""A feed-forward block in which ops whose kernels are Triton functions (Liger-Kernel's RMSNorm,
SwiGLU and softmax, ``examples/ops/liger``), ops with CUDA C++ kernels and standard torch
modules sit side by side.

    x, residual [batch, seq, hidden]
      -> examples::add_layer_norm(x, residual)           CUDA C++ (compiled at run time)
      -> examples::liger_rms_norm                        Triton (Liger's _rms_norm_forward_kernel)
      -> gate, up: Linear                                torch
      -> examples::liger_swiglu(gate, up) -> Linear      Triton (Liger's _swiglu_forward_kernel), torch
      -> + the add_layer_norm output                     the block's output h [batch, seq, hidden]
      -> matmul, examples::bias_gelu                     torch, CUDA C++
      -> examples::liger_softmax                         Triton (Liger's softmax): probs [batch, seq, classes]

``python examples/models/liger_block.py [--device cpu|cuda] [--out DIR]`` exports it with a
dynamic batch dim, AOTInductor-compiles it, runs the package in the C++ runner for batch sizes
3, 1 and 8 and compares both outputs with the same weights in plain torch, in eager on the CPU
(see ``model_check.main``); exits 1 on a mismatch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_check  # noqa: E402

HIDDEN, FFN, SEQ, CLASSES = 32, 64, 6, 10
EPS = 1e-6


class TorchOps(model_check.TorchOps):
    """The example ops in plain torch, with Liger's (each op's ``.equivalent()`` in
    ``examples/ops/liger/liger.cpp``)."""

    @staticmethod
    def liger_rms_norm(x, weight, eps=1e-6, offset=0.0, casting_mode="llama"):
        rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        return x * rstd * (offset + weight), rstd.float()

    @staticmethod
    def liger_swiglu(a, b, gate_multiplier=1.0):
        return F.silu(a * gate_multiplier) * b

    @staticmethod
    def liger_softmax(x):
        return torch.softmax(x, -1)


class LigerBlock(torch.nn.Module):
    """Inputs ``x`` and ``residual``: float32 [batch, seq, hidden]. Outputs: ``h`` float32
    [batch, seq, hidden] and ``probs`` float32 [batch, seq, classes]. ``plain=True`` computes
    with plain torch instead of the opforge ops."""

    def __init__(self, hidden: int = HIDDEN, ffn: int = FFN, classes: int = CLASSES, plain: bool = False):
        super().__init__()
        self.plain = plain
        self.norm_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.norm_bias = torch.nn.Parameter(0.1 * torch.randn(hidden))
        self.rms_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.gate = torch.nn.Linear(hidden, ffn, bias=False)
        self.up = torch.nn.Linear(hidden, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, hidden, bias=False)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ops = TorchOps if self.plain else torch.ops.examples
        h = ops.add_layer_norm(x, residual, self.norm_weight, self.norm_bias, 1e-5)
        n, _ = ops.liger_rms_norm(h, self.rms_weight, EPS)
        h = h + self.down(ops.liger_swiglu(self.gate(n), self.up(n)))
        logits = ops.bias_gelu(F.linear(h, self.head.weight), self.head.bias)
        return h, ops.liger_softmax(logits)


def make_model(plain: bool = False, seed: int = 0) -> LigerBlock:
    """The model in eval mode, its weights drawn from ``seed`` (the same for either ``plain``)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LigerBlock(plain=plain).eval()


def example_inputs(batch: int) -> list[torch.Tensor]:
    """``[x, residual]``, float32 [batch, SEQ, HIDDEN], drawn from a seed made of ``batch``."""
    gen = torch.Generator().manual_seed(3000 + batch)
    return [torch.randn(batch, SEQ, HIDDEN, generator=gen) for _ in range(2)]


_batch = torch.export.Dim("batch", min=1, max=1024)
SPEC = model_check.ModelSpec(
    "liger_block",
    make_model,
    example_inputs,
    dynamic_shapes=({0: _batch}, {0: _batch}),
    ops=("add_layer_norm", "bias_gelu", "liger"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Checks the model in the C++ runner (see the module docstring); returns the exit status."""
    return model_check.main(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
