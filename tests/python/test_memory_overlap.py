"""Written arguments that share memory with other arguments are refused before any launch
(Note [Memory overlap] in src/core/overlap.h): out= tensors overlapping an input, written inputs
that overlap another argument through non-dense views, and written views whose own elements
overlap. Views that interleave without sharing an element (q and k of one qkv buffer) pass."""

from __future__ import annotations

import pytest
import torch

import serving
from conftest import DEVICES

SOFTSHRINK_OUT = (
    "examples::softshrink.out(Tensor x, float lambd=0.5, *, Tensor(a!) y) -> Tensor(a!): invalid arguments\n"
)
RMS_NORM_OUT = (
    "examples::rms_norm.out(Tensor x, Tensor weight, float eps=1e-06, *, Tensor(a!) y) -> Tensor(a!): "
    "invalid arguments\n"
)
ROTARY = (
    "examples::rotary_embedding(Tensor positions, Tensor(a!) query, Tensor cos_sin_cache, Tensor(b!)? key=None, "
    "bool is_neox=True) -> (): invalid arguments\n"
)


@pytest.fixture(scope="module", autouse=True)
def serving_ops():
    serving.load()


@pytest.mark.parametrize("device", DEVICES)
def test_an_out_tensor_overlapping_an_input_is_refused(device):
    buf = torch.randn(8, device=device)
    before = buf.clone()
    with pytest.raises(ValueError) as err:
        torch.ops.examples.softshrink.out(buf[:4], 0.5, y=buf[1:5])
    assert (
        str(err.value)
        == SOFTSHRINK_OUT
        + "  y: expected memory of its own (the op writes it), got memory shared with x; pass x.clone()"
    )
    with pytest.raises(ValueError) as err:  # the same memory
        torch.ops.examples.softshrink.out(buf, 0.5, y=buf)
    assert (
        str(err.value)
        == SOFTSHRINK_OUT
        + "  y: expected memory of its own (the op writes it), got memory shared with x; pass x.clone()"
    )
    x = torch.randn(3, 8, device=device)
    with pytest.raises(ValueError) as err:  # the output aliasing the weight
        torch.ops.examples.rms_norm.out(x, x[0], 1e-6, y=x)
    assert (
        str(err.value)
        == RMS_NORM_OUT + "  y: expected memory of its own (the op writes it), got memory shared with x; pass x.clone()"
    )
    torch.testing.assert_close(buf, before)  # nothing was written
    y = torch.empty(16, device=device)
    torch.ops.examples.softshrink.out(buf, 0.5, y=y[8:])  # disjoint memory of one tensor is fine
    torch.testing.assert_close(y[8:], torch.nn.functional.softshrink(buf, 0.5))


@pytest.mark.parametrize("device", DEVICES)
def test_an_out_tensor_whose_elements_overlap_is_refused(device):
    x = torch.randn(4, 3, device=device)
    with pytest.raises(ValueError) as err:
        torch.ops.examples.softshrink.out(x, 0.5, y=torch.empty(1, 3, device=device).expand(4, 3))
    assert str(err.value) == SOFTSHRINK_OUT + (
        "  y: expected a tensor whose elements do not overlap in memory (the op writes it), got shape [4, 3] with "
        "strides [0, 1]"
    )


def rotary_inputs(device: str, tokens: int = 3, heads: int = 2, head_dim: int = 16):
    positions = torch.arange(tokens, device=device)
    cache = torch.randn(8, head_dim, device=device)
    qkv = torch.randn(tokens, 3 * heads * head_dim, device=device)
    return positions, cache, qkv


@pytest.mark.parametrize("device", DEVICES)
def test_written_head_split_views_that_share_memory_are_refused(device):
    positions, cache, qkv = rotary_inputs(device)
    q = qkv[:, : 2 * 16].view(3, 2, 16)  # a head-split view: not dense
    before = qkv.clone()
    with pytest.raises(ValueError) as err:  # the same view as query and key: every head would rotate twice
        torch.ops.examples.rotary_embedding(positions, q, cache, q)
    assert str(err.value) == ROTARY + (
        "  query: expected memory of its own (it is written in place), got memory shared with key; pass query.clone()"
    )
    k = qkv[:, 8:40].view(3, 2, 16)  # overlaps the second head of q in every token
    with pytest.raises(ValueError) as err:
        torch.ops.examples.rotary_embedding(positions, q, cache, k)
    assert str(err.value) == ROTARY + (
        "  query: expected memory of its own (it is written in place), got memory shared with key; pass query.clone()"
    )
    torch.testing.assert_close(qkv, before)  # nothing was written


@pytest.mark.parametrize("device", DEVICES)
def test_interleaved_views_that_share_no_element_pass(device):
    positions, cache, qkv = rotary_inputs(device)
    q, k = qkv[:, :32].view(3, 2, 16), qkv[:, 32:64].view(3, 2, 16)  # q and k of one qkv buffer
    want_q, want_k = q.clone(), k.clone()
    torch.ops.examples.rotary_embedding(positions, want_q, cache, want_k)
    torch.ops.examples.rotary_embedding(positions, q, cache, k)
    torch.testing.assert_close((q, k), (want_q, want_k))
    every_other = torch.randn(3, 2, 32, device=device)  # elements interleaved one by one
    q, k = every_other[..., 0::2], every_other[..., 1::2]
    want_q, want_k = q.clone(), k.clone()
    torch.ops.examples.rotary_embedding(positions, want_q, cache, want_k)
    torch.ops.examples.rotary_embedding(positions, q, cache, k)
    torch.testing.assert_close((q, k), (want_q, want_k))


@pytest.mark.parametrize("device", DEVICES)
def test_a_written_input_whose_strides_interleave_its_own_elements_is_refused(device):
    positions, cache, _ = rotary_inputs(device)
    storage = torch.randn(64, device=device)
    q = storage.as_strided((3, 2, 16), (16, 8, 1))  # heads overlap by 8 elements: two indices, one element
    with pytest.raises(ValueError) as err:
        torch.ops.examples.rotary_embedding(positions, q, cache)
    assert str(err.value) == ROTARY + (
        "  query: expected a tensor whose elements do not overlap in memory (it is written in place), got shape "
        "[3, 2, 16] with strides [16, 8, 1]"
    )
