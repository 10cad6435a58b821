"""The backward ops of the example norms and activations (bias_gelu, rms_norm, add_layer_norm,
the in-place fused_add_rms_norm):
their gradients against torch's autograd of the same expression in float64, in every dtype, on
both kernel paths (rows held in registers, and the plain loops for rows that do not fit or are
not a whole number of 16-byte vectors), with more rows than the CUDA grid has blocks, and with no
rows at all; float64 gradcheck on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import serving
from conftest import DEVICES, TOLERANCE

ex = torch.ops.examples


@pytest.fixture(scope="module", autouse=True)
def serving_ops():
    serving.load()


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


def fused_add_rms_norm(x, residual, weight, eps=1e-5):
    """The op on copies of x and residual (leaves cannot be written in place): (x, residual) after it."""
    x, residual = x.clone(), residual.clone()
    ex.fused_add_rms_norm(x, residual, weight, eps)
    return x, residual


def fused_add_rms_norm_torch(x, residual, weight, eps=1e-5):
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), weight, eps), h


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOATING)
def test_fused_add_rms_norm_gradients(device, shape, dtype):
    x, residual = torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)
    weight = torch.rand(shape[-1], dtype=dtype, device=device) + 0.5
    grads = [torch.randn(shape, dtype=dtype, device=device) for _ in range(2)]
    args = leaves(x, residual, weight)
    out = fused_add_rms_norm(*args)
    assert out[0].grad_fn.name() == out[1].grad_fn.name() == "examples::fused_add_rms_normBackward"
    got = torch.autograd.grad(out, args, grads)
    ref_args = leaves(x.double(), residual.double(), weight.double())
    ref = torch.autograd.grad(fused_add_rms_norm_torch(*ref_args), ref_args, [g.double() for g in grads])
    check_grads(got, ref, [dtype] * 3, x.numel() // shape[-1])


def test_fused_add_rms_norm_gradcheck_and_gradients_of_one_result():
    x, r, w = leaves(
        torch.randn(2, 3, 16, dtype=torch.float64),
        torch.randn(2, 3, 16, dtype=torch.float64),
        torch.rand(16, dtype=torch.float64) + 0.5,
    )
    assert torch.autograd.gradcheck(fused_add_rms_norm, (x, r, w))
    y, h = fused_add_rms_norm(x, r, w)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="derivative for examples::fused_add_rms_norm_backward is not implemented"):
        g.sum().backward()  # the backward op names no backward of its own
    for k in range(2):  # a result that did not reach the loss gets zeros
        got = torch.autograd.grad(fused_add_rms_norm(x, r, w)[k].sum(), (x, r, w))
        ref = torch.autograd.grad(fused_add_rms_norm_torch(x, r, w)[k].sum(), (x, r, w), materialize_grads=True)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b)


def test_fused_add_rms_norm_in_place_rules_of_autograd():
    w = torch.rand(8, requires_grad=True)
    with pytest.raises(RuntimeError, match="^a leaf Variable that requires grad is being used in an in-place"):
        ex.fused_add_rms_norm(torch.randn(2, 8, requires_grad=True), torch.randn(2, 8), w)
    x, r = torch.randn(2, 8) * w, torch.randn(2, 8)  # a history of their own, written by the op
    ex.fused_add_rms_norm(x, r, w)
    ex.fused_add_rms_norm(x, r, w)  # the residual the first call saved is written again
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        r.sum().backward()
    base = torch.randn(2, 16, dtype=torch.float64, requires_grad=True)
    wd = torch.rand(8, dtype=torch.float64, requires_grad=True)

    def on_a_view(base, w):  # the op writes a view (as a Linear's output on 3-d input is one)
        work = base * 1
        ex.fused_add_rms_norm(work[:, :8], work[:, 8:], w)
        return work

    assert torch.autograd.gradcheck(on_a_view, (base, wd))
    with torch.no_grad():
        ref = base.detach().clone()
        ref[:, :8], ref[:, 8:] = fused_add_rms_norm_torch(ref[:, :8], ref[:, 8:], wd, eps=1e-6)
    torch.testing.assert_close(on_a_view(base, wd), ref)


class ResidualBlocks(torch.nn.Module):
    """Pre-norm residual blocks as a decoder runs them: x, residual = norm(x + residual), then a
    Linear; ``fused`` uses examples::fused_add_rms_norm in place, else the torch expression. Each
    block writes a copy of the residual stream: its backward reads the stream as it left it, and a
    later block writing the same tensor would make that backward raise (as for torch's in-place
    ops)."""

    def __init__(self, hidden: int, blocks: int, fused: bool):
        super().__init__()
        self.fused = fused
        self.norms = torch.nn.ParameterList(torch.nn.Parameter(torch.rand(hidden) + 0.5) for _ in range(blocks))
        self.linears = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(blocks))

    def forward(self, x):
        x, residual = x.clone(), torch.zeros_like(x)  # the caller's x is not written
        for norm, linear in zip(self.norms, self.linears):
            if self.fused:
                residual = residual.clone()
                ex.fused_add_rms_norm(x, residual, norm, 1e-6)
            else:
                x, residual = fused_add_rms_norm_torch(x, residual, norm, 1e-6)
            x = linear(x)
        return x + residual


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_training_through_the_in_place_norm_matches_torch(device, compiled):
    torch.manual_seed(0)
    mine = ResidualBlocks(32, 3, fused=True).to(device)
    theirs = ResidualBlocks(32, 3, fused=False).to(device)
    theirs.load_state_dict(mine.state_dict())
    x = torch.randn(4, 5, 32, device=device)
    # on the CPU, AOTAutograd's joint trace and functionalisation without Inductor's code generation
    backend = "inductor" if device == "cuda" else "aot_eager"
    run = torch.compile(mine, fullgraph=True, dynamic=True, backend=backend) if compiled else mine
    for n in (5, 7):
        xs = torch.randn(4, n, 32, device=device)
        torch.testing.assert_close(run(xs), theirs(xs))
    run(x).square().mean().backward()
    theirs(x).square().mean().backward()
    for (name, a), b in zip(mine.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
