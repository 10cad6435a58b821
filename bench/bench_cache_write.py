"""The paged KV-cache write with vLLM's signature (examples::reshape_and_cache_flash) against the
torch expression of its rule in eager and under ``torch.compile``, each compared with a
device-to-device copy of the bytes it moves (the bandwidth ceiling), in one process.

At [tokens, heads, head_dim] = [T, 8, 128] bf16 keys and values, T = 4096, 16384 and 65536 by
default (a prefill batch's tokens), into caches of
[blocks, 16, heads, head_dim] with a slot per token (a shuffled permutation of the cache's
slots, as a serving batch of many sequences writes them): kv_cache_dtype "auto" (bf16 caches)
and "fp8" (float8_e4m3fn caches, each element divided by its per-tensor scale, saturated).

    python3 bench/bench_cache_write.py [--tokens 4096 16384 65536] [--heads 8] [--head-dim 128]
                                       [--json out.json]

Bytes moved: key and value read (2 bytes an element), the caches' rows written (2 bytes an
element under "auto", 1 under "fp8"), and the slots read (8 bytes a token). Each group is timed
twice: as eager calls (triton.testing.do_bench: CUDA events, L2 flushed before each call) and
as CUDA graph replays (do_bench_cudagraph: no launch gaps, as a serving stack runs its steps;
torch.compile is left out there). opforge is timed with its device value check of slot_mapping
(Note [Device value checks]) on, the default, and off: reshape_and_cache_flash checks each slot
in its own kernel (.checks_values_in_kernel(), one launch); under "auto", examples::kv_cache_write
(the same kernel waiting for a separate check kernel, two launches) shows the other way in the
same run. Inputs random.
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import bandwidth_group, bandwidth_or_call_line, graph_ms, input_sets, report, rotating, unchecked

import opforge


def write_torch(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale) -> None:
    """vLLM's reshape_and_cache_flash in torch: each token's rows into its slot of the caches,
    divided by the scale and saturated to the cache's float8 dtype unless kv_cache_dtype is
    "auto" (every slot here is a real one: no padding)."""
    for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        target, rows = cache.view(-1, *x.shape[1:]), x
        if kv_cache_dtype != "auto":  # torch has no float8 index_copy_ on CUDA: copy the bytes
            top = torch.finfo(cache.dtype).max
            rows = (x.float() / scale).clamp(-top, top).to(cache.dtype).view(torch.uint8)
            target = target.view(torch.uint8)
        target.index_copy_(0, slots, rows)


def groups(rows: list[dict], T: int, H: int, D: int, compiled) -> None:
    """Appends the groups of one token count: each kv_cache_dtype, eager and in CUDA graphs (over
    rotating input sets, common.input_sets)."""
    block = 16
    blocks = (T + block - 1) // block
    k_scale, v_scale = torch.tensor(0.05, device="cuda"), torch.tensor(0.07, device="cuda")
    for kv_cache_dtype, cache_dtype in (("auto", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        nbytes = 2 * T * H * D * (2 + cache_dtype.itemsize) + T * 8
        calls = []
        for _ in range(input_sets(nbytes)):
            key = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) * 10
            value = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) * 10
            slots = torch.randperm(blocks * block, device="cuda")[:T]
            key_cache = torch.zeros(blocks, block, H, D, device="cuda", dtype=cache_dtype)
            value_cache = torch.zeros_like(key_cache)
            calls.append((key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale))
        target = str(cache_dtype).removeprefix("torch.")
        name = f"reshape_and_cache_flash {kv_cache_dtype}: bf16 -> {target} [{T}, {H}, {D}]"
        op = [lambda call=call: torch.ops.examples.reshape_and_cache_flash(*call) for call in calls]
        # kv_cache_write: the same write beside a separate check kernel ("auto" only: no scales)
        separate = kv_cache_dtype == "auto"
        beside = [lambda call=call: torch.ops.examples.kv_cache_write(*call[:5]) for call in calls] if separate else []
        eager = [lambda call=call: write_torch(*call) for call in calls]
        compiled(*calls[0])
        bandwidth_group(
            rows,
            name,
            nbytes,
            [
                ("opforge examples::reshape_and_cache_flash", op[0]),
                ("opforge, device value check off", unchecked(op[0])),
                *([("opforge kv_cache_write, check kernel beside", beside[0])] if separate else []),
                ("torch eager", eager[0]),
                ("torch.compile of the same", lambda call=calls[0]: compiled(*call)),
            ],
        )
        bandwidth_group(
            rows,
            name + ", CUDA graphs",
            nbytes,
            [
                ("opforge examples::reshape_and_cache_flash", rotating(op)),
                ("opforge, device value check off", unchecked(rotating(op))),
                *([("opforge kv_cache_write, check kernel beside", rotating(beside))] if separate else []),
                ("torch eager", rotating(eager)),
            ],
            timer=graph_ms,
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("kv_cache_write"))
    rows: list[dict] = []
    compiled = torch.compile(write_torch)
    for tokens in args.tokens:
        groups(rows, tokens, args.heads, args.head_dim, compiled)
    report(rows, bandwidth_or_call_line(58), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
