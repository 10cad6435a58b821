"""The backward ops of the example norms and activations (bias_gelu, rms_norm, add_layer_norm):
their gradients against torch's autograd of the same expression in float64, in every dtype, on
both kernel paths (rows held in registers, and the plain loops for rows that do not fit or are
not a whole number of 16-byte vectors), with more rows than the CUDA grid has blocks, and with no
rows at all; float64 gradcheck on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICES, TOLERANCE

ex = torch.ops.examples
FLOATING = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

#: [rows, cols]: registers; cols not a multiple of any vector width; a row wider than the
#: register path takes; more rows than resident blocks; no rows.
SHAPES = [(7, 3, 64), (5, 50), (3, 20000), (3000, 64), (0, 64)]


def grad_tolerance(dtype: torch.dtype, reduced_over: int) -> tuple[float, float]:
    """(atol, rtol): the dtype's tolerance, float64's loosened for sums in another order; a sum
    over many rows (grad weight, grad bias) is rounded once, relatively, but its float32
    accumulation error grows with the square root of the rows it adds, so its atol does too."""
    tol = 1e-10 if dtype == torch.float64 else TOLERANCE[dtype]
    return tol * max(1.0, reduced_over**0.5), tol


def check_grads(got, ref, dtypes, rows: int):
    for k, (g, r, d) in enumerate(zip(got, ref, dtypes)):
        assert g.dtype == d, f"gradient {k}: {g.dtype}, expected {d}"
        atol, rtol = grad_tolerance(d, rows if g.dim() == 1 else 1)
        torch.testing.assert_close(g.double().cpu(), r.double().cpu(), atol=atol, rtol=rtol, msg=f"gradient {k}")


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bias_gelu_gradients(device, shape, dtype):
    x = torch.randn(shape, dtype=dtype, device=device) * 2
    bias = torch.randn(shape[-1], dtype=dtype, device=device)
    grad_y = torch.randn(shape, dtype=dtype, device=device)
    xs, bs = leaves(x, bias)
    y = ex.bias_gelu(xs, bs)
    assert y.grad_fn.name() == "examples::bias_geluBackward"
    got = torch.autograd.grad(y, (xs, bs), grad_y)
    xd, bd = leaves(x.double(), bias.double())
    ref = torch.autograd.grad(F.gelu(xd + bd), (xd, bd), grad_y.double())
    check_grads(got, ref, [dtype, dtype], x.numel() // shape[-1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "dtype,weight_dtype", [(d, d) for d in FLOATING] + [(torch.bfloat16, torch.float32), (torch.float16, torch.float32)]
)
def test_rms_norm_gradients(device, shape, dtype, weight_dtype):
    x = torch.randn(shape, dtype=dtype, device=device)
    weight = torch.rand(shape[-1], dtype=weight_dtype, device=device) + 0.5
    grad_y = torch.randn(shape, dtype=dtype, device=device)
    xs, ws = leaves(x, weight)
    got = torch.autograd.grad(ex.rms_norm(xs, ws, 1e-5), (xs, ws), grad_y)
    xd, wd = leaves(x.double(), weight.double())
    ref = torch.autograd.grad(F.rms_norm(xd, (shape[-1],), wd, 1e-5), (xd, wd), grad_y.double())
    check_grads(got, ref, [dtype, weight_dtype], x.numel() // shape[-1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOATING)
def test_add_layer_norm_gradients(device, shape, dtype):
    x = torch.randn(shape, dtype=dtype, device=device)
    residual = torch.randn(shape, dtype=dtype, device=device)
    weight = torch.rand(shape[-1], dtype=dtype, device=device) + 0.5
    bias = torch.randn(shape[-1], dtype=dtype, device=device)
    grad_y = torch.randn(shape, dtype=dtype, device=device)
    args = leaves(x, residual, weight, bias)
    got = torch.autograd.grad(ex.add_layer_norm(*args, eps=1e-5), args, grad_y)
    xd, rd, wd, bd = leaves(x.double(), residual.double(), weight.double(), bias.double())
    y = F.layer_norm(xd + rd, (shape[-1],), wd, bd, 1e-5)
    ref = torch.autograd.grad(y, (xd, rd, wd, bd), grad_y.double())
    check_grads(got, ref, [dtype] * 4, x.numel() // shape[-1])


def test_gradcheck_in_float64():
    x, r = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 3, 16, dtype=torch.float64)
    w, b = torch.rand(16, dtype=torch.float64) + 0.5, torch.randn(16, dtype=torch.float64)
    x, r, w, b = leaves(x, r, w, b)
    assert torch.autograd.gradcheck(lambda x, w: ex.rms_norm(x, w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda *a: ex.add_layer_norm(*a, eps=1e-5), (x, r, w, b))
    # bias_gelu takes no float64: its backward op called directly, in float32, against torch's
    # float64 gradients (opforge verify runs the float32 gradcheck over its whole Jacobian)
    xd, bd = leaves(x.detach(), b.detach())
    g = torch.randn_like(xd)
    ref = torch.autograd.grad(F.gelu(xd + bd), (xd, bd), g)
    got = ex.bias_gelu_backward(g.float(), xd.detach().float(), bd.detach().float())
    check_grads(got, ref, [torch.float32, torch.float32], 6)
