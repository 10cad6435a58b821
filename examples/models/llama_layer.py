"""A Llama-style decoder layer made of the serving ops that write their inputs in place.

    x, residual [tokens, hidden], positions [tokens], key_cache, value_cache [blocks, block_size,
    heads, head_dim], slot_mapping [tokens]
      -> examples::fused_add_rms_norm(x, residual)    residual += x; x = rms_norm(residual), in place
      -> qkv = x @ W_qkv                                 one fused projection
      -> examples::rotary_embedding(positions, q, k)     in place on q, k: head-split views of qkv
      -> examples::kv_cache_write(k, v, caches, slots)   the paged KV cache, in place
      -> examples::attention(q, k, v, causal)            over the tokens (prefill)
      -> o @ W_o, examples::fused_add_rms_norm(o, residual)
      -> examples::silu_and_mul(h @ W_gate_up) @ W_down  the gated MLP
      -> [tokens, hidden]; residual and the caches hold what the layer wrote

``python examples/models/llama_layer.py [--device cpu|cuda] [--out DIR]`` exports it with a dynamic
token count, AOTInductor-compiles it, runs the package in the C++ runner for 5, 2 and 17 tokens,
and compares the output and every input it writes (residual, both caches, and x, which holds the
normed input) with the same layer in plain torch, float32, in eager on the CPU
(``model_check.main``); exits 1 on a mismatch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_check  # noqa: E402

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, ROT_DIM = 256, 4, 64, 512, 32
BLOCKS, BLOCK_SIZE, MAX_POSITION = 8, 16, 256
DTYPE = torch.bfloat16


def cos_sin_cache(positions: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[positions, rot_dim]: cos then sin of position p times the inverse frequencies
    base^(-2i / rot_dim), i < rot_dim / 2 (RoFormer's angles, as Llama uses them)."""
    inv_freq = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class LlamaLayer(torch.nn.Module):
    """One decoder layer over ``tokens`` of one sequence (prefill). Inputs: ``x``, ``residual``
    [tokens, hidden], ``positions`` int64 [tokens], ``key_cache``, ``value_cache`` [blocks,
    block_size, heads, head_dim], ``slot_mapping`` int64 [tokens] (distinct slots, -1 to skip).
    Returns the layer's output [tokens, hidden]; writes x (the normed input), residual (the
    residual stream after attention) and the caches. ``plain=True`` computes with plain torch
    in float32 (its inputs are converted and written back)."""

    def __init__(self, plain: bool = False):
        super().__init__()
        self.plain = plain
        dtype = torch.float32 if plain else DTYPE
        qkv, hd = 3 * HEADS * HEAD_DIM, HEADS * HEAD_DIM

        def weight(*shape, scale=1.0):
            return torch.nn.Parameter((torch.randn(*shape) * scale).to(dtype))

        self.input_norm = torch.nn.Parameter((1 + 0.1 * torch.randn(HIDDEN)).to(dtype))
        self.post_norm = torch.nn.Parameter((1 + 0.1 * torch.randn(HIDDEN)).to(dtype))
        self.w_qkv = weight(qkv, HIDDEN, scale=HIDDEN**-0.5)
        self.w_o = weight(HIDDEN, hd, scale=hd**-0.5)
        self.w_gate_up = weight(2 * INTERMEDIATE, HIDDEN, scale=HIDDEN**-0.5)
        self.w_down = weight(HIDDEN, INTERMEDIATE, scale=INTERMEDIATE**-0.5)
        self.register_buffer("cos_sin_cache", cos_sin_cache(MAX_POSITION, ROT_DIM).to(dtype))

    def forward(self, x, residual, positions, key_cache, value_cache, slot_mapping):
        if self.plain:  # the same layer in float32, written back into the caller's tensors
            work = [t.float() for t in (x, residual, key_cache, value_cache)]
            out = self.layer(model_check.TorchOps, work[0], work[1], positions, work[2], work[3], slot_mapping)
            for t, w in zip((x, residual, key_cache, value_cache), work):
                t.copy_(w)
            return out.to(x.dtype)
        return self.layer(torch.ops.examples, x, residual, positions, key_cache, value_cache, slot_mapping)

    def layer(self, ops, x, residual, positions, key_cache, value_cache, slot_mapping):
        tokens, hd = x.shape[0], HEADS * HEAD_DIM
        ops.fused_add_rms_norm(x, residual, self.input_norm, 1e-6)
        qkv = F.linear(x, self.w_qkv)
        q = qkv[:, :hd].view(tokens, HEADS, HEAD_DIM)
        k = qkv[:, hd : 2 * hd].view(tokens, HEADS, HEAD_DIM)
        v = qkv[:, 2 * hd :].view(tokens, HEADS, HEAD_DIM)
        ops.rotary_embedding(positions, q, self.cos_sin_cache, k, True)
        ops.kv_cache_write(k, v, key_cache, value_cache, slot_mapping)
        heads = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)]  # [1, heads, tokens, head_dim] views
        o, _ = ops.attention(*heads, HEAD_DIM, None, True, 0.0)
        o = o.transpose(1, 2).reshape(tokens, hd)
        h = F.linear(o, self.w_o)
        ops.fused_add_rms_norm(h, residual, self.post_norm, 1e-6)
        return F.linear(ops.silu_and_mul(F.linear(h, self.w_gate_up)), self.w_down)


def make_model(plain: bool = False, seed: int = 0) -> LlamaLayer:
    """The layer in eval mode, its weights drawn from ``seed`` (the same for either ``plain``)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaLayer(plain=plain).eval()


def example_inputs(tokens: int) -> list[torch.Tensor]:
    """``[x, residual, positions, key_cache, value_cache, slot_mapping]`` for ``tokens`` tokens
    at positions 7.. of a sequence, in distinct cache slots (the second token's is -1: padding),
    drawn from a seed made of ``tokens``."""
    gen = torch.Generator().manual_seed(2000 + tokens)
    x = torch.randn(tokens, HIDDEN, generator=gen).to(DTYPE)
    residual = torch.randn(tokens, HIDDEN, generator=gen).to(DTYPE)
    positions = torch.arange(7, 7 + tokens, dtype=torch.int64)
    caches = [torch.randn(BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, generator=gen).to(DTYPE) for _ in range(2)]
    slots = torch.randperm(BLOCKS * BLOCK_SIZE, generator=gen)[:tokens]
    if tokens > 1:
        slots[1] = -1
    return [x, residual, positions, *caches, slots]


_tokens = torch.export.Dim("tokens", min=2, max=MAX_POSITION - 8)
SPEC = model_check.ModelSpec(
    "llama_layer",
    make_model,
    example_inputs,
    dynamic_shapes=({0: _tokens}, {0: _tokens}, {0: _tokens}, None, None, {0: _tokens}),
    batches=(5, 2, 17),
    atol=3e-2,
    min_cosine=0.999,
    ops=("fused_add_rms_norm", "rotary_embedding", "kv_cache_write", "attention", "silu_and_mul"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Checks the layer in the C++ runner (see the module docstring); returns the exit status."""
    return model_check.main(SPEC, argv)


if __name__ == "__main__":
    sys.exit(main())
