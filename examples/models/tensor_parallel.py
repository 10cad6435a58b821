"""A transformer encoder layer made of opforge ops, tensor-parallel across processes
(Megatron-style), against the same layer in one process.

    torchrun --nproc-per-node 2 examples/models/tensor_parallel.py [--device cpu|cuda]

Each rank holds a slice of the heads and of the feed-forward width: the q, k, v and up
projections are column-parallel, ``examples::attention`` runs on the rank's heads and
``examples::bias_gelu`` on its slice of the feed-forward activations (through the DTensor
sharding rules opforge derives from the op descriptions), the output and down projections are
row-parallel, and ``examples::add_layer_norm`` runs on the reduced, replicated activations.
Every rank compares the result with the layer computed whole, prints the max abs error and
exits 1 on a mismatch. ``--device cuda`` uses NCCL and one GPU per process (cuda:<local rank>);
``cpu`` uses gloo.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import opforge


class EncoderLayer(torch.nn.Module):
    """Post-norm encoder layer: attention with a padding mask, residual + LayerNorm, GELU
    feed-forward, residual + LayerNorm. Input [batch, seq, hidden] and an additive mask
    [batch, seq], float16; output [batch, seq, hidden]."""

    def __init__(self, hidden: int = 256, heads: int = 8, ffn: int = 512):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.up = torch.nn.Linear(hidden, ffn, bias=False)
        self.up_bias = torch.nn.Parameter(0.1 * torch.randn(ffn))
        self.down = torch.nn.Linear(ffn, hidden)
        self.norm1, self.norm2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (p(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        context, _ = torch.ops.examples.attention(q, k, v, self.head_dim, mask)
        context = context.transpose(1, 2).reshape(batch, seq, -1)
        h = torch.ops.examples.add_layer_norm(self.o(context), x, self.norm1.weight, self.norm1.bias, self.norm1.eps)
        f = self.down(torch.ops.examples.bias_gelu(self.up(h), self.up_bias))
        return torch.ops.examples.add_layer_norm(f, h, self.norm2.weight, self.norm2.bias, self.norm2.eps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if (problem := opforge.missing_device(args.device)) is not None:
        parser.exit(2, f"{parser.prog}: {problem}\n")
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(args.device, int(os.environ["LOCAL_RANK"])) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    for op in ("attention", "add_layer_norm", "bias_gelu"):
        opforge.load_library(opforge.example_library(op))
    mesh = init_device_mesh(device.type, (world,))

    torch.manual_seed(0)  # the same weights and inputs on every rank
    layer = EncoderLayer().to(device, torch.float16).eval()
    x = torch.randn(4, 24, 256, device=device, dtype=torch.float16)
    mask = torch.zeros(4, 24, device=device, dtype=torch.float16)
    mask[1, 17:] = mask[3, 5:] = float("-inf")  # padding
    with torch.no_grad():
        expected = layer(x, mask)
        colwise = ColwiseParallel(use_local_output=False)
        parallel = parallelize_module(
            layer,
            mesh,
            {
                "q": colwise,
                "k": colwise,
                "v": colwise,
                "o": RowwiseParallel(),
                "up": colwise,
                "down": RowwiseParallel(),
            },
        )
        parallel.up_bias = torch.nn.Parameter(distribute_tensor(layer.up_bias.detach(), mesh, [Shard(0)]))
        got = parallel(x, distribute_tensor(mask, mesh, [Replicate()]))  # the mask meets DTensor q, k, v
    error = (got.double() - expected.double()).abs().max().item()
    ok = torch.allclose(got, expected, atol=1e-2, rtol=1e-2)
    print(
        f"rank {rank}/{world} on {device}: tensor-parallel layer {'matches' if ok else 'DIFFERS FROM'} one process "
        f"(max abs error {error:.2e})",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
