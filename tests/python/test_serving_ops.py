"""The serving example ops that write their inputs -- examples::fused_add_rms_norm,
rotary_embedding, kv_cache_write -- and silu_and_mul: CPU references against plain torch, CUDA
kernels against the references (views of a fused qkv projection, partial rotary, both layouts,
padding slots, rows up to 8192), their rules and value domains, compile and verify."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import serving
from conftest import DEVICES, requires_cuda
from opforge import verify

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "models"))
from model_check import TorchOps  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def serving_ops():
    serving.load()


def torch_result(name, args):
    """The same call through model_check.TorchOps (in float64): the written inputs, then outputs."""
    work = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    out = getattr(TorchOps, name)(*work)
    op = serving.opforge.find_op(f"examples::{name}")
    written = [work[a.index] for a in op.mutated if work[a.index] is not None]
    return ([] if out is None else [out]) + written


def opforge_result(name, args):
    op = serving.opforge.find_op(f"examples::{name}")
    return list(serving.results(op, getattr(torch.ops.examples, name), serving.fresh(args)))


def assert_close_to_torch(name, args, dtype):
    for got, want in zip(opforge_result(name, args), torch_result(name, args)):
        tol = {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, serving.TOL.get(dtype, 1e-2))
        torch.testing.assert_close(got.double().cpu(), want.double().cpu(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_references_match_plain_torch(dtype):
    assert_close_to_torch("fused_add_rms_norm", serving.fused_add_rms_norm(5, 96, dtype, "cpu"), dtype)
    if dtype != torch.float64:  # the others take 32- and 16-bit floats
        assert_close_to_torch("silu_and_mul", serving.silu_and_mul(4, 40, dtype, "cpu"), dtype)
        for neox in (True, False):
            for key in (True, False):
                args = serving.rotary(6, 4, 64, 32, dtype, "cpu", neox=neox, key=key)  # partial: 32 of 64
                assert_close_to_torch("rotary_embedding", args, dtype)
        assert_close_to_torch("kv_cache_write", serving.kv_cache(9, 2, 16, 4, 4, dtype, "cpu"), dtype)


def test_rotary_writes_only_the_rotated_part_through_the_qkv_views():
    positions, q, cache, k, _ = serving.rotary(3, 4, 64, 32, torch.float32, "cpu")
    qkv = q._base.clone()
    torch.ops.examples.rotary_embedding(positions, q, cache, k, True)
    changed = (q._base != qkv).nonzero()[:, 1] % 64
    assert changed.max() < 32  # the second half of every head (past rot_dim) is untouched
    assert torch.equal(q._base[:, 6 * 64 :], qkv[:, 6 * 64 :])  # the value part of qkv too


def test_rules_and_value_domains_are_checked_before_the_reference_runs():
    positions, q, cache, k, _ = serving.rotary(3, 4, 16, 32, torch.float32, "cpu")
    with pytest.raises(ValueError) as err:  # rot_dim 32 > head_dim 16
        torch.ops.examples.rotary_embedding(positions, q, cache, k)
    assert str(err.value) == (
        "examples::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor cos_sin_cache, Tensor(b!)? key=None, "
        "bool is_neox=True) -> (): invalid arguments\n"
        "  expected cos_sin_cache.size(1) <= query.size(2), got 32 <= 16"
    )
    positions, q, cache, k, _ = serving.rotary(3, 4, 64, 32, torch.float32, "cpu")
    positions[1] = cache.shape[0]
    with pytest.raises(ValueError) as err:
        torch.ops.examples.rotary_embedding(positions, q, cache, k)
    assert str(err.value).endswith(
        f"  positions: expected values in [0, cos_sin_cache.size(0)) = [0, {cache.shape[0]}), got {cache.shape[0]} at "
        "[1]"
    )
    key, value, key_cache, value_cache, _ = serving.kv_cache(6, 2, 16, 4, 4, torch.float32, "cpu")
    slots = torch.tensor([0, -1, 2, -1, 3, 3])
    with pytest.raises(ValueError) as err:
        torch.ops.examples.kv_cache_write(key, value, key_cache, value_cache, slots)
    assert str(err.value).endswith("  slot_mapping: expected distinct values (but -1), got 3 at [4] and [5]")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_kernels_match_the_references(dtype):
    for rows, cols in ((1, 8), (7, 96), (3, 4097), (5, 8192), (0, 64), (4, 0)):
        assert not serving.compare_with_reference(
            "fused_add_rms_norm", serving.fused_add_rms_norm(rows, cols, dtype, "cuda"), dtype
        ), (rows, cols)
    for tokens, heads, head_dim, rot in ((1, 1, 64, 64), (7, 4, 128, 64), (33, 8, 64, 32), (0, 2, 64, 64)):
        for neox in (True, False):
            for key in (True, False):
                args = serving.rotary(tokens, heads, head_dim, rot, dtype, "cuda", neox=neox, key=key)
                assert not serving.compare_with_reference("rotary_embedding", args, dtype), (tokens, neox, key)
    for tokens, heads, head_dim in ((1, 1, 8), (13, 4, 64), (300, 8, 128)):
        args = serving.kv_cache(tokens, heads, head_dim, 64, 16, dtype, "cuda")
        assert not serving.compare_with_reference("kv_cache_write", args, dtype), tokens
    for rows, d in ((1, 1), (3, 37), (5, 4096), (0, 8)):
        assert not serving.compare_with_reference("silu_and_mul", serving.silu_and_mul(rows, d, dtype, "cuda"), dtype)


@requires_cuda
def test_in_place_ops_under_cuda_graphs():
    x, residual, weight, eps = serving.fused_add_rms_norm(64, 1024, torch.bfloat16, "cuda")
    x0, r0 = x.clone(), residual.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compiles and loads the kernel
        torch.ops.examples.fused_add_rms_norm(x.clone(), residual.clone(), weight, eps)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        torch.ops.examples.fused_add_rms_norm(x, residual, weight, eps)
    x.copy_(x0)
    residual.copy_(r0)
    graph.replay()
    torch.cuda.synchronize()
    expected_x, expected_r = x0.cpu().clone(), r0.cpu().clone()
    torch.ops.examples.fused_add_rms_norm(expected_x, expected_r, weight.cpu(), eps)
    torch.testing.assert_close(residual.cpu(), expected_r)
    torch.testing.assert_close(x.cpu(), expected_x, atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_without_recompiles(device):
    def step(x, residual, weight, positions, cache, slots, key_cache, value_cache):
        torch.ops.examples.fused_add_rms_norm(x, residual, weight, 1e-6)
        q = x.view(x.shape[0], 4, 16)
        torch.ops.examples.rotary_embedding(positions, q, cache, None, True)
        torch.ops.examples.kv_cache_write(q, q, key_cache, value_cache, slots)
        return torch.ops.examples.silu_and_mul(x) + 1

    def inputs(tokens):
        x, residual, weight, _ = serving.fused_add_rms_norm(tokens, 64, torch.float32, device)
        cache = torch.randn(32, 16, device=device)
        positions = torch.randint(0, 32, (tokens,), device=device)
        caches = [torch.zeros(8, 8, 4, 16, device=device) for _ in range(2)]
        slots = torch.randperm(64, device=device)[:tokens]
        return [x, residual, weight, positions, cache, slots, *caches]

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    compiled(*inputs(3))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for tokens in (5, 11, 17):
            args = inputs(tokens)
            mine, theirs = serving.fresh(args), serving.fresh(args)
            torch.testing.assert_close(compiled(*mine), step(*theirs))
            for a, b in zip(mine, theirs):
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", serving.SERVING_OPS)
def test_verify(device, name):
    report = verify.verify_op(f"examples::{name}", device=device, seed=11)
    assert report.ok, [(r.check, r.dtype, r.case, r.message) for r in report.failures]


@pytest.mark.parametrize("device", DEVICES)
def test_written_inputs_sharing_memory_or_left_out_are_refused_before_any_launch(device):
    op, w = torch.ops.examples.fused_add_rms_norm, torch.randn(8, device=device)
    head = "examples::fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps=1e-06) -> ()"
    shared = "x: expected memory of its own (it is written in place), got memory shared with residual; pass x.clone()"
    x = torch.randn(4, 8, device=device)
    before = x.clone()
    for args in ((x, x), (x[0:2], x[1:3])):  # the same tensor; rows that overlap
        with pytest.raises(ValueError) as err:
            op(*args, w, 1e-6)
        assert str(err.value) == f"{head}: invalid arguments\n  {shared}"
    torch.testing.assert_close(x, before)  # nothing was written
    op(x[0:2], x[2:4], w, 1e-6)  # disjoint rows of one tensor are fine
    for grad in (False, True):
        with torch.set_grad_enabled(grad), pytest.raises(ValueError) as err:
            op(torch.randn(4, 8, device=device), None, w, 1e-6)
        assert str(err.value) == f"{head}: invalid arguments\n  residual: expected a tensor, got None"


def test_writing_views_that_take_part_in_autograd_writes_them_and_a_backward_raises():
    """Query and key as slices of one projection that requires grad (as a decoder splits qkv):
    the op writes both slices as without autograd, and a backward through it raises as for any
    op without a backward op (not torch's internal assert on rebasing views)."""
    tokens, heads, dim = 5, 2, 8
    proj = torch.nn.Linear(16, 2 * heads * dim)
    x, cache, pos = torch.randn(tokens, 16), torch.randn(32, dim), torch.arange(5)

    def rotated(grad: bool) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            qkv = proj(x)
            q = qkv[:, : heads * dim].view(tokens, heads, dim)
            k = qkv[:, heads * dim :].view(tokens, heads, dim)
            torch.ops.examples.rotary_embedding(pos, q, cache, k, True)
            return qkv

    written = rotated(True)
    torch.testing.assert_close(written, rotated(False))
    with pytest.raises(RuntimeError, match="^derivative for examples::rotary_embedding is not implemented$"):
        written.sum().backward()
