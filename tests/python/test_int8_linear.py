"""examples::Int8Linear's numbers (examples/ops/int8_linear): the quantisation, the packed layout of
int8_linear.h, and forward against the weight dequantised in torch, for weights of every shape --
whole strips of 8 output channels and chunks of 64 input channels, and the tails past them -- on
the CPU reference and each CUDA path (the pass kernel with 8 and 16 rows of x, the per-warp rings,
cuBLAS, float32). The class machinery (save/load, compile, export, AOTInductor) is
test_classes.py's."""

import pytest
import torch

import opforge
from conftest import DEVICES, INT8_LINEAR_TAIL_SHAPES, TOLERANCE, requires_cuda

# rows of x for each CUDA path: on sm_90 the pass kernel with 8 rows (1-8) and 16 (9-16), the
# per-warp rings (17-64), cuBLAS past 64.
ROWS = [1, 5, 8, 9, 16, 40, 200]


@pytest.fixture(scope="module")
def classes():
    opforge.load_library(opforge.example_library("int8_linear"))
    return torch.classes.examples


def quantised(weight: torch.Tensor):
    """Symmetric per-output-channel int8 in float32, as torchao's int8_weight_only: (q, scales)."""
    w = weight.float()
    scales = w.abs().amax(1) / 127
    return torch.round(w / scales[:, None]).clamp(-127, 127), scales


def dequantised_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
    """y in float64 with the weight dequantised in float32 and rounded to x's dtype once, as the
    CPU reference and the cuBLAS path do (the small-M kernels scale exact integer sums instead,
    which stays within the tests' tolerance), on x's device."""
    w = (q * scales[:, None]).to(x.dtype).to(x.device)
    return torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double().to(x.device))


def packed_offsets(n: int, k: int) -> torch.Tensor:
    """[n, k]: the offset in qweight of W[i][j], by the layout int8_linear.h documents (the aligned
    block of whole strips and chunks in mma fragment order, then the tail columns of those rows,
    then the tail rows, both row-major), written out again as this test's oracle."""
    i, j = torch.arange(n)[:, None], torch.arange(k)[None, :]
    n8, k64 = n // 8 * 8, k // 64 * 64
    col = j % 64
    tile, w = col // 16, col % 16
    lane = (i % 8) * 4 + (w % 8) // 2
    aligned = (((i // 8) * (k64 // 64) + j // 64) * 32 + lane) * 16 + tile * 4 + (w // 8) * 2 + w % 2
    tail_columns = n8 * k64 + i * (k - k64) + (j - k64)
    return torch.where(i >= n8, i * k + j, torch.where(j >= k64, tail_columns, aligned))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
# 4672 input features = 73 chunks of 64, past a warp's ring of weight stages and one chunk into
# the pass kernel's last stage of 8.
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("in_features", [192, 4672])
def test_int8_linear_computes_with_the_quantised_weights(classes, device, dtype, rows, in_features):
    linear = torch.nn.Linear(in_features, 72)  # 72 = 9 strips of 8 output channels: an odd count
    weight = linear.weight.detach().to(device)
    q8 = classes.Int8Linear(weight, linear.bias.detach().to(device))
    q, scales = quantised(linear.weight.detach())
    assert torch.equal(q8.scales.cpu(), scales)
    assert torch.equal(q8.qweight.cpu().flatten().sort().values, q.to(torch.int8).flatten().sort().values)
    x = torch.randn(rows, in_features, device=device).to(dtype)
    y = q8.forward(x)
    ref = dequantised_linear(x.cpu(), q, scales, linear.bias.detach())
    tol = TOLERANCE[dtype] * in_features**0.5  # float32 sums of K products, in any order
    torch.testing.assert_close(y.double().cpu(), ref, atol=tol, rtol=tol)
    assert y.dtype == dtype and y.device == x.device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "shape", [(8, 64), (72, 192), *((n, k) for n, k, _ in INT8_LINEAR_TAIL_SHAPES)], ids=lambda s: f"{s[0]}x{s[1]}"
)
def test_int8_linear_packs_every_shape_in_the_documented_layout(classes, device, shape):
    """qweight keeps the weight's shape and bytes, each W[n][k] at the offset int8_linear.h gives
    (a permutation of the N * K bytes), the same bytes from the CUDA pack as from the CPU one."""
    n, k = shape
    weight = torch.randn(n, k)
    q8 = classes.Int8Linear(weight.to(device))
    q, scales = quantised(weight)
    offsets = packed_offsets(n, k)
    assert torch.equal(offsets.flatten().sort().values, torch.arange(n * k))
    assert q8.qweight.shape == (n, k) and q8.scales.shape == (n,)
    assert torch.equal(q8.qweight.cpu().flatten()[offsets], q.to(torch.int8))
    assert torch.equal(q8.scales.cpu(), scales)
    if device == "cuda":
        assert torch.equal(q8.qweight.cpu(), classes.Int8Linear(weight).qweight)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", INT8_LINEAR_TAIL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}{'-bias' if s[2] else ''}")
def test_int8_linear_takes_weights_of_any_shape(classes, device, dtype, rows, shape):
    """Weights whose N is no multiple of 8 or K no multiple of 64 (the tails past the kernels'
    strips and chunks) against the weight dequantised in torch."""
    n, k, has_bias = shape
    weight = torch.randn(n, k) / k**0.5
    bias = torch.randn(n) if has_bias else None
    q8 = classes.Int8Linear(weight.to(device), None if bias is None else bias.to(device))
    q, scales = quantised(weight)
    x = torch.randn(rows, k, device=device).to(dtype)
    y = q8.forward(x)
    assert y.shape == (rows, n) and y.dtype == dtype and y.device == x.device
    tol = TOLERANCE[dtype] * k**0.5  # float32 sums of K products, in any order
    torch.testing.assert_close(y.double().cpu(), dequantised_linear(x.cpu(), q, scales, bias), atol=tol, rtol=tol)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("strips_per_sm", [3.1, 17.2])
@pytest.mark.parametrize("tails", [(0, 0), (5, 40)], ids=["whole", "tails"])
def test_int8_linear_splits_many_strips_over_the_multiprocessors(classes, dtype, rows, strips_per_sm, tails):
    """Output channels in strips of 8, a few more than a multiple of the multiprocessors: blocks
    with unequal shares, in one pass over K (3-4 strips a block) and in three (17-18 strips, 8 a
    pass); with tails, 5 more output channels and 40 more input channels (the K tail in every
    pass)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out_features, in_features = 8 * int(strips_per_sm * sms) + tails[0], 4672 + tails[1]
    weight = torch.randn(out_features, in_features, device="cuda") / in_features**0.5
    bias = torch.randn(out_features, device="cuda")
    q8 = classes.Int8Linear(weight, bias)
    q, scales = quantised(weight)
    x = torch.randn(rows, in_features, device="cuda").to(dtype)
    ref = dequantised_linear(x, q, scales, bias)
    tol = TOLERANCE[dtype] * in_features**0.5
    torch.testing.assert_close(q8.forward(x).double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [3, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_linear_without_input_channels_gives_the_bias(classes, device, rows, dtype):
    bias = torch.randn(16, device=device)
    q8 = classes.Int8Linear(torch.randn(16, 0, device=device), bias)
    y = q8.forward(torch.randn(rows, 0, device=device, dtype=dtype))
    assert torch.equal(y, bias.to(dtype).expand(rows, 16))


@pytest.mark.parametrize("device", DEVICES)
def test_int8_linear_quantises_non_finite_weights_to_zero(classes, device):
    w = torch.randn(8, 64)
    w[0, 3], w[1, 5], w[2, :] = float("nan"), float("inf"), 0.0
    q8 = classes.Int8Linear(w.to(device))
    q, scales = q8.qweight.cpu(), q8.scales.cpu()
    assert torch.equal(q, classes.Int8Linear(w).qweight)  # the same bytes as the CPU reference
    amax = w.nan_to_num(nan=0.0, posinf=float("inf")).abs().amax(1)  # NaN weights do not count
    assert torch.equal(scales, amax / 127) and scales[1] == float("inf") and scales[2] == 0
    expected = torch.round(w / scales[:, None])  # inf/inf, x/inf, 0/0 and NaN: not finite, so 0
    expected = torch.where(expected.isfinite(), expected, 0).clamp(-127, 127).to(torch.int8)
    assert torch.equal(q.flatten().sort().values, expected.flatten().sort().values)
