"""Autograd through opforge ops: the Autograd kernel the torch adapter registers for every op
(Note [Autograd kernel] in src/torch/autograd.cpp), with the backward ops they name (Note
[Backward ops] in opforge/op_builder.h), and the load-time checks of that pairing."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import opforge
from conftest import DEVICES, TOLERANCE, _softshrink_grad

FIXTURES = Path(__file__).resolve().parent / "fixtures"
bw = torch.ops.bw


@pytest.fixture(scope="module", autouse=True)
def backward_ops(tmp_path_factory):
    return opforge.load_library(
        opforge.build_library("backward_ops", [FIXTURES / "backward_ops.cpp"], build_dir=tmp_path_factory.mktemp("bw"))
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_softshrink_backward_matches_torch(device, dtype):
    x = torch.randn(33, 65, dtype=dtype, device=device, requires_grad=True)
    grad_y = torch.randn(33, 65, dtype=dtype, device=device)
    y = torch.ops.examples.softshrink(x, 0.25)
    assert y.grad_fn.name() == "examples::softshrinkBackward"
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    assert grad_x.dtype == dtype and grad_x.device == x.device
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(grad_x.double().cpu(), _softshrink_grad(grad_y, x.detach(), 0.25), atol=tol, rtol=tol)


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
    torch.testing.assert_close(eager, torch.autograd.grad(F.softshrink(x * 2.0, 0.3).square().sum(), x)[0])


def test_no_graph_without_grad():
    x = torch.randn(5, requires_grad=True)
    assert torch.ops.examples.softshrink(x.detach(), 0.1).grad_fn is None
    with torch.no_grad():
        assert torch.ops.examples.softshrink(x, 0.1).grad_fn is None


def test_partial_gradients_in_another_order_and_optional_inputs():
    x, w, b = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    gx, gb = torch.autograd.grad(bw.axpw(x, w, b, alpha=2.5).sum(), (x, b))
    torch.testing.assert_close(gx, 2.5 * w.detach())
    torch.testing.assert_close(gb, torch.ones_like(b))
    y = bw.axpw(x, w, alpha=2.5)  # b left out: its gradient slot is dropped, x's still flows
    (gx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(gx, 2.5 * w.detach())
    with pytest.raises(
        NotImplementedError,
        match=r"the derivative of bw::axpw for its input 'w' is not implemented: "
        r"its backward op bw::axpw_backward has no grad_w output",
    ):
        bw.axpw(x, w, b).sum().backward()  # w requires grad, as torch's own ops refuse it
    bw.axpw(x, w.detach(), b).sum().backward()
    assert x.grad is not None and b.grad is not None
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        torch.autograd.grad(y.sum(), x)  # y's graph was freed by the first grad call
    assert torch.autograd.gradcheck(lambda a, c: bw.axpw(a, w.detach(), c, 0.7), (x, b))


def test_two_outputs_with_one_reaching_the_loss():
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    s, c = bw.powers(x)
    (g,) = torch.autograd.grad(c.sum(), x)  # s's gradient arrives as zeros
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    assert torch.autograd.gradcheck(lambda t: bw.powers(t), (x,))


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # jacrev's vmap over an op without a batching rule
def test_a_second_derivative_without_a_backward_of_the_backward_op_is_refused_when_taken():
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(bw.powers(x)[0].sum(), x, create_graph=True)  # first order: fine
    torch.testing.assert_close(g, 2 * x.detach())
    with pytest.raises(RuntimeError, match=r"derivative for bw::powers_backward is not implemented"):
        torch.autograd.grad(g.sum(), x)
    # torch.func differentiates with create_graph: first derivatives work there, and jacrev
    s = lambda t: torch.ops.examples.softshrink(t, 0.5)  # noqa: E731
    torch.testing.assert_close(torch.func.grad(lambda t: s(t).sum())(x.detach()), (x.detach().abs() > 0.5).double())
    torch.testing.assert_close(torch.func.jacrev(s)(x.detach()), torch.diag((x.detach().abs() > 0.5).double()))
    with pytest.raises(RuntimeError, match=r"derivative for examples::softshrink_backward is not implemented"):
        inner = torch.func.grad(lambda u: s(u).square().sum())
        torch.func.grad(lambda t: inner(t).sum())(x.detach())  # was silently 0


def test_forward_mode_ad_is_refused():
    x = torch.randn(4, dtype=torch.float64)
    with pytest.raises(
        NotImplementedError, match="Trying to use forward AD with bw::powers, which does not support it"
    ):
        torch.func.jvp(bw.powers, (x,), (torch.ones_like(x),))
    pullback = torch.func.vjp(lambda t: bw.powers(t)[0], x)[1]  # forward over reverse: a dual cotangent
    with pytest.raises(NotImplementedError):
        torch.func.jvp(lambda c: pullback(c)[0], (torch.ones_like(x),), (torch.ones_like(x),))


def test_an_integer_output_gets_zeros_of_its_own_dtype_and_shape():
    x = torch.randn(1000, dtype=torch.float64, requires_grad=True)
    y, idx = bw.with_index(x)
    assert not idx.requires_grad
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, torch.full_like(g, 2.0))


def test_a_gradient_of_the_wrong_shape_is_refused():
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(
        RuntimeError,
        match=r"bw::square_backward_too_long returned grad_x of shape \[5\] and dtype "
        r"Double for bw::square's input x of shape \[4\]",
    ):
        bw.square(x).sum().backward()


@pytest.mark.filterwarnings("ignore:Error detected in torch.*NotImplemented")  # the compiled call's
def test_an_op_without_a_backward_op_never_drops_a_gradient_silently():
    """As torch's own ops without a derivative formula: a gradient that must flow through the op
    into an input that requires grad raises, naming the op (a Linear before it would otherwise
    never train), eager and compiled; forward-only use is free and warns of nothing."""
    linear = torch.nn.Linear(4, 4, dtype=torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="derivative for bw::forward_only is not implemented"):
        bw.forward_only(linear(x)).sum().backward()
    assert linear.weight.grad is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            torch.testing.assert_close(bw.forward_only(linear(x)), linear(x))
        with torch.inference_mode():
            bw.forward_only(linear(x))
        y = bw.forward_only(x)  # no input requires grad
        assert not y.requires_grad
        z = linear(x).sum() + bw.forward_only(x).sum()  # a gradient that does not pass through it
        z.backward()
    assert linear.weight.grad is not None
    w = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    with pytest.raises(Exception, match="derivative for bw::forward_only is not implemented"):
        torch.compile(lambda t: bw.forward_only(t * w), backend="aot_eager")(x)
    with torch.no_grad():  # compiled for inference
        compiled = torch.compile(lambda t: bw.forward_only(t * w), backend="aot_eager")
        torch.testing.assert_close(compiled(x), x * w)


def test_mismatched_backward_ops_fail_to_load_and_register_nothing(tmp_path):
    path = opforge.build_library("bad_backward_ops", [FIXTURES / "bad_backward_ops.cpp"], build_dir=tmp_path)
    with pytest.raises(ValueError) as err:
        opforge.load_library(path)
    lines = str(err.value).splitlines()
    assert lines[0] == f"opforge: {path} has invalid op declarations:"
    site = str(FIXTURES / "bad_backward_ops.cpp")
    assert lines[1:] == [
        f"{site}:13: badbw::f: backward op badbw::f_backward: input 'grad_z' matches nothing of the forward op: "
        "expected one of grad_y, x, alpha, y",
        f"{site}:13: badbw::f: backward op badbw::f_backward: input 'alpha' is int, but the forward op's alpha is "
        "float",
        f"{site}:13: badbw::f: backward op badbw::f_backward: output 'dx' is not the gradient of a tensor input: "
        "expected one of grad_x, or grad_<a>_and_<b> for one gradient of several",
        f"{site}:17: badbw::g: backward op badbw::g_backward: input 'w' is Tensor, but the forward op's w is Tensor?",
        f"{site}:22: badbw::h: backward op badbw::nowhere: not declared in this library (declare both ops in one "
        "library)",
        f"{site}:23: badbw::k: input 'grad_y' is named like the gradient of its output 'y'; rename it (the backward "
        "op could not tell the two apart)",
        f"{site}:34: badbw::m_: backward op badbw::m__backward: input 'x' names the forward op's mutated input x, "
        "whose value before the op is overwritten: call it x_out for its value after the op",
        f"{site}:38: badbw::n_: 'x_out' names an argument or output and also mutated input 'x''s value after the "
        "op; rename it (the backward op could not tell the two apart)",
        f"{site}:55: badbw::s: backward op badbw::s_backward: output 'grad_x_and_z' is not the gradient of a tensor "
        "input: expected one of grad_x, grad_y, or grad_<a>_and_<b> for one gradient of several",
        f"{site}:55: badbw::s: backward op badbw::s_backward: output 'grad_y' gives a second gradient of y; name "
        "each input once",
        f"{site}:60: badbw::t: backward op badbw::t_backward: input 'grad_y' is opforge::mutated, but a backward op "
        "may not write its inputs (the forward call's saved values and the caller's gradients)",
        f"{site}:60: badbw::t: backward op badbw::t_backward: output 'grad_a_and_b' reads as the gradient of a_and_b, "
        "or a and b; rename an input so that it reads one way",
        f"{site}:60: badbw::t: backward op badbw::t_backward: output 'grad_b_and_b' is not the gradient of a tensor "
        "input: expected one of grad_a, grad_b, grad_a_and_b, or grad_<a>_and_<b> for one gradient of several "
        "(each input named once)",
        f"{site}:66: badbw::u: backward op badbw::u_backward: takes no gradient (no input grad_y or the like), so "
        "its results cannot depend on the loss; take the gradients it needs",
    ]
    assert not hasattr(torch.ops.badbw, "f")  # nothing was registered


def test_verify_checks_every_output_of_multi_output_ops():
    from opforge import verify

    for name in ("bw::powers", "bw::axpw_backward"):
        report = verify.verify_op(name, device="cpu", seed=3)
        checks = {(r.check, r.status) for r in report.results}
        assert {("meta", "pass"), ("compile", "pass"), ("opcheck", "pass")} <= checks, report.failures
    report = verify.verify_op("bw::powers", device="cpu", seed=3)
    assert ("gradcheck", "pass") in {(r.check, r.status) for r in report.results}
    out = (torch.zeros(2), torch.ones(2))
    ok, _, _, why = verify.compare.compare_outputs(out, (torch.zeros(2), torch.zeros(2)), "float32")
    assert not ok and why.startswith("output 1: 2 of 2 elements differ")


def test_a_written_view_that_is_not_the_first_argument_and_an_optional_written_input_left_out():
    bw = torch.ops.bw
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    b0 = torch.randn(8, dtype=torch.float64, requires_grad=True)

    def on_a_slice(w, b0):
        base = b0 * 1
        bw.addw_(w, base[2:6])
        return base * torch.arange(8.0, dtype=torch.float64)

    def torch_slice(w, b0):
        base = b0 * 1
        base[2:6] += w * w
        return base * torch.arange(8.0, dtype=torch.float64)

    got = torch.autograd.grad(on_a_slice(w, b0).sum(), (w, b0))
    ref = torch.autograd.grad(torch_slice(w, b0).sum(), (w, b0))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(on_a_slice, (w, b0))
    x0 = torch.randn(3, dtype=torch.float64, requires_grad=True)
    x = x0 * 1
    bw.scale_both_(x, None)  # the backward op gets None for the left-out input's gradient
    (g,) = torch.autograd.grad(x.sum(), x0)
    torch.testing.assert_close(g, torch.full_like(g, 2.0))
    assert torch.autograd.gradcheck(
        lambda x, r: (x := x * 1, r := r * 1, bw.scale_both_(x, r), (x, r))[3], (x0, b0[:3])
    )
