"""Inputs for the serving example ops that write their inputs (fused_add_rms_norm,
rotary_embedding, kv_cache_write) and silu_and_mul, shared by the tests and
tools/sanitize.py, and how to compare a device call with the CPU reference."""

from __future__ import annotations

import torch

import opforge
from opforge.verify.checks import fresh, results

SERVING_OPS = ("fused_add_rms_norm", "rotary_embedding", "kv_cache_write", "silu_and_mul")
#: The CUDA tolerance of each dtype against the CPU reference in the same dtype (one rounding).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def load() -> None:
    for name in SERVING_OPS:
        opforge.load_library(opforge.example_library(name))


def fused_add_rms_norm(rows: int, cols: int, dtype, device) -> list:
    x = torch.randn(rows, cols, dtype=dtype, device=device)
    return [x, torch.randn_like(x), torch.rand(cols, dtype=dtype, device=device) + 0.5, 1e-6]


def rotary(tokens: int, heads: int, head_dim: int, rot_dim: int, dtype, device, neox=True, key=True) -> list:
    """positions, query, cos_sin_cache, key, is_neox; query and key are head-split views of one
    fused qkv projection [tokens, 3 * heads * head_dim] (key_heads = heads // 2, as in grouped
    query attention)."""
    kv_heads = max(1, heads // 2)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    cache = torch.randn(max(tokens, 1) + 5, rot_dim, dtype=dtype, device=device)
    positions = torch.randint(0, cache.shape[0], (tokens,), device=device)
    return [positions, q, cache, k if key else None, neox]


def kv_cache(tokens: int, heads: int, head_dim: int, blocks: int, block_size: int, dtype, device) -> list:
    """key, value (head-split views of a fused qkv projection), key_cache, value_cache and
    distinct slots, every third one -1."""
    qkv = torch.randn(tokens, 3 * heads * head_dim, dtype=dtype, device=device)
    key = qkv[:, heads * head_dim : 2 * heads * head_dim].view(tokens, heads, head_dim)
    value = qkv[:, 2 * heads * head_dim :].view(tokens, heads, head_dim)
    caches = [torch.randn(blocks, block_size, heads, head_dim, dtype=dtype, device=device) for _ in range(2)]
    slots = torch.randperm(blocks * block_size, device=device)[:tokens]
    slots[::3] = -1
    return [key, value, *caches, slots]


def silu_and_mul(rows: int, d: int, dtype, device) -> list:
    return [torch.randn(rows, 2 * d, dtype=dtype, device=device)]


def compare_with_reference(name: str, args: list, dtype) -> str:
    """Runs ``examples::<name>`` on ``args`` (on their device) and on CPU copies, and compares its
    outputs and written inputs; returns "" or what differs."""
    op = opforge.find_op(f"examples::{name}")
    handle = getattr(torch.ops.examples, name)
    device = results(op, handle, fresh(args))
    cpu = results(op, handle, fresh([a.cpu() if isinstance(a, torch.Tensor) else a for a in args]))
    for k, (d, c) in enumerate(zip(device, cpu)):
        if not torch.allclose(d.cpu().double(), c.double(), atol=TOL[dtype], rtol=TOL[dtype], equal_nan=True):
            return f"result {k}: max abs error {(d.cpu().double() - c.double()).abs().max().item():.3e}"
    return ""
