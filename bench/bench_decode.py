"""``examples::paged_decode_attention`` against what a user would run instead, in one process.

One decode step (one query token per sequence, every sequence ``--context`` tokens long) over a
paged KV cache of ``--block-size``-token blocks in shuffled order, at each batch of ``--batches``
(default 64 and 1; context 4096, 32 query heads on 8 kv heads of head dim 128, bf16: issue 46's
shape). In each group:

- a device-to-device copy that moves as many bytes as the step must read (half read, half
  written, as bench_serving.py's copies): the bandwidth ceiling;
- ``examples::paged_decode_attention``, with the device value checks of block_tables and
  seq_lens on (the default) and off (Note [Device value checks]);
- SDPA over the gathered cache: the blocks gathered into dense keys and values
  [batch, context, kv_heads, head_dim], then ``F.scaled_dot_product_attention(enable_gqa=True)``
  on their head-split views, timed with the gather and without it (gathered beforehand: SDPA's
  best case, a cache that is not paged);
- the plain torch expression: the op's ``.equivalent()`` in eager.

Then, for each float8 ``--kv-cache-dtypes`` value (default "fp8": float8_e4m3fn caches with
per-tensor scales, vLLM's kv_cache_dtype, written by examples::reshape_and_cache_flash), a group
of its own at each batch: the copy of as many bytes as the float8 step reads (half the 16-bit
step's), the op with the device value checks on and off, and the plain torch expression (the
caches dequantised in eager, then attention as above).

Bytes: the keys and values the step reads, 2 x batch x context x kv_heads x head_dim x the
cache dtype's size (queries, block tables and outputs are under 0.1 % of it). GB/s is those bytes over
the median time of triton.testing.do_bench (CUDA events, warm-up, L2 flushed before each run),
inputs random; ``x copy`` is the copy's time over the implementation's (issue 46's targets for
the op: >= 0.85 x at batch 64, >= 0.7 x at batch 1). ``--profile`` adds each implementation's
kernels (count and device time per call).

``--graphs`` times each group as CUDA graph replays instead (triton.testing.do_bench_cudagraph,
as serving stacks run decode steps: no launch gaps between the step's kernels), every
implementation rotating through as many input sets as hold four times the L2 cache
(common.input_sets), the copy too: the copy, the op with checks on and off, and SDPA over a cache
gathered beforehand.

``--sweep`` times the op's launch variants instead (OPFORGE_PAGED_DECODE_TUNING, read by the
op's host code on every call: where split contexts are combined, the fewest tokens per split;
paged_decode_attention.cu), each checked against SDPA first, with the device value checks on and
off, beside the same copy.

    python3 bench/bench_decode.py [--batches 64 1] [--context 4096] [--heads 32] [--kv-heads 8]
                                  [--head-dim 128] [--block-size 16] [--dtype bfloat16|float16]
                                  [--kv-cache-dtypes auto fp8 fp8_e5m2] [--profile] [--sweep]
                                  [--graphs] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from common import (
    bandwidth_group,
    bandwidth_or_call_line,
    graph_ms,
    input_sets,
    kernel_times,
    median_ms,
    print_kernel_times,
    report,
    rotating,
    unchecked,
)

import opforge

OP = "examples::paged_decode_attention"
TUNING = "OPFORGE_PAGED_DECODE_TUNING"
#: The launch variants --sweep times ("" is the op's default: combine=kernel,split_tokens=128).
SWEEP = [
    "",
    "combine=kernel,split_tokens=32",
    "combine=kernel,split_tokens=64",
    "combine=kernel,split_tokens=256",
    "combine=last_block,split_tokens=32",
    "combine=last_block,split_tokens=64",
    "combine=last_block,split_tokens=128",
    "combine=last_block,split_tokens=256",
]


#: The cache dtype of each kv_cache_dtype value (vLLM's), and the scales of the float8 ones.
CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_SCALES = (0.02, 0.015)


def decode_step(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int, dtype):
    """[query, key_cache, value_cache, block_tables, seq_lens] on the GPU: ``batch`` sequences of
    ``context`` tokens, each block of the caches owned by one sequence, in random order."""
    pages = -(-context // block_size)
    query = torch.randn(batch, heads, head_dim, device="cuda", dtype=dtype)
    caches = [torch.randn(batch * pages, block_size, kv_heads, head_dim, device="cuda", dtype=dtype) for _ in range(2)]
    tables = torch.randperm(batch * pages, device="cuda", dtype=torch.int32).view(batch, pages)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    return [query, *caches, tables, lens]


def fp8_step(step: list, kv_cache_dtype: str) -> list:
    """``step`` (decode_step) as the op takes it with a float8 ``kv_cache_dtype``: [query,
    key_cache, value_cache, block_tables, seq_lens, scale, kv_cache_dtype, k_scale, v_scale], the
    caches quantised as vLLM's cache write stores them (x / scale, saturated) by FP8_SCALES."""
    dtype, big = CACHE_DTYPES[kv_cache_dtype], torch.finfo(CACHE_DTYPES[kv_cache_dtype]).max
    scales = [torch.tensor(s, device="cuda") for s in FP8_SCALES]
    caches = [(c.float() / s).clamp(-big, big).to(dtype) for c, s in zip(step[1:3], scales)]
    return [step[0], *caches, *step[3:], 0.0, kv_cache_dtype, *scales]


def gathered(key_cache, value_cache, block_tables, context: int):
    """Keys and values as SDPA takes them: [batch, kv_heads, context, head_dim] views of dense
    [batch, context, kv_heads, head_dim] copies of the sequences' blocks."""
    return [c[block_tables.long()].flatten(1, 2)[:, :context].transpose(1, 2) for c in (key_cache, value_cache)]


def sdpa(query, key, value):
    """SDPA of the step's queries [batch, heads, head_dim] over gathered keys and values."""
    return F.scaled_dot_product_attention(query[:, :, None], key, value, enable_gqa=True)[:, :, 0]


def tuned(fn, tuning: str):
    """``fn`` run with OPFORGE_PAGED_DECODE_TUNING set to ``tuning`` (unset where empty)."""

    def run():
        saved = os.environ.pop(TUNING, None)
        if tuning:
            os.environ[TUNING] = tuning
        try:
            fn()
        finally:
            os.environ.pop(TUNING, None)
            if saved is not None:
                os.environ[TUNING] = saved

    return run


def timed_group(batch: int, args, profiles: list, kv_cache_dtype: str = "auto") -> list[dict]:
    """The rows of one batch size and cache dtype (see the module's docstring); appends each
    implementation's kernels to ``profiles`` with ``args.profile``."""
    dtype, op = getattr(torch, args.dtype), torch.ops.examples.paged_decode_attention
    step = decode_step(batch, args.context, args.heads, args.kv_heads, args.head_dim, args.block_size, dtype)
    fp8 = kv_cache_dtype != "auto"
    if fp8:
        step = fp8_step(step, kv_cache_dtype)
    query, key_cache, value_cache, tables, _ = step[:5]
    # SDPA over the caches' values (dequantised where float8): the check of the op's numbers
    scaled = [c.to(dtype) * s for c, s in zip(step[1:3], step[7:9])] if fp8 else step[1:3]
    key, value = gathered(*scaled, tables, args.context)
    expected = sdpa(query, key, value)
    description = opforge.find_op(OP)
    arguments = step if fp8 else [*step, 0.0, "auto", None, None]  # every argument, by name
    scope = {"torch": torch, **dict(zip([a.name for a in description.args], arguments))}
    nbytes = 2 * key_cache.numel() * key_cache.element_size()
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    impls = [("device-to-device copy", lambda: dst.copy_(src))]
    if args.sweep:
        for tuning in SWEEP:
            label = f"opforge, {tuning or 'default'}"
            out = []
            tuned(lambda: out.append(op(*step)), tuning)()
            torch.testing.assert_close(out[0], expected, atol=2e-2, rtol=2e-2)  # the same numbers
            impls += [
                (label, tuned(lambda: op(*step), tuning)),
                (f"{label}, checks off", tuned(unchecked(lambda: op(*step)), tuning)),
            ]
    elif fp8:
        torch.testing.assert_close(op(*step), expected, atol=2e-2, rtol=2e-2)  # the same numbers
        impls += [
            (f"opforge examples::paged_decode_attention, {kv_cache_dtype}", lambda: op(*step)),
            ("opforge, device value checks off", unchecked(lambda: op(*step))),
            ("torch expression (the op's .equivalent(), eager)", lambda: eval(description.equivalent, scope)),  # noqa: S307
        ]
    else:
        torch.testing.assert_close(op(*step), expected, atol=2e-2, rtol=2e-2)  # the same numbers
        impls += [
            ("opforge examples::paged_decode_attention", lambda: op(*step)),
            ("opforge, device value checks off", unchecked(lambda: op(*step))),
            (
                "gather + SDPA (enable_gqa)",
                lambda: sdpa(query, *gathered(key_cache, value_cache, tables, args.context)),
            ),
            ("SDPA over a cache gathered beforehand", lambda: sdpa(query, key, value)),
            ("torch expression (the op's .equivalent(), eager)", lambda: eval(description.equivalent, scope)),  # noqa: S307
        ]
    group = (
        f"batch {batch} x context {args.context}, {args.heads} heads on {args.kv_heads} kv heads of "
        f"{args.head_dim}, blocks of {args.block_size}, {args.dtype}"
        + (f", {kv_cache_dtype} cache ({str(key_cache.dtype).removeprefix('torch.')})" if fp8 else "")
        + f": {nbytes / 2**20:.0f} MiB of keys and values"
    )
    rows, copy_ms = [], None
    for label, fn in impls:
        ms = median_ms(fn)
        copy_ms = copy_ms or ms
        rows.append({"group": group, "impl": label, "ms": ms, "GB/s": nbytes / ms / 1e6, "vs_copy": copy_ms / ms})
        if args.profile and fn is not impls[0][1]:
            profiles.append((f"{group}: {label}", kernel_times(fn)))
    return rows


def graph_group(batch: int, args, kv_cache_dtype: str) -> list[dict]:
    """The rows of one batch size and cache dtype timed as CUDA graph replays (``--graphs``)."""
    dtype, op = getattr(torch, args.dtype), torch.ops.examples.paged_decode_attention
    fp8 = kv_cache_dtype != "auto"
    steps, gathers = [], []
    nbytes = 2 * batch * -(-args.context // args.block_size) * args.block_size * args.kv_heads * args.head_dim
    nbytes *= CACHE_DTYPES[kv_cache_dtype].itemsize if fp8 else dtype.itemsize
    for _ in range(input_sets(nbytes)):
        step = decode_step(batch, args.context, args.heads, args.kv_heads, args.head_dim, args.block_size, dtype)
        if fp8:
            step = fp8_step(step, kv_cache_dtype)
        else:
            gathers.append((step[0], *gathered(*step[1:4], args.context)))
        steps.append(step)
    ops = [lambda step=step: op(*step) for step in steps]
    impls = [("opforge examples::paged_decode_attention", rotating(ops))]
    impls.append(("opforge, device value checks off", unchecked(rotating(ops))))
    if gathers:
        impls.append(("SDPA over a cache gathered beforehand", rotating([lambda g=g: sdpa(*g) for g in gathers])))
    rows: list[dict] = []
    name = (
        f"batch {batch} x context {args.context}, {args.heads} heads on {args.kv_heads} kv heads of "
        f"{args.head_dim}, {args.dtype}, {kv_cache_dtype} cache, CUDA graphs over {len(steps)} input sets"
    )
    bandwidth_group(rows, name, nbytes, impls, timer=graph_ms)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 1])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument(
        "--kv-cache-dtypes",
        nargs="+",
        choices=("auto", *CACHE_DTYPES),
        default=["auto", "fp8"],
        help="the caches each batch is timed with: auto (the query's dtype), float8 ones",
    )
    parser.add_argument("--profile", action="store_true", help="also print each implementation's kernels")
    parser.add_argument("--sweep", action="store_true", help="time the op's launch variants instead")
    parser.add_argument("--graphs", action="store_true", help="time CUDA graph replays instead")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("paged_decode_attention"))
    rows, profiles = [], []
    for kv_cache_dtype in args.kv_cache_dtypes:
        for batch in args.batches:
            if args.graphs:
                rows += graph_group(batch, args, kv_cache_dtype)
            else:
                rows += timed_group(batch, args, profiles, kv_cache_dtype)
            torch.cuda.empty_cache()
    report(rows, bandwidth_or_call_line(64), args.json)
    for title, table in profiles:
        print()
        print_kernel_times(title, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
