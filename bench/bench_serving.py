"""The serving ops that write their inputs, against what a user would run instead, in one process.

At [tokens, hidden] = [16384, 4096] in bf16 by default: ``examples::fused_add_rms_norm`` (in
place on x and residual) against the torch expression in eager and under ``torch.compile``, and
against its functional form (fresh x and residual each call: the clone a functional op makes);
``examples::rotary_embedding`` in place on the q and k views of a fused qkv projection (32 heads of
128, NeoX, full rotary) against the torch expression, compiled, and the functional form (a fresh
qkv each call); ``examples::kv_cache_write`` of 16384 tokens' keys and values (8 heads of 128)
into paged caches against ``index_put_`` in eager and compiled, and the functional form (fresh
caches each call); ``examples::silu_and_mul`` against the expression compiled. Each is compared
with a device-to-device copy of the bytes it moves (the bandwidth ceiling). The ops with value
domains (rotary's positions, the cache write's slots) also run with the device value checks off,
whose difference is the checks' cost (Note [Device value checks]).

    python3 bench/bench_serving.py [--tokens 16384] [--hidden 4096] [--json out.json]

Bytes moved: fused_add_rms_norm reads x and residual and writes both (4 x [tokens, hidden]);
rotary reads and writes the rotated elements of q and k and reads one cache row per token; the
cache write reads and writes the keys and values; silu_and_mul reads [tokens, 2 d] and writes
[tokens, d]. Times are medians of triton.testing.do_bench (CUDA events), inputs random.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import bandwidth_group, bandwidth_or_call_line, report, unchecked

import opforge

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
from model_check import TorchOps  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for op in ("fused_add_rms_norm", "rotary_embedding", "kv_cache_write", "silu_and_mul"):
        opforge.load_library(opforge.example_library(op))
    dtype, T, H = torch.bfloat16, args.tokens, args.hidden
    rows = []

    def group(name: str, nbytes: int, impls: list) -> None:
        bandwidth_group(rows, name, nbytes, impls)

    def compiled(fn, *a):
        c = torch.compile(fn)
        c(*a)
        return c

    # fused residual add + RMSNorm, in place
    x = torch.randn(T, H, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.rand(H, device="cuda", dtype=dtype) + 0.5
    norm_torch = compiled(TorchOps.fused_add_rms_norm, x, r, w, 1e-6)
    group(
        f"fused_add_rms_norm bf16 [{T}, {H}]",
        4 * x.numel() * x.element_size(),
        [
            (
                "opforge examples::fused_add_rms_norm (in place)",
                lambda: torch.ops.examples.fused_add_rms_norm(x, r, w, 1e-6),
            ),
            (
                "opforge, functional form (clone x and residual)",
                lambda: torch.ops.examples.fused_add_rms_norm(x.clone(), r.clone(), w, 1e-6),
            ),
            ("torch eager (residual.add_, rms_norm, copy_)", lambda: TorchOps.fused_add_rms_norm(x, r, w, 1e-6)),
            ("torch.compile of the same", lambda: norm_torch(x, r, w, 1e-6)),
        ],
    )

    # rotary embedding in place on the q and k views of a fused qkv projection
    heads, head_dim = 32, 128
    qkv = torch.randn(T, 3 * heads * head_dim, device="cuda", dtype=dtype)
    q = qkv[:, : heads * head_dim].view(T, heads, head_dim)
    k = qkv[:, heads * head_dim : 2 * heads * head_dim].view(T, heads, head_dim)
    cache = torch.randn(8192, head_dim, device="cuda", dtype=dtype)
    positions = torch.randint(0, 8192, (T,), device="cuda")
    rotary_torch = compiled(TorchOps.rotary_embedding, positions, q, cache, k, True)

    def rotary_functional():
        fresh = qkv.clone()
        qq = fresh[:, : heads * head_dim].view(T, heads, head_dim)
        kk = fresh[:, heads * head_dim : 2 * heads * head_dim].view(T, heads, head_dim)
        torch.ops.examples.rotary_embedding(positions, qq, cache, kk, True)

    rotary_bytes = 2 * 2 * T * heads * head_dim * 2 + T * head_dim * 2 + T * 8
    group(
        f"rotary_embedding bf16, {T} tokens, q and k {heads} x {head_dim}",
        rotary_bytes,
        [
            (
                "opforge examples::rotary_embedding (in place on views)",
                lambda: torch.ops.examples.rotary_embedding(positions, q, cache, k, True),
            ),
            (
                "opforge, device value checks off",
                unchecked(lambda: torch.ops.examples.rotary_embedding(positions, q, cache, k, True)),
            ),
            ("opforge, functional form (clone qkv)", rotary_functional),
            ("torch eager (gather, rotate, copy_)", lambda: TorchOps.rotary_embedding(positions, q, cache, k, True)),
            ("torch.compile of the same", lambda: rotary_torch(positions, q, cache, k, True)),
        ],
    )

    # paged KV-cache write
    kv_heads = 8
    kv = torch.randn(T, 2 * kv_heads * head_dim, device="cuda", dtype=dtype)
    key = kv[:, : kv_heads * head_dim].view(T, kv_heads, head_dim)
    value = kv[:, kv_heads * head_dim :].view(T, kv_heads, head_dim)
    blocks, block_size = 2 * T // 16, 16
    key_cache = torch.zeros(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.randperm(blocks * block_size, device="cuda")[:T]
    write_torch = compiled(TorchOps.kv_cache_write, key, value, key_cache, value_cache, slots)
    group(
        f"kv_cache_write bf16, {T} tokens, {kv_heads} x {head_dim}, caches [{blocks}, {block_size}, ...]",
        2 * 2 * key.numel() * 2 + T * 8,
        [
            (
                "opforge examples::kv_cache_write (in place)",
                lambda: torch.ops.examples.kv_cache_write(key, value, key_cache, value_cache, slots),
            ),
            (
                "opforge, device value checks off",
                unchecked(lambda: torch.ops.examples.kv_cache_write(key, value, key_cache, value_cache, slots)),
            ),
            (
                "opforge, functional form (clone the caches)",
                lambda: torch.ops.examples.kv_cache_write(key, value, key_cache.clone(), value_cache.clone(), slots),
            ),
            ("torch eager (index_put_)", lambda: TorchOps.kv_cache_write(key, value, key_cache, value_cache, slots)),
            ("torch.compile of the same", lambda: write_torch(key, value, key_cache, value_cache, slots)),
        ],
    )

    # silu_and_mul
    inter = 2 * H
    gate_up = torch.randn(T, 2 * inter, device="cuda", dtype=dtype)
    silu_torch = compiled(TorchOps.silu_and_mul, gate_up)
    group(
        f"silu_and_mul bf16 [{T}, 2 x {inter}]",
        3 * T * inter * 2,
        [
            ("opforge examples::silu_and_mul", lambda: torch.ops.examples.silu_and_mul(gate_up)),
            ("torch eager", lambda: TorchOps.silu_and_mul(gate_up)),
            ("torch.compile of the same", lambda: silu_torch(gate_up)),
        ],
    )

    report(rows, bandwidth_or_call_line(58), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
