"""The fp8 quantisation example ops (examples/ops/fp8_quant): examples::static_scaled_fp8_quant and
examples::dynamic_per_token_scaled_fp8_quant with vLLM's signatures and semantics. CPU references
against a plain torch expression of vLLM's rules, bit for bit; their rules; CUDA kernels against
the references, bit for bit (aligned and misaligned rows, rows past the block's registers);
verify on each device."""

from __future__ import annotations

import re

import pytest
import torch

import opforge
from conftest import DEVICES, requires_cuda
from opforge import verify

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
ACTIVATIONS = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module", autouse=True)
def fp8_quant():
    opforge.load_library(opforge.example_library("fp8_quant"))


def saturate(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``v`` to float8 ``dtype``, clamped to its finite range first (NaN kept)."""
    top = torch.finfo(dtype).max
    return v.clamp(-top, top).to(dtype)


def static_quant(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """vLLM's static quantisation in torch: x times the reciprocal of the scale, in float32."""
    return saturate(x.float() * scale.reciprocal(), dtype)


def per_token_quant(x: torch.Tensor, dtype: torch.dtype, scale_ub: torch.Tensor | None = None):
    """vLLM's dynamic per-token quantisation in torch: (result, scale [rows, 1])."""
    top = torch.finfo(dtype).max
    absmax = x.float().abs().nan_to_num(nan=0.0, posinf=float("inf")).amax(-1, keepdim=True)
    if scale_ub is not None:
        absmax = absmax.clamp(max=scale_ub)
    scale = (absmax / top).clamp(min=1 / (top * 512))
    return saturate(x.float() / scale, dtype), scale


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> str:
    """ "" if the float8 tensors hold the same bytes (any NaN equal to any NaN), else the first difference."""
    g, w = got.cpu().contiguous(), want.cpu().contiguous()
    bad = (g.view(torch.uint8) != w.view(torch.uint8)) & ~(g.float().isnan() & w.float().isnan())
    if not bad.any():
        return ""
    i = tuple(bad.nonzero()[0].tolist())
    return f"{int(bad.sum())} differ; first at {list(i)}: {g[i].item()}, expected {w[i].item()}"


def activations(rows: int, cols: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Normal values times 100 (some past float8_e4m3fn's range at a unit scale), a NaN, an
    infinity and a zero row."""
    x = (torch.randn(rows, cols, device=device) * 100).to(dtype)
    if rows > 2 and cols > 2:
        x[1, 2], x[2, 1], x[0] = float("nan"), float("inf"), 0.0
    return x


@pytest.mark.parametrize("dtype", FLOAT8)
@pytest.mark.parametrize("xtype", ACTIVATIONS)
def test_static_reference_is_vllms_rule(dtype, xtype):
    x, scale = activations(7, 40, xtype, "cpu"), torch.tensor([0.37])
    result = torch.empty(7, 40, dtype=dtype)
    torch.ops.examples.static_scaled_fp8_quant(result, x, scale)
    assert same_bytes(result, static_quant(x, scale, dtype)) == ""
    values = result.float()
    assert values[1, 2].isnan() and values[2, 1] == torch.finfo(dtype).max  # NaN kept, infinity saturated
    assert values.nan_to_num(nan=0.0).abs().max() == torch.finfo(dtype).max


@pytest.mark.parametrize("dtype", FLOAT8)
@pytest.mark.parametrize("xtype", ACTIVATIONS)
@pytest.mark.parametrize("ub", [None, 50.0])
def test_per_token_reference_is_vllms_rule(dtype, xtype, ub):
    x = activations(6, 33, xtype, "cpu")
    scale_ub = None if ub is None else torch.tensor([ub])
    result, scale = torch.empty(6, 33, dtype=dtype), torch.full((6, 1), -1.0)
    torch.ops.examples.dynamic_per_token_scaled_fp8_quant(result, x, scale, scale_ub)
    want, want_scale = per_token_quant(x, dtype, scale_ub)
    assert torch.equal(scale, want_scale)
    assert same_bytes(result, want) == ""
    top = torch.finfo(dtype).max
    assert scale[0].item() == pytest.approx(1 / (top * 512))  # a zero row takes the smallest scale


def test_rules_name_the_argument():
    op = torch.ops.examples.dynamic_per_token_scaled_fp8_quant
    head = (
        "examples::dynamic_per_token_scaled_fp8_quant(Tensor(a!) result, Tensor input, Tensor(b!) scale, "
        "Tensor? scale_ub=None) -> (): invalid arguments\n"
    )
    x = torch.randn(4, 8)
    with pytest.raises(
        ValueError,
        match="^" + re.escape(head + "  result: expected dtype one of {float8_e4m3fn, float8_e5m2}, got float16") + "$",
    ):
        op(torch.empty(4, 8, dtype=torch.float16), x, torch.empty(4, 1))
    with pytest.raises(
        ValueError,
        match="^" + re.escape(head + "  scale: expected shape [result.size(0), 1] = [4, 1], got [5, 1]") + "$",
    ):
        op(torch.empty(4, 8, dtype=torch.float8_e4m3fn), x, torch.empty(5, 1))


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_kernels_compile_for_every_dtype_pair_without_a_gpu(arch, tmp_path):
    """NVRTC builds each kernel for each result and input dtype (float8 types from cuda_fp8.h
    through opforge/kernel.cuh); sm_80 has no float8 instructions and converts in software."""
    for name in ("static_scaled_fp8_quant", "dynamic_per_token_scaled_fp8_quant"):
        for dtype in FLOAT8:
            for xtype in ACTIVATIONS:
                opforge.precompile(
                    f"examples::{name}", {"result": dtype, "input": xtype}, arch=arch, cache_dir=tmp_path
                )  # raises OpforgeError with NVRTC's log where a kernel does not compile
    binaries = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(binaries) >= 2 * len(FLOAT8) * len(ACTIVATIONS), binaries


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT8)
@pytest.mark.parametrize("xtype", ACTIVATIONS)
@pytest.mark.parametrize("cols", [8, 40, 4096, 8200, 3 * 4096 + 16, 33])
def test_cuda_kernels_match_the_references_bit_for_bit(dtype, xtype, cols):
    x = activations(9, cols, xtype, "cuda")
    scale = torch.tensor([0.37], device="cuda")
    got = torch.empty(9, cols, dtype=dtype, device="cuda")
    torch.ops.examples.static_scaled_fp8_quant(got, x, scale)
    assert same_bytes(got, static_quant(x.cpu(), scale.cpu(), dtype)) == ""
    for ub in (None, torch.tensor([50.0], device="cuda")):
        got, s = torch.empty(9, cols, dtype=dtype, device="cuda"), torch.empty(9, 1, device="cuda")
        torch.ops.examples.dynamic_per_token_scaled_fp8_quant(got, x, s, ub)
        want, want_s = per_token_quant(x.cpu(), dtype, None if ub is None else ub.cpu())
        assert torch.equal(s.cpu(), want_s)
        assert same_bytes(got, want) == ""
    # A misaligned input (a view one element in) takes the element-by-element path.
    flat = torch.randn(9 * cols + 1, device="cuda").to(xtype)[1:].view(9, cols)
    got = torch.empty(9, cols, dtype=dtype, device="cuda")
    torch.ops.examples.static_scaled_fp8_quant(got, flat, scale)
    assert same_bytes(got, static_quant(flat.cpu(), scale.cpu(), dtype)) == ""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["static_scaled_fp8_quant", "dynamic_per_token_scaled_fp8_quant"])
def test_verify(device, name):
    report = verify.verify_op(f"examples::{name}", device=device, seed=11)
    assert report.ok, [(r.check, r.dtype, r.case, r.message) for r in report.failures]
