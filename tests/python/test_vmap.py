"""torch.func.vmap over opforge ops: one call for pointwise and rowwise ops batched at their
first input (the core's batchable_args), a call per batch element otherwise, nested vmap, batch
dims other than 0, and zero-size batches."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

import opforge
from conftest import DEVICES


@pytest.fixture(scope="module", autouse=True)
def examples():
    for name in ("rms_norm", "softshrink", "bias_gelu", "add_layer_norm"):
        opforge.load_library(opforge.example_library(name))


def test_the_core_says_which_inputs_take_the_batch():
    batchable = {n: opforge.find_op(f"examples::{n}").batchable for n in ("rms_norm", "bias_gelu", "add_layer_norm")}
    assert batchable == {"rms_norm": ("x",), "bias_gelu": ("x",), "add_layer_norm": ("x", "residual")}


@pytest.mark.parametrize("device", DEVICES)
def test_a_batched_first_input_is_one_call(device):
    x, w = torch.randn(5, 3, 16, device=device), torch.randn(16, device=device)
    torch.testing.assert_close(vmap(lambda a: torch.ops.examples.rms_norm(a, w))(x), torch.ops.examples.rms_norm(x, w))
    r = torch.randn(3, 16, device=device)  # unbatched, same_shape as x: follows the batch
    b, g = torch.randn(16, device=device), torch.randn(16, device=device)
    out = vmap(lambda a: torch.ops.examples.add_layer_norm(a, r, g, b))(x)
    torch.testing.assert_close(out, torch.ops.examples.add_layer_norm(x, r.expand(5, 3, 16), g, b))


@pytest.mark.parametrize("device", DEVICES)
def test_a_batched_weight_is_computed_per_element(device):
    x, w = torch.randn(5, 3, 16, device=device), torch.randn(5, 16, device=device)
    expected = torch.stack([torch.ops.examples.rms_norm(x[i], w[i]) for i in range(5)])
    torch.testing.assert_close(vmap(torch.ops.examples.rms_norm)(x, w), expected)


def test_nested_vmap_and_another_batch_dim():
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(
        vmap(vmap(lambda a: torch.ops.examples.softshrink(a, 0.5)))(x), torch.nn.functional.softshrink(x, 0.5)
    )
    out = vmap(lambda a: torch.ops.examples.softshrink(a, 0.5), in_dims=1)(x)
    torch.testing.assert_close(out, torch.nn.functional.softshrink(x, 0.5).movedim(1, 0))


def test_a_zero_size_batch():
    w = torch.randn(16)
    assert vmap(lambda a: torch.ops.examples.rms_norm(a, w))(torch.randn(0, 3, 16)).shape == (0, 3, 16)
    assert vmap(torch.ops.examples.rms_norm)(torch.randn(0, 3, 16), torch.randn(0, 16)).shape == (0, 3, 16)


def test_an_op_of_fixed_rank_falls_back_per_element(rule_ops):
    assert opforge.find_op("fixture::cycle_rows").batchable == ()
    x = torch.randn(4, 2, 3)
    out = vmap(lambda a: torch.ops.fixture.cycle_rows(a, 3))(x)
    torch.testing.assert_close(out, torch.stack([torch.ops.fixture.cycle_rows(x[i], 3) for i in range(4)]))
    # scale_pair's key_out is None without key: the rule returns it unbatched (vmap's caller may not)
    torch.testing.assert_close(vmap(lambda a: torch.ops.fixture.scale_pair(a)[0])(x), 2 * x)


@pytest.mark.parametrize("batch", [3, 0])
def test_an_op_with_data_dependent_sizes_is_refused_by_name(rule_ops, batch):
    """As torch refuses nonzero under vmap: each element's kept values may differ in number."""
    x = torch.randn(batch, 8)
    with pytest.raises(RuntimeError, match=r"vmap: fixture::compact cannot be batched: .*outputs kept depend"):
        vmap(lambda a: torch.ops.fixture.compact(a, 0.0))(x)


@pytest.mark.parametrize("device", DEVICES)
def test_writing_an_unbatched_input_while_another_is_batched_is_refused(device):
    """Each element of the batch would write the same residual, one after another; torch refuses
    its own in-place ops so. A batched residual is written element by element."""
    opforge.load_library(opforge.example_library("fused_add_rms_norm"))
    x, w = torch.randn(3, 2, 8, device=device), torch.rand(8, device=device) + 0.5
    residual = torch.randn(2, 8, device=device)
    before = residual.clone()
    with pytest.raises(RuntimeError) as err:
        vmap(lambda a: torch.ops.examples.fused_add_rms_norm(a, residual, w, 1e-6))(x.clone())
    assert str(err.value) == (
        "vmap: examples::fused_add_rms_norm writes residual in place, but residual is not batched while x is: "
        "every element of the batch would write the same residual; batch residual too (e.g. "
        "residual.expand(batch, ...).clone()) or call the op outside vmap"
    )
    torch.testing.assert_close(residual, before)  # nothing was written
    batched = residual.expand(3, 2, 8).clone()
    mine, theirs = x.clone(), x.clone()
    vmap(lambda a, r: (torch.ops.examples.fused_add_rms_norm(a, r, w, 1e-6), a)[1])(mine, batched)
    torch.ops.examples.fused_add_rms_norm(theirs, residual.expand(3, 2, 8).clone(), w, 1e-6)
    torch.testing.assert_close(mine, theirs)
