"""The float8 dtypes (Note [Float8 dtypes] in opforge/dtype.h): opforge's host types convert as
torch's own conversions do, over every byte and many float32 values (overflow, NaN, subnormals,
ties); the torch adapter maps the dtypes; verify draws float8 inputs over their finite range and
compares float8 results bit for bit. Fixtures: fixtures/float8_ops.cpp. The fp8 example ops
(quantisation, the fp8 KV-cache write) are tested in test_fp8_ops.py."""

from __future__ import annotations

import re

import pytest
import torch

import opforge
from opforge import verify
from opforge.verify.cases import random_tensor
from opforge.verify.compare import compare

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu)


def _floats() -> torch.Tensor:
    """float32 values that reach every branch of a float8 conversion: every float8 value of each
    format, the midpoints between neighbours (ties) and the floats on either side of them, values
    past each format's largest one, infinities, NaN, float32 subnormals and zeros, and 2^20 random
    bit patterns."""
    values = []
    for dtype in FLOAT8:
        exact = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        exact = exact[exact.isfinite()].unique()
        mids = ((exact[1:].double() + exact[:-1].double()) / 2).float()
        up, down = torch.full_like(mids, float("inf")), torch.full_like(mids, -float("inf"))
        values += [exact, mids, torch.nextafter(mids, up), torch.nextafter(mids, down)]
    specials = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 448.0, 463.99, 464.0, 470.0, 480.0, 1e30]
    specials += [57344.0, 61439.0, 61440.0, 65536.0, 2.0**-126, 2.0**-149, 3 * 2.0**-149, 2.0**127 * 1.5]
    values.append(torch.tensor(specials))
    bits = torch.randint(-(2**31), 2**31, (1 << 20,), generator=torch.Generator().manual_seed(0))
    values.append(bits.int().view(torch.float32))
    x = torch.cat([v.float() for v in values])
    return torch.cat([x, -x])


def _same_bytes(got: torch.Tensor, want: torch.Tensor) -> str:
    """ "" if ``got`` and ``want`` (one float8 dtype) hold the same bytes, else the first difference."""
    g, w = got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    bad = (g != w).nonzero()
    if not bad.numel():
        return ""
    i = int(bad[0, 0])
    return f"{int(bad.shape[0])} differ; first at {i}: 0x{int(g[i]):02x}, torch 0x{int(w[i]):02x}"


def test_every_byte_converts_to_float_as_torch_does(float8_ops):
    for dtype in FLOAT8:
        x = torch.arange(256, dtype=torch.uint8).view(dtype)
        got, want = torch.ops.fixture.from_float8(x), x.float()
        same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
        assert bool(same.all()), (dtype, same.logical_not().nonzero()[:4].flatten().tolist())


def test_floats_round_to_float8_as_torch_does(float8_ops):
    x = _floats()
    outs = torch.ops.fixture.to_float8(x)
    for got, dtype in zip(outs, FLOAT8, strict=True):
        assert got.dtype == dtype
        assert _same_bytes(got, x.to(dtype)) == "", dtype


def test_saturated_conversion_clamps_to_the_finite_range_and_keeps_nan(float8_ops):
    x = _floats()
    outs = torch.ops.fixture.to_float8(x, saturate=True)
    for got, dtype in zip(outs[:2], FLOAT8[:2], strict=True):
        top = torch.finfo(dtype).max
        want = torch.where(x.isnan(), x, x.clamp(-top, top)).to(dtype)
        assert _same_bytes(got, want) == "", dtype
        assert not got.float().isinf().any()


def test_the_torch_adapter_maps_each_float8_dtype(float8_ops):
    op = opforge.find_op("fixture::from_float8")
    assert op.arg("x").dtypes == ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
    assert [o.dtype for o in opforge.find_op("fixture::to_float8").outputs] == [
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e8m0fnu",
    ]
    message = (
        "fixture::from_float8(Tensor x) -> Tensor: invalid arguments\n"
        "  x: expected dtype one of {float8_e4m3fn, float8_e5m2, float8_e8m0fnu}, got float32"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.fixture.from_float8(torch.ones(3))
    # Meta kernels and fake tensors carry the dtypes.
    e4m3, e5m2, e8m0 = torch.ops.fixture.to_float8(torch.ones(2, 3, device="meta"))
    assert (e4m3.dtype, e5m2.dtype, e8m0.dtype) == FLOAT8 and e4m3.shape == (2, 3)


@pytest.mark.parametrize("dtype", FLOAT8)
def test_verify_draws_float8_inputs_over_the_finite_range(dtype):
    t = random_tensor([4096], dtype, torch.Generator().manual_seed(3))
    values = t.float()
    assert values.isfinite().all()
    finite = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    finite = finite[finite.isfinite()]
    # The whole range: the largest values and the smallest, zeros and subnormals where the format has them.
    assert values.max() == finite.max() and values.min() == finite.min()
    assert len(values.unique()) > 0.9 * len(finite.unique())


def test_float8_results_are_compared_bit_for_bit():
    ref = torch.tensor([1.0, 2.0, float("nan"), -0.0]).to(torch.float8_e4m3fn)
    assert compare(ref.clone(), ref, "bfloat16")[0]
    off = ref.clone()
    off.view(torch.uint8)[1] += 1  # 2.0 -> 2.25: one unit in the last place, far within bfloat16's tolerance
    ok, _, _, why = compare(off, ref, "bfloat16")
    assert not ok
    assert why == (
        "1 of 4 elements differ; first at [1]: 0x41 (2.25), expected 0x40 (2.0) in float8_e4m3fn, compared bit for bit"
    )
    zero = ref.clone()
    zero.view(torch.uint8)[3] = 0  # +0 for -0: another byte
    assert not compare(zero, ref, "bfloat16")[0]
    # A declared tolerance for the dtype replaces the bit-for-bit rule.
    assert compare(off, ref, "bfloat16", float8_tolerances={"float8_e4m3fn": (0.25, 0.0)})[0]


def test_verify_passes_an_op_with_float8_inputs(float8_ops):
    report = verify.verify_op("fixture::from_float8", device="cpu", seed=7)
    assert report.ok, [(r.case, r.message) for r in report.failures]
    values = {(r.dtype, r.case) for r in report.results if r.check == "values" and r.status == "pass"}
    for dtype in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        assert (dtype, "nan/inf") in values and (dtype, "shape 33x255") in values


def test_stubs_name_the_float8_dtypes(float8_ops, tmp_path):
    from opforge.stubs import write_stubs

    stub = next(p for p in write_stubs(float8_ops, tmp_path) if p.suffix == ".pyi").read_text()
    assert "Dtypes: x: float8_e4m3fn | float8_e5m2 | float8_e8m0fnu." in stub
    assert "Dtypes: x: float32." in stub


def test_autocast_never_casts_a_float8_input(float8_ops):
    x = torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e5m2)
    scale = torch.tensor([0.5], dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.ops.fixture.dequantise(x, scale)  # the scale is cast to float32, x stays float8
    assert y.dtype == torch.float32
    assert y.tolist() == [0.5, -1.0, 224.0]


def _dividends() -> torch.Tensor:
    """float32 values for a quotient: every bfloat16 and every float16 value, 2^18 random float32
    bit patterns, and 2^-100 (the smallest |x| the Divider's three-instruction form takes) with
    its neighbours; 4k + 3 of them, so both forms of the kernel run."""
    every16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    bits = torch.randint(-(2**31), 2**31, (1 << 18,), generator=torch.Generator().manual_seed(0))
    edge = torch.tensor([2.0**-100, -(2.0**-100)])
    edge = torch.cat([edge, torch.nextafter(edge, torch.zeros(2)), torch.nextafter(edge, edge * 2)])
    x = torch.cat([every16.view(torch.bfloat16).float(), every16.view(torch.float16).float(), bits.view(torch.float32)])
    x = torch.cat([x, edge])
    return x[: x.numel() // 4 * 4 - 1]


def _scales() -> list[float]:
    """Divisors: powers of two over the normal range, their neighbours (a reciprocal's hardest
    cases), random floats, both signs; and the ones the fast form leaves to division (zero, a
    subnormal, the largest float, whose reciprocal is subnormal, infinity, NaN)."""
    scales = []
    for k in range(-126, 128, 9):
        p = torch.tensor(2.0**k)
        scales += [p, torch.nextafter(p, p * 2), torch.nextafter(p, p / 2)]
    scales += list(torch.rand(24, generator=torch.Generator().manual_seed(1)).exp2() * 10.0 ** torch.arange(-12, 12))
    scales = [float(s) for s in scales] + [0.37, 1.7, 0.05]
    return scales + [-s for s in scales] + [0.0, 1e-40, 3.4028234663852886e38, float("inf"), float("nan")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_the_device_divider_is_ieee_division_bit_for_bit(float8_ops):
    """opforge::kernel::Divider (the float8 writers' x / scale) against the CPU's division."""
    x = _dividends()
    x_cuda = x.cuda()
    for s in _scales():
        got = torch.ops.fixture.divide_by_scale(x_cuda, torch.tensor(s, device="cuda")).cpu()
        want = x / torch.tensor(s)
        same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
        bad = same.logical_not().nonzero().flatten()[:3].tolist()
        assert not bad, [(s, float(x[i]), float(got[i]), float(want[i])) for i in bad]
