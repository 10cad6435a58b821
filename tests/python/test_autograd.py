"""Autograd through opforge ops that name a backward op (examples::softshrink ->
examples::softshrink_backward), and the load-time checks of that pairing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICES, TOLERANCE
from opforge.autograd import plan_backward, register_backward_ops


def _torch_grad(x, grad_y, lambd):
    x = x.detach().double().cpu().requires_grad_()
    return torch.autograd.grad(F.softshrink(x, lambd), x, grad_y.double().cpu())[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_backward_matches_torch(device, dtype):
    x = torch.randn(33, 65, dtype=dtype, device=device, requires_grad=True)
    grad_y = torch.randn(33, 65, dtype=dtype, device=device)
    y = torch.ops.examples.softshrink(x, 0.25)
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    assert grad_x.dtype == dtype and grad_x.device == x.device
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(grad_x.double().cpu(), _torch_grad(x, grad_y, 0.25), atol=tol, rtol=tol)


def test_gradcheck_with_default_parameter():
    x = torch.randn(40, dtype=torch.float64) * 2
    x = x[(x.abs() - 0.5).abs() > 1e-3].requires_grad_()  # away from the kinks at +-lambd
    assert torch.autograd.gradcheck(torch.ops.examples.softshrink, (x,))
    torch.ops.examples.softshrink(x).sum().backward()  # lambd left at its default, 0.5
    assert torch.equal(x.grad, (x.detach().abs() > 0.5).double())


@pytest.mark.parametrize("device", DEVICES)
def test_backward_inside_torch_compile(device):
    def f(t):
        return torch.ops.examples.softshrink(t * 2.0, lambd=0.3).square().sum()

    x = torch.randn(8, 50, device=device, requires_grad=True)
    (eager,) = torch.autograd.grad(f(x), x)
    (compiled,) = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(x), x)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(eager, torch.autograd.grad(
        F.softshrink(x * 2.0, 0.3).square().sum(), x)[0])


def test_no_grad_needed_runs_forward_only():
    x = torch.randn(5)
    y = torch.ops.examples.softshrink(x, 0.1)
    assert y.grad_fn is None and not y.requires_grad


def _spec(name, args, outputs, backward=None):
    spec = {"name": name, "args": [{"name": n, "type": t} for n, t in args],
            "outputs": [{"name": n} for n in outputs]}
    if backward:
        spec["backward"] = backward
    return spec


FORWARD = _spec("ns::f", [("x", "Tensor"), ("w", "Tensor?"), ("alpha", "float")], ["y"], backward="ns::f_backward")


def test_plan_matches_arguments_by_name():
    backward = _spec("ns::f_backward", [("grad_y", "Tensor"), ("y", "Tensor"), ("x", "Tensor"), ("alpha", "float")],
                     ["grad_w", "grad_x"])
    plan = plan_backward(FORWARD, backward)
    assert plan.sources == (("grad", 0), ("output", 0), ("input", 0), ("input", 2))
    assert plan.targets == (1, 0)
    assert plan.tensor_args == (True, True, False)


def test_plan_names_every_mismatch():
    backward = _spec("ns::f_backward", [("grad_z", "Tensor"), ("x", "Tensor"), ("beta", "float")],
                     ["grad_x", "grad_alpha", "dx"])
    with pytest.raises(ValueError) as err:
        plan_backward(FORWARD, backward)
    assert str(err.value).splitlines() == [
        "opforge: ns::f names ns::f_backward as its backward op, but:",
        "  input 'grad_z' of ns::f_backward matches nothing of ns::f: expected one of grad_y, x, w, alpha, y",
        "  input 'beta' of ns::f_backward matches nothing of ns::f: expected one of grad_y, x, w, alpha, y",
        "  output 'grad_alpha' of ns::f_backward is not the gradient of a tensor input of ns::f: expected one of "
        "grad_x, grad_w",
        "  output 'dx' of ns::f_backward is not the gradient of a tensor input of ns::f: expected one of grad_x, "
        "grad_w",
    ]


def test_backward_op_must_be_loaded():
    with pytest.raises(ValueError, match=r"ns::f names ns::f_backward as its backward op, which is not loaded: "
                                         r"declare it in the same library or load its library first"):
        register_backward_ops([FORWARD], loaded=[])
