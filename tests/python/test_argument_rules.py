"""Rules that name any argument, leading dims tied across inputs, and rules by an optional input's
presence, end to end on the example ops that need them: vLLM's out-first
examples::silu_and_mul_out (out [..., d] ruled by the later input [..., 2d]), the rstd of
examples::liger_rms_norm_backward (its leading dims those of grad_y), and
examples::causal_conv1d_update (a state indexed by conv_state_indices when given, by batch
otherwise): calls at several ranks, the exact messages, torch.compile with dynamic dims and no
recompiles, and opforge verify on the CPU and, on a GPU, on CUDA."""

from __future__ import annotations

import re

import pytest
import torch

import opforge
from conftest import requires_cuda
from opforge import verify
from opforge.verify import cases as vcases


@pytest.fixture(scope="module", autouse=True)
def libraries():
    for name in ("silu_and_mul", "liger", "causal_conv1d_update"):
        opforge.load_library(opforge.example_library(name))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def conv1d_update(x, conv_state, weight, bias, silu_activation, conv_state_indices):
    """mamba_ssm's causal_conv1d_update_ref for one step (x [batch, dim]), in float64; returns y
    and the new conv_state."""
    rows = torch.arange(x.shape[0]) if conv_state_indices is None else conv_state_indices.long()
    state = conv_state.double().clone()
    window = torch.cat([state[rows], x.double()[..., None]], -1)
    y = (window * weight.double()).sum(-1) + (0 if bias is None else bias.double())
    state[rows] = window[..., 1:]
    return (torch.nn.functional.silu(y) if silu_activation else y), state


@pytest.mark.parametrize("lead", [(), (5,), (2, 3), (2, 1, 3)], ids=lambda s: f"rank {len(s) + 1}")
def test_silu_and_mul_out_writes_out_at_every_rank(lead):
    x = torch.randn(*lead, 16)
    out = torch.full((*lead, 8), float("nan"))
    assert torch.ops.examples.silu_and_mul_out(out, x) is None
    torch.testing.assert_close(out, silu_and_mul(x))
    assert str(torch.ops.examples.silu_and_mul_out.default._schema) == (
        "examples::silu_and_mul_out(Tensor(a!) out, Tensor input) -> ()"
    )


def test_silu_and_mul_out_refuses_other_leading_dims_naming_both_arguments():
    message = (
        "examples::silu_and_mul_out(Tensor(a!) out, Tensor input) -> (): invalid arguments\n"
        "  out: expected leading dims [2, 3] (those of input, shape [2, 3, 16]), got [3, 2] (shape [3, 2, 8])"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.examples.silu_and_mul_out(torch.empty(3, 2, 8), torch.randn(2, 3, 16))
    message = (
        "examples::silu_and_mul_out(Tensor(a!) out, Tensor input) -> (): invalid arguments\n"
        "  out: expected shape [*, input.size(-1) // 2] = [*, 8], got [2, 3, 7]"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.examples.silu_and_mul_out(torch.empty(2, 3, 7), torch.randn(2, 3, 16))


def test_silu_and_mul_out_compiles_once_for_every_rank_3_shape():
    def step(x):
        out = torch.empty(*x.shape[:-1], x.shape[-1] // 2)
        torch.ops.examples.silu_and_mul_out(out, x)
        return out + 1

    torch._dynamo.reset()
    fn = torch.compile(step, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for shape in ((2, 3, 16), (4, 5, 8), (3, 7, 32)):
            x = torch.randn(shape)
            torch.testing.assert_close(fn(x), silu_and_mul(x) + 1)


def test_a_backward_ops_saved_rstd_must_have_grad_ys_leading_dims():
    grad_y, x, weight = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8)
    torch.ops.examples.liger_rms_norm_backward(grad_y, x, weight, torch.rand(2, 3, 1))
    message = "  rstd: expected leading dims [2, 3] (those of grad_y, shape [2, 3, 8]), got [6] (shape [6, 1])"
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        torch.ops.examples.liger_rms_norm_backward(grad_y, x, weight, torch.rand(6, 1))


def conv_inputs(batch=3, dim=8, width=4, slots=None, bias=True, dtype=torch.float32):
    """x, conv_state, weight, bias, silu_activation, conv_state_indices: the state indexed by a
    permutation of `slots` rows when given, else by batch."""
    rows = batch if slots is None else slots
    indices = None if slots is None else torch.randperm(slots)[:batch].int()
    return [
        torch.randn(batch, dim, dtype=dtype),
        torch.randn(rows, dim, width - 1, dtype=dtype),
        torch.randn(dim, width, dtype=dtype),
        torch.randn(dim, dtype=dtype) if bias else None,
        True,
        indices,
    ]


@pytest.mark.parametrize("slots", [None, 7], ids=["by batch", "by conv_state_indices"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
def test_causal_conv1d_update_matches_mambas_reference(slots, bias):
    args = conv_inputs(slots=slots, bias=bias)
    want_y, want_state = conv1d_update(*args)
    y = torch.ops.examples.causal_conv1d_update(*args)
    torch.testing.assert_close(y.double(), want_y)
    torch.testing.assert_close(args[1].double(), want_state)
    assert str(torch.ops.examples.causal_conv1d_update.default._schema) == (
        "examples::causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias=None, "
        "bool silu_activation=False, Tensor? conv_state_indices=None) -> Tensor"
    )


def test_causal_conv1d_update_rules_follow_conv_state_indices_presence():
    head = (
        "examples::causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias=None, "
        "bool silu_activation=False, Tensor? conv_state_indices=None) -> Tensor: invalid arguments\n"
    )
    args = conv_inputs(slots=7)
    args[5] = None  # 7 state rows for a batch of 3, without indices
    message = head + "  expected conv_state.size(0) == x.size(0) when conv_state_indices is not given, got 7 == 3"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.examples.causal_conv1d_update(*args)
    args = conv_inputs(batch=3, slots=3)
    args[1] = args[1][:2]
    message = head + "  expected conv_state.size(0) >= x.size(0) when conv_state_indices is given, got 2 >= 3"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.examples.causal_conv1d_update(*args)


@pytest.mark.parametrize("width", [1, 5])
def test_causal_conv1d_update_takes_causal_conv1d_s_widths(width):
    message = (
        "examples::causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias=None, "
        "bool silu_activation=False, Tensor? conv_state_indices=None) -> Tensor: invalid arguments\n"
        + ("  expected weight.size(1) >= 2, got 1 >= 2" if width == 1 else "  expected weight.size(1) <= 4, got 5 <= 4")
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.examples.causal_conv1d_update(*conv_inputs(width=width))


@pytest.mark.parametrize("slots", [None, 9], ids=["by batch", "by conv_state_indices"])
def test_causal_conv1d_update_compiles_once_across_batch_sizes(slots):
    def step(*args):
        return torch.ops.examples.causal_conv1d_update(*args) + 1

    torch._dynamo.reset()
    fn = torch.compile(step, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch, dim in ((2, 8), (3, 16), (5, 24)):
            args = conv_inputs(batch=batch, dim=dim, slots=slots)
            want_y, want_state = conv1d_update(*args)
            torch.testing.assert_close(fn(*args).double(), want_y + 1)
            torch.testing.assert_close(args[1].double(), want_state)


def test_verify_generates_out_first_cases_at_several_ranks_and_both_presences():
    op = opforge.find_op("examples::silu_and_mul_out")
    ranks = set()
    for case in vcases.generate_cases(op, {"out": "float32", "input": "float32"}, seed=3):
        out, x = case.args
        assert out.shape[:-1] == x.shape[:-1] and 2 * out.shape[-1] == x.shape[-1], case.label
        ranks.add(x.dim())
    assert ranks >= {1, 2, 4}, ranks
    op = opforge.find_op("examples::causal_conv1d_update")
    dtypes = {"x": "float32", "conv_state": "float32", "weight": "float32", "bias": "float32"}
    presences = set()
    for case in vcases.generate_cases(op, dtypes | {"conv_state_indices": "int32"}, seed=3):
        indices = case.args[5]
        presences.add(indices is not None)
        if indices is not None and indices.numel():
            assert indices.unique().numel() == indices.numel() and int(indices.max()) < case.args[1].shape[0]
    assert presences == {True, False}


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
@pytest.mark.parametrize("name", ["silu_and_mul_out", "causal_conv1d_update"])
def test_verify(name, device):
    report = verify.verify_op(f"examples::{name}", device=device, seed=5)
    assert report.ok, report.failures
