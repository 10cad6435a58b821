"""examples::paged_decode_attention (examples/ops/paged_decode_attention): the CPU reference
against the description's torch equivalent and against SDPA over each sequence's own keys and
values, over grouped-query heads, head dims, cache block sizes and context lengths (empty, shorter
than a block, not a multiple of it); a cache filled by examples::kv_cache_write and decoded step
by step; float8 caches (vLLM's kv_cache_dtype "fp8", "fp8_e4m3", "fp8_e5m2" with per-tensor
scales), including a cache written by examples::reshape_and_cache_flash and read back; bad inputs
refused by name; torch.compile without recompiles; and on CUDA the kernels against the reference,
including contexts long enough to be split over several thread blocks and combined, at batch 1
and batch 64, over 16-bit and float8 caches."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import opforge
from conftest import DEVICES, TOLERANCE, requires_cuda
from opforge import verify

OP = "examples::paged_decode_attention"
HEAD = (
    "examples::paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, "
    "Tensor seq_lens, float scale=0.0, str kv_cache_dtype='auto', Tensor? k_scale=None, Tensor? v_scale=None) -> "
    "Tensor: invalid arguments\n"
)


@pytest.fixture(scope="module", autouse=True)
def libraries():
    for name in ("paged_decode_attention", "kv_cache_write"):
        opforge.load_library(opforge.example_library(name))


def decode_inputs(seq_lens, heads, kv_heads, head_dim, block_size, dtype, device, seed=0, spare_blocks=2):
    """[query, key_cache, value_cache, block_tables, seq_lens] for len(seq_lens) sequences, made
    on ``device`` from ``seed``: query [seqs, heads, head_dim] a head-split view of a fused qkv
    projection (as a decoder has it), random caches of seqs * max_blocks + spare_blocks blocks,
    each sequence's pages distinct blocks in random order, the entries of block_tables past a
    sequence's pages 0 (padding, as vLLM pads), and one more column than the longest sequence
    needs."""
    gen = torch.Generator(device).manual_seed(seed)
    seqs = len(seq_lens)
    max_blocks = math.ceil(max(seq_lens, default=0) / block_size) + 1
    blocks = seqs * max_blocks + spare_blocks
    qkv = torch.randn(seqs, (heads + 2 * kv_heads) * head_dim, generator=gen, device=device).to(dtype)
    query = qkv[:, : heads * head_dim].view(seqs, heads, head_dim)
    caches = [
        torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen, device=device).to(dtype) for _ in range(2)
    ]
    tables = torch.randperm(blocks, generator=gen, device=device)[: seqs * max_blocks].view(seqs, max_blocks).int()
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    tables[torch.arange(max_blocks, device=device) >= (lens[:, None] + block_size - 1) // block_size] = 0
    return [query, *caches, tables, lens]


def sdpa(query, keys, values, scale=0.0):
    """torch's SDPA (enable_gqa) of one sequence's query [heads, d] over its keys and values
    [n, kv_heads, d], in float64 on their device: [heads, d], zeros where n is 0."""
    if keys.shape[0] == 0:
        return torch.zeros(query.shape, dtype=torch.float64, device=query.device)
    k, v = (t.double().transpose(0, 1) for t in (keys, values))
    return F.scaled_dot_product_attention(query.double()[:, None], k, v, scale=scale or None, enable_gqa=True)[:, 0]


def sdpa_decode(query, key_cache, value_cache, block_tables, seq_lens, scale=0.0):
    """:func:`sdpa` of each sequence over its keys and values gathered row by row from the caches."""
    block_size = key_cache.shape[1]
    out = []
    for s, n in enumerate(seq_lens.tolist()):
        t = torch.arange(n, device=query.device)
        rows = block_tables[s, t // block_size].long() * block_size + t % block_size
        out.append(sdpa(query[s], key_cache.flatten(0, 1)[rows], value_cache.flatten(0, 1)[rows], scale))
    return torch.stack(out) if out else torch.zeros(query.shape, dtype=torch.float64)


def wide(t):
    """``t`` on the CPU, in float64 if it holds floating-point values (float8 ones exactly); None stays None."""
    if t is None:
        return None
    return t.cpu().double() if t.is_floating_point() else t.cpu()


def equivalent(args, scale=0.0, kv_cache_dtype="auto", k_scale=None, v_scale=None):
    """The description's .equivalent() torch expression, evaluated in float64 on the CPU."""
    op = opforge.find_op(OP)
    values = [*map(wide, args), scale, kv_cache_dtype, wide(k_scale), wide(v_scale)]
    return eval(op.equivalent, {"torch": torch, **dict(zip([a.name for a in op.args], values))})  # noqa: S307


def assert_close(got, want, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu().double(), want.cpu().double(), atol=tol, rtol=tol, equal_nan=True)


def reference(args, scale=0.0, kv_cache_dtype="auto", k_scale=None, v_scale=None):
    """The CPU reference on CPU copies of ``args``: in float64 (float8 caches kept as they are)."""
    if kv_cache_dtype == "auto":
        return torch.ops.examples.paged_decode_attention(*map(wide, args), scale)
    cpu = [args[0].cpu().double(), *(a.cpu() for a in args[1:])]
    scales = [None if s is None else s.cpu() for s in (k_scale, v_scale)]
    return torch.ops.examples.paged_decode_attention(*cpu, scale, kv_cache_dtype, *scales)


#: Context lengths: empty, one token, shorter than a block, one block and one token past it,
#: several blocks and a part, whole blocks.
SEQ_LENS = [0, 1, 7, 33, 100, 128]
#: The sweep of the reference's and the kernels' tests: query heads per kv head (2 kv heads),
#: head dim, cache block size.
SWEEP = pytest.mark.parametrize(
    "group, head_dim, block_size", list(itertools.product([1, 2, 4, 8], [64, 128], [16, 32]))
)


def sweep_case(group, head_dim, block_size, dtype, device):
    """decode_inputs over SEQ_LENS, and the scale: the default at head dim 64, 0.05 at 128."""
    return decode_inputs(SEQ_LENS, 2 * group, 2, head_dim, block_size, dtype, device), 0.0 if head_dim == 64 else 0.05


@SWEEP
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_matches_the_equivalent_and_sdpa(group, head_dim, block_size, dtype):
    args, scale = sweep_case(group, head_dim, block_size, dtype, "cpu")
    out = torch.ops.examples.paged_decode_attention(*args, scale)
    assert out.shape == args[0].shape and out.dtype == dtype and out.is_contiguous()
    assert_close(out, equivalent(args, scale), dtype)
    assert_close(out, sdpa_decode(*args, scale), dtype)
    assert not out[0].any() and out[1:].abs().sum() > 0  # the empty sequence gets zeros, the others not


def test_special_values_follow_the_equivalent():
    """A NaN in a key row makes the outputs of its kv head's query heads NaN; an inf in a key row
    past a sequence's length, or in a padding page, changes nothing."""
    args = decode_inputs([9, 40], 4, 2, 64, 16, torch.float32, "cpu")
    query, key_cache, value_cache, tables, lens = args
    key_cache[tables[0, 0], 3, 1, 5] = float("nan")  # token 3 of sequence 0, kv head 1
    key_cache[tables[1, 2], 9, 0, 0] = float("inf")  # token 41 of sequence 1: past its 40
    value_cache[tables[1, 2], 9, 0, 0] = float("inf")
    out = torch.ops.examples.paged_decode_attention(*args)
    assert out[0, 2:].isnan().all() and not out[0, :2].isnan().any() and out[1].isfinite().all()
    assert_close(out, equivalent(args), torch.float32)


#: vLLM's float8 kv_cache_dtype values and the dtype each stores.
FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


#: Half the distance between neighbouring normal float8 values, relative to them (3 or 2 mantissa bits).
UNIT_ROUNDOFF = {torch.float8_e4m3fn: 2.0**-4, torch.float8_e5m2: 2.0**-3}


def quantise(x, scale, dtype):
    """``x`` as vLLM's cache write stores it in a float8 cache of ``dtype``: x / scale in float32,
    saturated to the largest finite value (NaN kept), rounded to ``dtype``."""
    big = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-big, big).to(dtype)


def fp8_inputs(args, kv_cache_dtype, scales=(0.02, 0.03)):
    """``(args, k_scale, v_scale)``: decode_inputs' ``args`` with their caches quantised to
    ``kv_cache_dtype``'s float8 dtype by the scales (0-dim float32 tensors on the caches' device)."""
    k_scale, v_scale = (torch.tensor(s, dtype=torch.float32, device=args[1].device) for s in scales)
    caches = [quantise(c, s, FP8[kv_cache_dtype]) for c, s in zip(args[1:3], (k_scale, v_scale))]
    return [args[0], *caches, *args[3:]], k_scale, v_scale


def dequantised(args, k_scale, v_scale):
    """``args`` with float8 caches as the values they stand for: float64 element times its scale."""
    return [args[0], args[1].double() * k_scale.double(), args[2].double() * v_scale.double(), *args[3:]]


@pytest.mark.parametrize("kv_cache_dtype", FP8)
@pytest.mark.parametrize("group, head_dim", [(1, 64), (4, 128), (8, 40)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_reference_reads_fp8_caches_times_their_scales(kv_cache_dtype, group, head_dim, dtype):
    """A float8 cache element x stands for x * k_scale (keys) or x * v_scale (values): the
    reference against the equivalent and against SDPA over the dequantised caches."""
    args, scale = sweep_case(group, head_dim, 16, dtype, "cpu")
    fp8, k_scale, v_scale = fp8_inputs(args, kv_cache_dtype)
    assert fp8[1].dtype == FP8[kv_cache_dtype]
    out = torch.ops.examples.paged_decode_attention(*fp8, scale, kv_cache_dtype, k_scale, v_scale)
    assert out.shape == args[0].shape and out.dtype == dtype
    assert_close(out, equivalent(fp8, scale, kv_cache_dtype, k_scale, v_scale), dtype)
    assert_close(out, sdpa_decode(*dequantised(fp8, k_scale, v_scale), scale), dtype)
    assert not out[0].any() and out[1:].abs().sum() > 0


def test_fp8_scales_left_out_are_one_and_auto_reads_none():
    """vLLM's defaults: a float8 cache without scales is read with scale 1; under "auto" the
    scales given are not read."""
    args = decode_inputs([9, 40], 4, 2, 64, 16, torch.float32, "cpu")
    fp8, _, _ = fp8_inputs(args, "fp8", scales=(1.0, 1.0))
    one = torch.tensor(1.0)
    op = torch.ops.examples.paged_decode_attention
    torch.testing.assert_close(op(*fp8, 0.0, "fp8"), op(*fp8, 0.0, "fp8", one, one), atol=0, rtol=0)
    assert_close(op(*fp8, 0.0, "fp8"), sdpa_decode(*dequantised(fp8, one, one)), torch.float32)
    twice = torch.tensor(2.0)
    torch.testing.assert_close(op(*args, 0.0, "auto", twice, twice), op(*args), atol=0, rtol=0)


@pytest.mark.parametrize(
    "device, dtype, kv_cache_dtype",
    [
        ("cpu", torch.float32, "auto"),
        ("cpu", torch.float32, "fp8"),
        ("cpu", torch.bfloat16, "fp8_e5m2"),
        pytest.param("cuda", torch.bfloat16, "auto", marks=requires_cuda),
        pytest.param("cuda", torch.float16, "auto", marks=requires_cuda),
        pytest.param("cuda", torch.bfloat16, "fp8", marks=requires_cuda),
        pytest.param("cuda", torch.float16, "fp8_e4m3", marks=requires_cuda),
        pytest.param("cuda", torch.bfloat16, "fp8_e5m2", marks=requires_cuda),
    ],
)
def test_a_written_cache_decodes_step_by_step(device, dtype, kv_cache_dtype):
    """Sequences prefilled into NaN-filled caches (a slot never written is NaN, so reading one
    shows), then three decode steps that each write one token per sequence and attend to all of
    them, against SDPA over the keys and values as written. Under "auto" examples::kv_cache_write
    writes them; under a float8 kv_cache_dtype examples::reshape_and_cache_flash with the same
    kv_cache_dtype and scales as the decode op reads them with: against SDPA over the keys and
    values as vLLM quantises them (sat(x / scale) to float8, times the scale), and, within float8's
    rounding, over the keys and values themselves."""
    gen = torch.Generator().manual_seed(3)
    fp8 = kv_cache_dtype != "auto"
    heads, kv_heads, dim, block_size = 8, 2, 128 if fp8 else 64, 16
    lens = [5, 0, 33, 16, 47]
    seqs, max_blocks = len(lens), 5
    blocks = seqs * max_blocks
    tables = torch.randperm(blocks, generator=gen).view(seqs, max_blocks).int().to(device)
    shape = (blocks, block_size, kv_heads, dim)
    cache_dtype = FP8[kv_cache_dtype] if fp8 else dtype
    key_cache, value_cache = (torch.full(shape, float("nan"), device=device).to(cache_dtype) for _ in range(2))
    k_scale, v_scale = (torch.tensor(s, device=device) for s in (0.015, 0.0125))
    scales = [0.0, kv_cache_dtype, k_scale, v_scale] if fp8 else []  # the decode op's arguments after seq_lens
    keys = [torch.randn(n, kv_heads, dim, generator=gen).to(dtype).to(device) for n in lens]
    values = [torch.randn(n, kv_heads, dim, generator=gen).to(dtype).to(device) for n in lens]

    def slots(s, positions):
        p = torch.tensor(list(positions), dtype=torch.long, device=device)
        return tables[s, p // block_size].long() * block_size + p % block_size

    def write(k, v, mapping):
        if fp8:
            torch.ops.examples.reshape_and_cache_flash(k, v, key_cache, value_cache, mapping, *scales[1:])
        else:
            torch.ops.examples.kv_cache_write(k, v, key_cache, value_cache, mapping)

    def as_stored(x, scale):  # what a cached x stands for: its float8 value times the scale
        return quantise(x, scale, cache_dtype).double() * scale.double() if fp8 else x

    write(torch.cat(keys), torch.cat(values), torch.cat([slots(s, range(n)) for s, n in enumerate(lens)]))
    for step in range(3):
        k, v = (torch.randn(seqs, kv_heads, dim, generator=gen).to(dtype).to(device) for _ in range(2))
        write(k, v, torch.cat([slots(s, [n + step]) for s, n in enumerate(lens)]))
        keys = [torch.cat([a, k[s : s + 1]]) for s, a in enumerate(keys)]
        values = [torch.cat([a, v[s : s + 1]]) for s, a in enumerate(values)]
        seq_lens = torch.tensor([n + step + 1 for n in lens], dtype=torch.int32, device=device)
        query = torch.randn(seqs, heads, dim, generator=gen).to(dtype).to(device)
        out = torch.ops.examples.paged_decode_attention(query, key_cache, value_cache, tables, seq_lens, *scales)
        stored = [sdpa(query[s], as_stored(keys[s], k_scale), as_stored(values[s], v_scale)) for s in range(seqs)]
        assert_close(out, torch.stack(stored), dtype)
        if fp8:
            # Against the keys and values before quantisation: on average within float8's unit
            # roundoff (each cached element is off by at most that, relatively; the output mixes them).
            exact = torch.stack([sdpa(query[s], keys[s], values[s]) for s in range(seqs)])
            assert (out.double() - exact).abs().mean() <= UNIT_ROUNDOFF[cache_dtype] * exact.abs().mean()


def call_with(change, **sizes):
    """The op on decode_inputs([5, 40], ...) (2 sequences, 4 heads on 2 kv heads, head dim 64,
    blocks of 16; ``sizes`` overrides) after ``change(args)``; returns the error message."""
    s = {"heads": 4, "kv_heads": 2, "head_dim": 64, "block_size": 16, **sizes}
    args = decode_inputs([5, 40], s["heads"], s["kv_heads"], s["head_dim"], s["block_size"], torch.float32, "cpu")
    change(args)
    with pytest.raises(ValueError) as err:
        torch.ops.examples.paged_decode_attention(*args[:5], *args[5:])
    assert str(err.value).startswith(HEAD)
    return str(err.value)[len(HEAD) :]


def test_bad_inputs_are_refused_by_name():
    def set_at(index, value):
        return lambda args: args.__setitem__(index, value(args))

    def set_value(index, where, value):
        return lambda args: args[index].__setitem__(where, value)

    # 6 heads on 4 kv heads: not whole groups
    assert (
        call_with(lambda a: None, heads=6, kv_heads=4)
        == "  expected query.size(1) % key_cache.size(2) == 0, got 2 == 0"
    )
    assert call_with(lambda a: None, head_dim=264) == "  expected query.size(2) <= 256, got 264 <= 256"
    assert call_with(lambda a: None, head_dim=12) == "  query: expected shape [*, *, multiple of 8], got [2, 4, 12]"
    assert call_with(set_at(3, lambda a: a[3].long())) == "  block_tables: expected dtype int32, got int64"
    assert call_with(set_at(2, lambda a: a[2][:, :8])) == (
        "  value_cache: expected shape [10, 16, 2, 64] (the shape of key_cache), got [10, 8, 2, 64]"
    )
    assert call_with(set_at(1, lambda a: a[1].half())) == (
        "  key_cache: expected dtype float32 (the dtype of query) where kv_cache_dtype is 'auto', got float16"
    )
    assert call_with(set_at(3, lambda a: a[3][:1])) == (
        "  block_tables: expected shape [query.size(0), *] = [2, *], got [1, 4]"
    )
    assert call_with(set_value(3, (1, 3), 10)) == (  # a padding entry, past sequence 1's pages, counts too
        "  block_tables: expected values in [0, key_cache.size(0)) = [0, 10), got 10 at [1, 3]"
    )
    for n in (65, -1):  # past the 4 pages of 16 tokens the table holds; negative
        assert call_with(set_value(4, 0, n)) == (
            "  seq_lens: expected values in [0, (block_tables.size(1) * key_cache.size(1)) + 1) = [0, 65), "
            f"got {n} at [0]"
        )
    assert call_with(lambda a: a.append(-1.0)) == "  scale: expected a value >= 0, got -1"


def test_bad_fp8_inputs_are_refused_by_name():
    """The cache dtype follows kv_cache_dtype; the scales are 0-dim float32 tensors."""

    def fp8(kv_cache_dtype, key=torch.float8_e4m3fn, value=torch.float8_e4m3fn, *scales):
        def change(args):
            args[1:3] = [args[1].to(key), args[2].to(value)]
            args += [0.0, kv_cache_dtype, *scales]

        return change

    assert call_with(fp8("fp8", torch.float32, torch.float32)) == (
        "  key_cache: expected dtype float8_e4m3fn where kv_cache_dtype is 'fp8', got float32"
    )
    assert call_with(fp8("fp8_e5m2")) == (
        "  key_cache: expected dtype float8_e5m2 where kv_cache_dtype is 'fp8_e5m2', got float8_e4m3fn"
    )
    assert call_with(fp8("fp8_e4m3", torch.float8_e4m3fn, torch.float8_e5m2)) == (
        "  value_cache: expected dtype float8_e4m3fn (the dtype of key_cache), got float8_e5m2"
    )
    assert call_with(fp8("auto")) == (
        "  key_cache: expected dtype float32 (the dtype of query) where kv_cache_dtype is 'auto', got float8_e4m3fn"
    )
    assert (
        call_with(fp8("int8")) == "  kv_cache_dtype: expected one of 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2', got 'int8'"
    )
    assert call_with(lambda a: (a.__setitem__(0, a[0].to(torch.int32)), fp8("fp8")(a))) == (
        "  query: expected dtype one of {float32, float64, float16, bfloat16}, got int32"
    )
    half = torch.tensor(1.0, dtype=torch.float16)
    assert call_with(fp8("fp8", torch.float8_e4m3fn, torch.float8_e4m3fn, half)) == (
        "  k_scale: expected dtype float32, got float16"
    )
    assert call_with(fp8("fp8", torch.float8_e4m3fn, torch.float8_e4m3fn, torch.ones(1), torch.ones(2, 1))) == (
        "  k_scale: expected rank 0, got rank 1 (shape [1])\n  v_scale: expected rank 0, got rank 2 (shape [2, 1])"
    )


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_verify(device):
    """opforge verify: on the CPU the reference against the equivalent (bfloat16 queries: every
    cache dtype and kv_cache_dtype value, while the float64 equivalent of every query dtype would
    take minutes), on CUDA the kernels against the reference in every combination; opcheck, Meta
    against real, out=, compile."""
    report = verify.verify_op(OP, device=device, seed=7, dtypes=["bfloat16"] if device == "cpu" else None)
    failures = [f"{r.check} {r.dtype} {r.case}: {r.message}" for r in report.failures]
    assert report.ok, f"{len(failures)} of {len(report.results)} checks failed:\n" + "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_compile_without_recompiles_across_batch_contexts_and_caches(device):
    """torch.compile(fullgraph=True, dynamic=True) of a decode step compiles once: other batch
    sizes, block-table widths, context lengths and cache sizes reuse it."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16

    def step(query, key_cache, value_cache, block_tables, seq_lens):
        return torch.ops.examples.paged_decode_attention(query * 2, key_cache, value_cache, block_tables, seq_lens) + 1

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    # First sizes all different (torch would otherwise assume equal sizes stay equal), none 0 or 1
    # (torch specialises those).
    compiled(*decode_inputs([3, 17, 30, 70, 9], 8, 2, 64, 16, dtype, device))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lens in ([40, 0, 5], [100, 7, 64, 33, 2], [0, 0, 0, 20], [3, 9]):
            args = decode_inputs(lens, 8, 2, 64, 16, dtype, device, spare_blocks=len(lens))
            torch.testing.assert_close(compiled(*args), step(*args), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def kernels_launched(fn) -> set[str]:
    """Names of the CUDA kernels ``fn()`` launches (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


#: The CUDA launch variants the kernel tests run under (OPFORGE_PAGED_DECODE_TUNING, a tuning
#: knob of the op's host code for benchmarks): the default (combine_kernel behind split_kernel,
#: splits of at least 128 tokens), the combine in split_kernel's last block, and both with splits of
#: one page or more (the most splits: more than combine_row has threads).
TUNINGS = ["", "combine=last_block", "combine=last_block,split_tokens=16", "combine=kernel,split_tokens=16"]


@pytest.fixture(params=TUNINGS, ids=lambda t: t or "default")
def tuning(request, monkeypatch):
    """Each CUDA launch variant of TUNINGS, set for the test."""
    if request.param:
        monkeypatch.setenv("OPFORGE_PAGED_DECODE_TUNING", request.param)
    else:
        monkeypatch.delenv("OPFORGE_PAGED_DECODE_TUNING", raising=False)
    return request.param


@requires_cuda
@SWEEP
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_kernels_match_the_reference(group, head_dim, block_size, dtype, tuning):
    args, scale = sweep_case(group, head_dim, block_size, dtype, "cuda")
    assert_close(torch.ops.examples.paged_decode_attention(*args, scale), reference(args, scale), dtype)


#: (seq_lens, heads, kv_heads, head_dim, block_size) on CUDA: contexts long enough to be split
#: over several thread blocks (a sequence alone on the device; sequences of very different
#: lengths, so that some have splits without tokens), the decode benchmark's shape at batch 64,
#: head dims whose 16-byte vectors leave lanes idle (40), fill a warp (256) or take one lane (8),
#: and groups that take several blocks per kv head (12, 16) or part of one (6).
LONG_CASES = [
    ([32768], 32, 8, 128, 16),
    ([10007], 8, 1, 64, 32),
    ([1, 9000, 0, 300], 4, 2, 128, 16),
    ([4096] * 63 + [4001], 32, 8, 128, 16),
    (list(range(0, 4096, 64)), 32, 8, 128, 32),
    ([77, 1500, 3], 6, 1, 40, 16),
    ([77, 1500, 3], 12, 1, 256, 16),
    ([77, 1500, 3], 16, 1, 8, 32),
    ([5000, 2], 16, 2, 128, 16),
]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", LONG_CASES, ids=lambda c: f"{len(c[0])}x{max(c[0])}-h{c[1]}-kv{c[2]}-d{c[3]}-b{c[4]}")
def test_cuda_kernels_on_long_contexts_batch_1_and_64(case, dtype, tuning):
    """Against SDPA in float64 on the GPU (the reference's match on the CPU tests above; the
    CPU reference itself takes too long at these sizes)."""
    lens, heads, kv_heads, head_dim, block_size = case
    args = decode_inputs(lens, heads, kv_heads, head_dim, block_size, dtype, "cuda")
    assert_close(torch.ops.examples.paged_decode_attention(*args), sdpa_decode(*args), dtype)


#: Head dims of the float8 kernel tests: rows of 16-byte vectors of 16 float8 elements leaving
#: lanes idle (80), filling 4, 8 and 16 lanes (64, 128, 256), and rows that are not whole 16-byte
#: vectors (40, 120: 8-byte loads of 8 elements).
FP8_HEAD_DIMS = [64, 128, 256, 80, 40, 120]


@requires_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("group, head_dim", [(g, d) for g in (1, 2, 4, 8) for d in FP8_HEAD_DIMS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_fp8_kernels_match_the_reference(group, head_dim, dtype, kv_cache_dtype, tuning):
    """The float8 caches' kernels (widened on load, the keys' scale folded into the query, the
    values' into the output) against the CPU reference, at every group size (8: two blocks per
    kv head at 16 float8 elements per lane)."""
    args, scale = sweep_case(group, head_dim, 16, dtype, "cuda")
    fp8, k_scale, v_scale = fp8_inputs(args, kv_cache_dtype)
    out = torch.ops.examples.paged_decode_attention(*fp8, scale, kv_cache_dtype, k_scale, v_scale)
    assert_close(out, reference(fp8, scale, kv_cache_dtype, k_scale, v_scale), dtype)


@requires_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize(
    "case", [LONG_CASES[i] for i in (0, 2, 3, 5, 8)], ids=lambda c: f"{len(c[0])}x{max(c[0])}-h{c[1]}-kv{c[2]}-d{c[3]}"
)
def test_cuda_fp8_kernels_on_long_contexts(case, kv_cache_dtype, tuning):
    """Split and combined contexts over float8 caches, against SDPA over the dequantised caches
    in float64 on the GPU."""
    lens, heads, kv_heads, head_dim, block_size = case
    args = decode_inputs(lens, heads, kv_heads, head_dim, block_size, torch.bfloat16, "cuda")
    fp8, k_scale, v_scale = fp8_inputs(args, kv_cache_dtype)
    out = torch.ops.examples.paged_decode_attention(*fp8, 0.0, kv_cache_dtype, k_scale, v_scale)
    assert_close(out, sdpa_decode(*dequantised(fp8, k_scale, v_scale)), torch.bfloat16)


@requires_cuda
@pytest.mark.parametrize("tuning", ["", "combine=last_block"], ids=["default", "last_block"], indirect=True)
def test_a_long_context_alone_is_split_and_combined(tuning):
    """One sequence of 32768 tokens on 8 kv heads fills the device only when split: the combine
    kernel runs behind the split kernel (by default), or split_kernel's last blocks combine
    (combine=last_block: no second kernel), and the result matches the reference."""
    args = decode_inputs([32768], 32, 8, 128, 16, torch.float16, "cuda")
    out = []
    names = kernels_launched(lambda: out.append(torch.ops.examples.paged_decode_attention(*args)))
    assert any("split_kernel" in n for n in names), names
    assert any("combine_kernel" in n for n in names) == (tuning == ""), names
    assert_close(out[0], reference(args), torch.float16)


@requires_cuda
@pytest.mark.parametrize("text", ["combine=fused", "split_tokens=0", "split_tokens=x", "combine=kernel,"])
def test_cuda_refuses_a_bad_tuning(text, monkeypatch):
    """OPFORGE_PAGED_DECODE_TUNING, the benchmarks' knob, is parsed whole or refused by name."""
    monkeypatch.setenv("OPFORGE_PAGED_DECODE_TUNING", text)
    args = decode_inputs([5], 4, 2, 64, 16, torch.float16, "cuda")
    with pytest.raises(ValueError) as err:
        torch.ops.examples.paged_decode_attention(*args)
    assert str(err.value) == (
        "examples::paged_decode_attention: OPFORGE_PAGED_DECODE_TUNING: expected comma-separated "
        f"combine=last_block|kernel and split_tokens=<1..65536>, got '{text}'"
    )


@requires_cuda
def test_cuda_empty_inputs_and_caches(tuning):
    """A batch of none; sequences with an empty block table (zeros); a cache of no blocks."""
    for lens, blocks in (([], 2), ([0, 0, 0], 2), ([0, 0], 0)):
        query = torch.randn(len(lens), 4, 64, dtype=torch.bfloat16, device="cuda")
        caches = [torch.randn(blocks, 16, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        tables = torch.zeros(len(lens), 0, dtype=torch.int32, device="cuda")
        lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        out = torch.ops.examples.paged_decode_attention(query, *caches, tables, lens)
        assert out.shape == query.shape and not out.any()


@requires_cuda
def test_cuda_refuses_float32():
    args = decode_inputs([5], 4, 2, 64, 16, torch.float32, "cuda")
    with pytest.raises(ValueError) as err:
        torch.ops.examples.paged_decode_attention(*args)
    assert str(err.value) == (
        HEAD
        + "  query: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no other), got float32"
    )
