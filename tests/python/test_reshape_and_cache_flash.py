"""examples::reshape_and_cache_flash (examples/ops/kv_cache_write), vLLM's paged KV-cache write
with its exact signature: a dtype rule that follows the kv_cache_dtype parameter ("auto": the
key's dtype; "fp8", "fp8_e4m3": float8_e4m3fn; "fp8_e5m2": float8_e5m2). CPU reference against
vLLM's rule in plain torch and against the op's .equivalent(), bit for bit; the dtype
combinations verify draws; refused combinations; torch.compile and torch.export with the
parameter; NVRTC builds of every instantiation; CUDA kernel against the reference."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

import opforge
from conftest import DEVICES, requires_cuda
from opforge import verify
from opforge.verify.cases import dtype_cases

ROOT = Path(__file__).resolve().parents[2]
KEYS = (torch.float32, torch.float16, torch.bfloat16)
#: kv_cache_dtype -> the cache dtype it selects (None: the key's).
CACHE = {"auto": None, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
HEAD = (
    "examples::reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
    "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> (): invalid arguments\n"
)


@pytest.fixture(scope="module", autouse=True)
def kv_cache_write():
    return opforge.load_library(opforge.example_library("kv_cache_write"))


def inputs(tokens: int, kv_cache_dtype: str, dtype: torch.dtype, device: str = "cpu", heads: int = 2, dim: int = 16):
    """key, value [tokens, heads, dim] (values past float8's range, a NaN and an infinity), caches of
    blocks of 4 slots (4 blocks, or one a token past 16 tokens) in the dtype kv_cache_dtype
    selects, filled with a marker (so a slot not written keeps it), distinct slots with every
    third token padding (-1), scales 0.37 and 1.7."""
    g = torch.Generator().manual_seed(tokens)
    key = (torch.randn(tokens, heads, dim, generator=g) * 300).to(dtype)
    value = (torch.randn(tokens, heads, dim, generator=g) * 300).to(dtype)
    key[0, 0, 1], value[0, 1, 2] = float("nan"), float("inf")
    cache = CACHE[kv_cache_dtype] or dtype
    blocks = 4 if tokens <= 16 else tokens
    key_cache = torch.full((blocks, 4, heads, dim), 7.0).to(cache)
    value_cache = torch.full((blocks, 4, heads, dim), -7.0).to(cache)
    slots = torch.randperm(blocks * 4, generator=g)[:tokens]
    slots[::3] = -1
    args = [key, value, key_cache, value_cache, slots, kv_cache_dtype, torch.tensor(0.37), torch.tensor(1.7)]
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def vllms_rule(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale):
    """vLLM's reshape_and_cache_flash in plain torch, one token at a time: the caches after it."""
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
            row = x[t]
            if kv_cache_dtype != "auto":
                top = torch.finfo(cache.dtype).max
                row = (row.float() / scale).clamp(-top, top).to(cache.dtype)  # saturating, NaN kept
            cache[slot // cache.shape[1], slot % cache.shape[1]] = row
    return key_cache, value_cache


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether two tensors hold the same bytes (any NaN equal to any NaN)."""
    g, w = got.cpu().contiguous(), want.cpu().contiguous()
    same = g.view(torch.uint8) == w.view(torch.uint8)
    nan = (g.float().isnan() & w.float().isnan()).repeat_interleave(g.element_size(), -1)
    return bool((same | nan).all())


@pytest.mark.parametrize("kv_cache_dtype", list(CACHE))
@pytest.mark.parametrize("dtype", KEYS)
def test_reference_is_vllms_rule_and_the_equivalent(kv_cache_dtype, dtype):
    args = inputs(9, kv_cache_dtype, dtype)
    want = vllms_rule(*args)
    equivalent = opforge.find_op("examples::reshape_and_cache_flash").equivalent
    names = ["key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale"]
    from_equivalent = eval(equivalent, {"torch": torch, **dict(zip(names, args, strict=True))})  # noqa: S307
    torch.ops.examples.reshape_and_cache_flash(*args)
    for got, expected, by_equivalent in zip(args[2:4], want, from_equivalent, strict=True):
        assert same_bytes(got, expected)
        assert same_bytes(by_equivalent, expected)
    if kv_cache_dtype != "auto":  # the padding's slots untouched
        assert (args[2].float() == 7.0).any()
    if CACHE[kv_cache_dtype] == torch.float8_e4m3fn:  # keys / 0.37 pass 448: saturated, not infinite or NaN
        assert args[2].float().nan_to_num(0.0).abs().max() == torch.finfo(torch.float8_e4m3fn).max


def test_verify_draws_only_the_dtypes_each_value_selects():
    op = opforge.find_op("examples::reshape_and_cache_flash")
    seen = {(c["kv_cache_dtype"], c["key"], c["key_cache"], c["value_cache"]) for c in op.dtype_combinations}
    want = set()
    for value, cache in CACHE.items():
        for key in ("float32", "float16", "bfloat16"):
            name = key if cache is None else str(cache).removeprefix("torch.")
            want.add((value, key, name, name))
    assert seen == want
    labels = {c.label: c.params for c in dtype_cases(op, ["bfloat16"])}
    assert labels == {
        "bfloat16 (kv_cache_dtype=auto)": {"kv_cache_dtype": "auto"},
        "bfloat16 (key_cache=float8_e4m3fn, value_cache=float8_e4m3fn, kv_cache_dtype=fp8)": {"kv_cache_dtype": "fp8"},
        "bfloat16 (key_cache=float8_e4m3fn, value_cache=float8_e4m3fn, kv_cache_dtype=fp8_e4m3)": {
            "kv_cache_dtype": "fp8_e4m3"
        },
        "bfloat16 (key_cache=float8_e5m2, value_cache=float8_e5m2, kv_cache_dtype=fp8_e5m2)": {
            "kv_cache_dtype": "fp8_e5m2"
        },
    }


def refused(args: list, line: str):
    """A call of the op with ``args``, which must raise the op's ValueError with the one line ``line``."""
    with pytest.raises(ValueError, match="^" + re.escape(HEAD + "  " + line) + "$"):
        torch.ops.examples.reshape_and_cache_flash(*args)


def test_a_cache_of_the_other_rule_is_refused_naming_the_value():
    args = inputs(5, "fp8", torch.bfloat16)
    args[5] = "auto"
    refused(
        args, "key_cache: expected dtype bfloat16 (the dtype of key) where kv_cache_dtype is 'auto', got float8_e4m3fn"
    )
    args = inputs(5, "auto", torch.bfloat16)
    args[5] = "fp8_e4m3"
    refused(args, "key_cache: expected dtype float8_e4m3fn where kv_cache_dtype is 'fp8_e4m3', got bfloat16")
    args = inputs(5, "fp8", torch.bfloat16)
    args[3] = args[3].to(torch.float8_e5m2)
    refused(args, "value_cache: expected dtype float8_e4m3fn (the dtype of key_cache), got float8_e5m2")


def test_compile_and_export_evaluate_the_rule_with_the_parameter():
    def write(key, value, key_cache, value_cache, slots, k_scale, v_scale):
        torch.ops.examples.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, "fp8", k_scale, v_scale)
        return key_cache, value_cache

    args = inputs(9, "fp8", torch.bfloat16)
    want = vllms_rule(*args)
    del args[5]
    compiled = torch.compile(write, fullgraph=True)
    for got, expected in zip(compiled(*args), want, strict=True):
        assert same_bytes(got, expected)
    bad = inputs(9, "auto", torch.bfloat16)  # a bfloat16 cache under "fp8": refused while tracing
    del bad[5]
    with pytest.raises(
        Exception, match=re.escape("key_cache: expected dtype float8_e4m3fn where kv_cache_dtype is 'fp8'")
    ):
        torch.compile(write, fullgraph=True)(*bad)

    class Write(torch.nn.Module):
        def forward(self, key, value, key_cache, value_cache, slots, k_scale, v_scale):
            return write(key, value, key_cache, value_cache, slots, k_scale, v_scale)

    args = inputs(9, "fp8", torch.bfloat16)
    del args[5]
    program = torch.export.export(Write(), tuple(a.clone() for a in args))
    assert any("fp8" in (*n.args, *n.kwargs.values()) for n in program.graph.nodes)  # a constant of the graph
    for got, expected in zip(program.module()(*args), want, strict=True):
        assert same_bytes(got, expected)


def test_stubs_and_the_description_say_the_rule(kv_cache_write, tmp_path):
    from opforge.stubs import write_stubs

    stub = next(p for p in write_stubs(kv_cache_write, tmp_path) if p.suffix == ".pyi").read_text()
    assert (
        "Dtypes: key: float32 | float16 | bfloat16; value: the dtype of key; key_cache: the dtype of key where "
        "kv_cache_dtype is 'auto', float8_e5m2 where kv_cache_dtype is 'fp8_e5m2', else float8_e4m3fn; "
        "value_cache: the dtype of key_cache; slot_mapping: int64; k_scale: float32; v_scale: float32."
    ) in stub
    (auto, e5m2) = opforge.find_op("examples::reshape_and_cache_flash").arg("key_cache").dtype_cases
    assert (auto.param, auto.value, auto.same_dtype) == ("kv_cache_dtype", "auto", "key")
    assert (e5m2.value, e5m2.dtypes, e5m2.same_dtype) == ("fp8_e5m2", ("float8_e5m2",), None)


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_kernels_compile_for_every_value_and_key_dtype_without_a_gpu(arch, tmp_path):
    for value, cache in CACHE.items():
        for dtype in KEYS:
            opforge.precompile(
                "examples::reshape_and_cache_flash",
                {"key": dtype, "key_cache": cache or dtype},
                {"kv_cache_dtype": value},
                arch=arch,
                cache_dir=tmp_path,
            )  # raises with NVRTC's log where a kernel does not compile
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape(HEAD + "  kv_cache_dtype: expected a value for this compile-time parameter, which has no default")
        + "$",
    ):
        opforge.precompile("examples::reshape_and_cache_flash", {"key": torch.bfloat16}, arch=arch)
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape(HEAD + "  key_cache: expected dtype float8_e4m3fn where kv_cache_dtype is 'fp8', got bfloat16")
        + "$",
    ):
        opforge.precompile(
            "examples::reshape_and_cache_flash",
            {"key": torch.bfloat16, "key_cache": torch.bfloat16},
            {"kv_cache_dtype": "fp8"},
            arch=arch,
        )


@requires_cuda
@pytest.mark.parametrize("kv_cache_dtype", list(CACHE))
@pytest.mark.parametrize("dtype", KEYS)
@pytest.mark.parametrize("tokens", [1, 9, 16])
def test_cuda_kernel_matches_the_reference_bit_for_bit(kv_cache_dtype, dtype, tokens):
    args = inputs(tokens, kv_cache_dtype, dtype, "cuda", heads=8, dim=128)
    want = vllms_rule(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    torch.ops.examples.reshape_and_cache_flash(*args)
    for got, expected in zip(args[2:4], want, strict=True):
        assert same_bytes(got, expected)


@requires_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("tokens", [2047, 4097])
def test_cuda_kernel_at_thousands_of_tokens_matches_the_reference(kv_cache_dtype, tokens):
    """A block a token, more blocks than the GPU holds at once (those of the second wave start
    after the check has ended): the caches equal the CPU reference's, padding slots and all."""
    args = inputs(tokens, kv_cache_dtype, torch.bfloat16, "cuda", heads=8, dim=128)
    want = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    torch.ops.examples.reshape_and_cache_flash(*want)
    torch.ops.examples.reshape_and_cache_flash(*args)
    for got, expected in zip(args[2:4], want[2:4], strict=True):
        assert same_bytes(got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_verify(device):
    report = verify.verify_op("examples::reshape_and_cache_flash", device=device, seed=11)
    assert report.ok, [(r.check, r.dtype, r.case, r.message) for r in report.failures]


def test_a_rule_without_otherwise_does_not_compile(tmp_path):
    """opforge::when(...) without .otherwise(rule) leaves some values without a rule: the
    declaration stops at compile time with one sentence (a static_assert)."""
    src = tmp_path / "partial.cpp"
    src.write_text(
        "#include <opforge/op.h>\n"
        "static void ref(opforge::Tensor, opforge::MutableTensor, std::string_view) {}\n"
        'OPFORGE_OP(unit, partial).input("x", opforge::kFloat16)'
        '.input("c", opforge::when("mode", "auto", opforge::same_dtype("x")), opforge::mutated)'
        '.param<std::string>("mode").reference(ref);\n'
    )
    proc = subprocess.run(
        ["c++", "-std=c++20", "-fsyntax-only", f"-I{ROOT / 'include'}", str(src)], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "opforge: opforge::when(...) needs .otherwise(rule): the dtype rule of the values no case names" in (
        proc.stderr
    )


def test_jax_refuses_a_cache_of_the_other_rule_at_trace_time():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import opforge.jax as ojax

    ojax.load_library(opforge.example_library("kv_cache_write"))
    key = jnp.zeros((5, 2, 16), jnp.float32)
    cache = jnp.zeros((4, 4, 2, 16), jnp.float32)
    slots = jnp.array([0, 1, -1, 2, 3], jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
    scale = jnp.ones((), jnp.float32)
    with pytest.raises(ValueError) as err:
        ojax.ops.examples.reshape_and_cache_flash(key, key, cache, cache, slots, "fp8", scale, scale)
    assert "\n  key_cache: expected dtype float8_e4m3fn where kv_cache_dtype is 'fp8', got float32" in str(err.value)
