"""examples::attention: the CPU reference and the CUDA kernel against SDPA in float64, and their
lse against float64 logsumexp (padding mask, causal, lengths that straddle the kernel's 128-row
and 32/64-key tiles, both head dims), fully masked rows, misaligned inputs, bad arguments,
opcheck, and compile/export with dynamic batch and sequence length; its backward op
(examples::attention_backward): gradcheck of the CPU reference in float64, gradients against
SDPA's on the CPU and on the GPU, and the CUDA kernel's dtypes (16-bit only:
opforge::kernel_dtypes)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import opforge
from conftest import DEVICES, requires_cuda, requires_two_gpus

#: Against a float64 SDPA: outputs are weighted means of v (|o| < 4 for randn inputs), rounded to
#: the dtype; the kernel also rounds the probabilities to the dtype before P @ V.
TOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


@pytest.fixture(scope="module", autouse=True)
def library():
    return opforge.load_library(opforge.example_library("attention"))


def additive_bias(sq, sk, mask, causal, dtype, device):
    """The op's masks as one additive bias [batch, 1, sq, sk] (or [sq, sk] without a key mask):
    -inf above the diagonal where causal, plus the key mask [batch, sk]."""
    bias = torch.zeros(sq, sk, dtype=dtype, device=device)
    if causal:
        bias = bias + torch.full_like(bias, float("-inf")).triu(1)
    if mask is not None:
        bias = bias + mask.to(dtype=dtype, device=device)[:, None, None, :]
    return bias


def expected(q, k, v, mask=None, causal=False, scale=None):
    """SDPA in float64 on the CPU with the op's masks as one additive bias."""
    bias = additive_bias(q.shape[2], k.shape[2], mask, causal, torch.float64, "cpu")
    return F.scaled_dot_product_attention(
        q.double().cpu(), k.double().cpu(), v.double().cpu(), attn_mask=bias, scale=scale
    )


def expected_lse(q, k, mask=None, causal=False, scale=None):
    """Each query row's log-sum-exp of its scores in float64 on the CPU (expected()'s masks)."""
    bias = additive_bias(q.shape[2], k.shape[2], mask, causal, torch.float64, "cpu")
    s = scale or q.shape[-1] ** -0.5
    return torch.logsumexp(q.double().cpu() @ k.double().cpu().mT * s + bias, -1)


def inputs(batch, heads, sq, sk, head_dim, dtype, device, mask=False):
    q = torch.randn(batch, heads, sq, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(batch, heads, sk, head_dim, dtype=dtype, device=device) for _ in range(2))
    m = torch.randn(batch, sk, dtype=dtype, device=device) if mask else None
    return q, k, v, m


def check(dtype, device, batch, heads, sq, sk, head_dim, causal, mask, scale=0.0):
    q, k, v, m = inputs(batch, heads, sq, sk, head_dim, dtype, device, mask)
    out, lse = torch.ops.examples.attention(q, k, v, head_dim, m, causal=causal, scale=scale)
    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.device == q.device
    ref = expected(q, k, v, m, causal, scale or None)
    torch.testing.assert_close(out.double().cpu(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    # float32 sums of exponentials of scores the kernel computes exactly from the 16-bit inputs
    torch.testing.assert_close(lse.double().cpu(), expected_lse(q, k, m, causal, scale or None), atol=2e-3, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("sq, sk", [(1, 1), (5, 7), (7, 5)])
def test_cpu_reference_matches_sdpa(dtype, causal, mask, sq, sk):
    check(dtype, "cpu", 2, 3, sq, sk, 64, causal, mask)


def test_cpu_reference_head_dim_128_and_explicit_scale():
    check(torch.bfloat16, "cpu", 1, 2, 6, 9, 128, True, True, scale=0.3)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("sq, sk", [(1, 1), (63, 65), (129, 129), (300, 257), (128, 32), (40, 700)])
def test_cuda_matches_sdpa(dtype, head_dim, causal, mask, sq, sk):
    check(dtype, "cuda", 2, 3, sq, sk, head_dim, causal, mask)


@requires_cuda
def test_cuda_matches_cpu_reference():
    q, k, v, m = inputs(2, 2, 150, 190, 128, torch.bfloat16, "cuda", mask=True)
    out, lse = torch.ops.examples.attention(q, k, v, 128, m, causal=True, scale=0.05)
    ref, ref_lse = torch.ops.examples.attention(q.cpu(), k.cpu(), v.cpu(), 128, m.cpu(), causal=True, scale=0.05)
    torch.testing.assert_close(out.cpu().double(), ref.double(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=2e-3, rtol=1e-5)


@requires_two_gpus
def test_inputs_on_a_non_current_gpu():
    q, k, v, m = inputs(2, 3, 70, 90, 64, torch.bfloat16, "cuda:1", mask=True)
    with torch.cuda.device(0):
        out, _ = torch.ops.examples.attention(q, k, v, 64, m, causal=True)
    assert out.device == torch.device("cuda:1")
    torch.testing.assert_close(
        out.double().cpu(), expected(q, k, v, m, True), atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16]
    )
    with pytest.raises(ValueError, match=r"mask: expected device cuda:1 \(the device of q\), got cuda:0"):
        torch.ops.examples.attention(q, k, v, 64, m.to("cuda:0"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128])  # 128: the wgmma path on Hopper
def test_fully_masked_rows_give_zeros(device, head_dim):
    q, k, v, _ = inputs(2, 2, 9, 11, head_dim, torch.float16, device)
    mask = torch.zeros(2, 11, dtype=torch.float16, device=device)
    mask[0] = float("-inf")  # batch 0 sees no key
    out, lse = torch.ops.examples.attention(q, k, v, head_dim, mask)
    assert torch.equal(out[0].cpu(), torch.zeros_like(out[0].cpu()))
    assert torch.equal(lse[0].cpu(), torch.full_like(lse[0].cpu(), float("-inf")))  # logsumexp of no key
    assert lse[1].isfinite().all()
    torch.testing.assert_close(out[1].double().cpu(), expected(q, k, v, mask)[1], atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_and_strided_inputs(device):
    q, k, v, m = inputs(2, 2, 70, 70, 64, torch.bfloat16, device, mask=True)
    ref = torch.ops.examples.attention(q, k, v, 64, m)
    q_offset = torch.empty(q.numel() + 1, dtype=q.dtype, device=device)[1:].view(q.shape).copy_(q)  # 2-byte aligned
    k_permuted = k.transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] memory, as a model's reshape gives
    out = torch.ops.examples.attention(q_offset, k_permuted, v, 64, m)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_keys_and_values_shared_by_every_head(device, head_dim):
    """Multi-query attention as a model writes it: one head of k and v expanded over the heads
    (stride 0), which the kernel reads as it is (the Hopper path through tensor maps)."""
    q, k, v, _ = inputs(2, 4, 140, 130, head_dim, torch.bfloat16, device)
    k1, v1 = k[:, :1].expand_as(k), v[:, :1].expand_as(v)
    assert k1.stride(1) == 0
    out = torch.ops.examples.attention(q, k1, v1, head_dim, causal=True)
    dense = torch.ops.examples.attention(q, k1.contiguous(), v1.contiguous(), head_dim, causal=True)
    torch.testing.assert_close(out, dense, atol=0, rtol=0)  # o and lse


def copies_made(fn) -> int:
    """ATen copies (aten::copy_) that running ``fn`` dispatches, counted with torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name == "aten::copy_")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_split_views_reach_the_kernel_without_a_copy(device, head_dim):
    """q, k, v are declared opforge::contiguous_last_dim: a model's head split (a transpose of a
    [B, S, H * D] projection, here one fused q/k/v projection) is read in place by the kernel,
    whose result equals that of dense inputs; a view whose last dim is strided, or whose rows
    are not 16-byte aligned, is copied first and gives the same result too."""
    batch, seq, heads = 2, 150, 3
    qkv = torch.randn(batch, seq, 3, heads, head_dim, dtype=torch.bfloat16, device=device)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, H, S, D], rows 3 * H * D apart
    assert not q.is_contiguous() and q.stride(-1) == 1
    mask = torch.randn(batch, seq, dtype=torch.bfloat16, device=device)
    dense = torch.ops.examples.attention(q.contiguous(), k.contiguous(), v.contiguous(), head_dim, mask, causal=True)
    out = torch.ops.examples.attention(q, k, v, head_dim, mask, causal=True)
    torch.testing.assert_close(out, dense, atol=0, rtol=0)
    assert copies_made(lambda: torch.ops.examples.attention(q, k, v, head_dim, mask, causal=True)) == 0
    strided_last = q.transpose(2, 3).contiguous().transpose(2, 3)  # same values, last dim strided
    misaligned = torch.empty(q.numel() + 1, dtype=q.dtype, device=device)[1:].view(q.shape).copy_(q)
    for view in (strided_last, misaligned):
        assert copies_made(lambda view=view: torch.ops.examples.attention(view, k, v, head_dim, mask, causal=True)) == 1
        torch.testing.assert_close(
            torch.ops.examples.attention(view, k, v, head_dim, mask, causal=True), dense, atol=0, rtol=0
        )


@pytest.mark.parametrize("device", DEVICES)
def test_empty_sequences(device):
    q, k, v, _ = inputs(2, 2, 0, 5, 64, torch.float16, device)
    o, lse = torch.ops.examples.attention(q, k, v, 64)
    assert o.shape == (2, 2, 0, 64) and lse.shape == (2, 2, 0)
    q, k, v, _ = inputs(2, 2, 3, 0, 64, torch.float16, device)
    o, lse = torch.ops.examples.attention(q, k, v, 64)
    assert torch.equal(o.cpu(), torch.zeros(2, 2, 3, 64, dtype=torch.float16))
    assert torch.equal(lse.cpu(), torch.full((2, 2, 3), float("-inf")))


def test_bad_arguments_name_the_problem():
    q, k, v, _ = inputs(2, 2, 4, 5, 64, torch.float16, "cpu")
    with pytest.raises(ValueError, match="head_dim: expected one of 32, 64, 128, got 96"):
        torch.ops.examples.attention(q[..., :48].repeat(1, 1, 1, 2), k, v, 96)
    with pytest.raises(ValueError, match=r"q: expected shape \[\*, \*, \*, head_dim\] = \[\*, \*, \*, 128\]"):
        torch.ops.examples.attention(q, k, v, 128)
    with pytest.raises(ValueError, match=r"mask: expected shape \[q.size\(0\), k.size\(2\)\] = \[2, 5\], got \[2, 4\]"):
        torch.ops.examples.attention(q, k, v, 64, torch.zeros(2, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="q: expected dtype one of {float32, float64, float16, bfloat16}, got int32"):
        torch.ops.examples.attention(q.int(), k.int(), v.int(), 64)
    with pytest.raises(ValueError, match="v: expected shape"):
        torch.ops.examples.attention(q, k, v[:, :, :4], 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_opcheck(device, with_mask):
    q, k, v, m = inputs(2, 2, 5, 6, 64, torch.bfloat16, device, mask=with_mask)
    torch.library.opcheck(torch.ops.examples.attention.default, (q, k, v, 64, m, True, 0.0))


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_compile_and_export_with_dynamic_batch_and_sequence(device):
    class Block(torch.nn.Module):
        def forward(self, q, k, v, mask):
            o, lse = torch.ops.examples.attention(q, k, v, 64, mask)
            return o * 2, lse

    torch._dynamo.reset()
    compiled = torch.compile(Block(), fullgraph=True, dynamic=True)
    for batch, seq in ((3, 9), (4, 17), (6, 33)):  # sizes unlike the 2 heads (no duck sizing)
        q, k, v, m = inputs(batch, 2, seq, seq, 64, torch.float16, device, mask=True)
        with torch._dynamo.config.patch(error_on_recompile=batch != 3):
            torch.testing.assert_close(compiled(q, k, v, m), Block()(q, k, v, m))
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=4096)
    q, k, v, m = inputs(3, 2, 9, 9, 64, torch.float16, device, mask=True)
    dims = {0: batch, 2: seq}
    program = torch.export.export(Block(), (q, k, v, m), dynamic_shapes=(dims, dims, dims, {0: batch, 1: seq}))
    q, k, v, m = inputs(4, 2, 21, 21, 64, torch.float16, device, mask=True)
    torch.testing.assert_close(program.module()(q, k, v, m), Block()(q, k, v, m))


# ---- backward (examples::attention_backward) ---------------------------------------------------


def sdpa_grads(q, k, v, grad_o, mask=None, causal=False, scale=None):
    """The gradients of q, k and v through float64 SDPA on the CPU (expected()'s masks)."""
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    out = expected(*leaves, mask, causal, scale)
    return torch.autograd.grad(out, leaves, grad_o.double().cpu())


def op_grads(q, k, v, grad_o, head_dim, mask=None, causal=False, scale=0.0):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, _ = torch.ops.examples.attention(*leaves, head_dim, mask, causal=causal, scale=scale)
    return torch.autograd.grad(out, leaves, grad_o)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("sq, sk", [(3, 5), (5, 3)])
def test_gradcheck_of_the_cpu_reference_in_float64(causal, mask, sq, sk):
    q, k, v, m = inputs(1, 2, sq, sk, 32, torch.float64, "cpu", mask)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(
        lambda q, k, v: torch.ops.examples.attention(q, k, v, 32, m, causal=causal, scale=0.3), leaves
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_gradients_match_sdpa(dtype):
    q, k, v, m = inputs(2, 3, 7, 9, 64, dtype, "cpu", mask=True)
    grad_o = torch.randn_like(q)
    got = op_grads(q, k, v, grad_o, 64, m, causal=True)
    want = sdpa_grads(q, k, v, grad_o, m, causal=True)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for g, w in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), w, atol=tol, rtol=tol)


def test_fully_masked_rows_get_zero_gradients_and_nan_stays_nan():
    q, k, v, _ = inputs(1, 1, 3, 4, 32, torch.float64, "cpu")
    mask = torch.full((1, 4), float("-inf"), dtype=torch.float64)
    for g in op_grads(q, k, v, torch.randn_like(q), 32, mask):
        assert torch.equal(g, torch.zeros_like(g))
    q[0, 0, 1, 0] = float("nan")
    gq, gk, gv = op_grads(q, k, v, torch.randn_like(q), 32)
    assert gq[0, 0, 1].isnan().all() and not gq[0, 0, 0].isnan().any()
    assert gk.isnan().any() and gv.isnan().any()


def test_a_mask_that_requires_grad_gets_none():
    q, k, v, m = inputs(1, 1, 3, 4, 32, torch.float32, "cpu", mask=True)
    out, _ = torch.ops.examples.attention(q.requires_grad_(), k, v, 32, m.requires_grad_())
    with pytest.raises(NotImplementedError, match="examples::attention"):
        out.sum().backward()


def test_lse_is_not_differentiable():
    """attention_backward takes no grad_lse, so lse records no history (torch's
    output_differentiability: False, as for _scaled_dot_product_flash_attention's logsumexp):
    a loss through it alone raises instead of getting a gradient that was dropped."""
    q, k, v, _ = inputs(1, 2, 3, 4, 32, torch.float32, "cpu")
    o, lse = torch.ops.examples.attention(q.requires_grad_(), k, v, 32)
    assert o.requires_grad and o.grad_fn is not None
    assert not lse.requires_grad and lse.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()
    (o.sum() + lse.sum()).backward()  # a loss through both: the gradient is o's alone
    (want,) = torch.autograd.grad(torch.ops.examples.attention(q, k, v, 32)[0].sum(), q)
    torch.testing.assert_close(q.grad, want)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("sq, sk", [(1, 1), (63, 65), (129, 129), (300, 257), (40, 700)])
def test_cuda_gradients_match_sdpa(dtype, head_dim, causal, mask, sq, sk):
    """FlashAttention's test criterion (tests/test_flash_attn.py of its repository): each
    gradient's largest error against float64 SDPA is at most twice that of attention written in
    plain torch in the same dtype on the GPU (plain_torch_grads), plus twice the float32 rounding
    of the reference at 0.3 (its atol), plus the bound of dp_minus_delta_rounding: with one key
    softmax's gradient is exactly 0 in torch, while the kernel's float32 dP - delta (two sums in
    different orders) leaves up to that much."""
    q, k, v, m = inputs(2, 3, sq, sk, head_dim, dtype, "cuda", mask)
    grad_o = torch.randn_like(q)
    got = op_grads(q, k, v, grad_o, head_dim, m, causal=causal)
    want = sdpa_grads(q, k, v, grad_o, m, causal=causal)
    theirs = plain_torch_grads(q, k, v, grad_o, m, causal=causal)
    rounding = dp_minus_delta_rounding(q, k, v, grad_o, m, causal)
    for name, g, w, t, r in zip("qkv", got, want, theirs, rounding):
        assert g.dtype == dtype and g.shape == w.shape
        ours_err = (g.double().cpu() - w).abs().max().item()
        torch_err = (t.double().cpu() - w).abs().max().item()
        atol = 2 * (w.float() + 0.3 - 0.3 - w.float()).abs().max().item() + r
        assert ours_err <= 2 * torch_err + atol, (name, ours_err, torch_err, atol)


def dp_minus_delta_rounding(q, k, v, grad_o, mask=None, causal=False):
    """Bounds on the largest error of dQ, dK and dV that the float32 rounding of a backward
    kernel's dS = P (dP - delta) brings (FlashAttention's backward: dP_ij = dO_i . v_j and
    delta_i = dO_i . O_i, each a float32 dot product of head_dim terms), where plain torch may
    have none (one key: dS is exactly 0 in torch). A float32 dot product of n terms errs by at
    most gamma_n sum |x_i y_i|, gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and
    Stability of Numerical Algorithms, 2nd ed., eq. 3.5); |O_i| <= max_j |v_j| elementwise, so
    e_i = gamma_n (max_j |dO_i| . |v_j| + |dO_i| . max_j |v_j|) bounds |err(dP_ij - delta_i)|.
    Then dQ_i = scale sum_j P_ij dS_ij k_j errs by at most scale e_i (P |k|)_i and dK_j by
    scale (P^T (e |q|))_j; dV = P^T dO has no such term. Computed in float64 on the CPU."""
    qd, kd, vd, go = (t.double().cpu() for t in (q, k, v, grad_o))
    n = q.shape[-1]
    gamma = n * 2.0**-24 / (1 - n * 2.0**-24)
    eye = torch.eye(k.shape[2], dtype=torch.float64).expand(*k.shape[:2], -1, -1)
    p = expected(qd, kd, eye, mask, causal).nan_to_num(0.0)  # softmax probabilities: attention over I
    e = gamma * ((go.abs() @ vd.abs().mT).amax(-1, keepdim=True) + go.abs() @ vd.abs().amax(2).unsqueeze(-1))
    scale = n**-0.5
    return (scale * e * (p @ kd.abs())).max().item(), (scale * p.mT @ (e * qd.abs())).max().item(), 0.0


def plain_torch_grads(q, k, v, grad_o, mask=None, causal=False):
    """The gradients of q, k and v through attention in plain torch, in the inputs' dtype on their
    device: softmax(q / sqrt(D) k^T + bias) v with every product rounded to the dtype
    (FlashAttention's attention_ref with upcast=False, the baseline of its tests)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    bias = additive_bias(q.shape[2], k.shape[2], mask, causal, q.dtype, q.device)
    scores = (leaves[0] / math.sqrt(q.shape[-1])) @ leaves[1].transpose(-1, -2) + bias
    out = scores.softmax(-1) @ leaves[2]
    return torch.autograd.grad(out, leaves, grad_o)


@requires_cuda
def test_cuda_gradients_of_head_split_views():
    batch, seq, heads, head_dim = 2, 77, 4, 64
    qkv = torch.randn(batch, seq, 3 * heads * head_dim, dtype=torch.bfloat16, device="cuda")
    q, k, v = (t.view(batch, seq, heads, head_dim).transpose(1, 2) for t in qkv.split(heads * head_dim, -1))
    grad_o = torch.randn(batch, heads, seq, head_dim, dtype=torch.bfloat16, device="cuda")
    got = op_grads(q, k, v, grad_o, head_dim, causal=True)
    dense = op_grads(q.contiguous(), k.contiguous(), v.contiguous(), grad_o, head_dim, causal=True)
    for g, d in zip(got, dense):
        torch.testing.assert_close(g, d, atol=0, rtol=0)


@requires_cuda
def test_the_cuda_kernels_take_16_bit_inputs_only():
    q, k, v, _ = inputs(1, 2, 5, 6, 64, torch.float32, "cuda")
    with pytest.raises(ValueError) as err:
        torch.ops.examples.attention(q, k, v, 64)
    message = "q: expected dtype one of {float16, bfloat16} on cuda (its cuda kernel takes no other), got"
    assert message in str(err.value)
    grad_o, o, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(q.shape[:3], device="cuda")
    with pytest.raises(ValueError, match="q: expected dtype one of {float16, bfloat16} on cuda"):
        torch.ops.examples.attention_backward(q, k, v, grad_o, o, lse, 64)


def test_compiled_training_step_uses_the_backward_op():
    """torch.compile (fullgraph) of attention followed by a loss: AOTAutograd traces the backward
    through examples::attention_backward (the op's only derivative), and the gradients equal
    eager's."""

    def loss(q, k, v, mask):
        return (torch.ops.examples.attention(q, k, v, 32, mask, causal=True)[0] ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    q, k, v, m = inputs(2, 2, 6, 9, 32, torch.float32, "cpu", mask=True)
    eager_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    loss(*eager_leaves, m).backward()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves, m).backward()
    for got, want in zip(leaves, eager_leaves):
        torch.testing.assert_close(got.grad, want.grad)


def fa2_grads(grad_o, q, k, v, o, lse, mask=None, causal=False, scale=None):
    """FlashAttention-2's backward formula in float64, with the probabilities from lse and the
    softmax's row sums from o."""
    grad_o, q, k, v, o, lse = (t.double().cpu() for t in (grad_o, q, k, v, o, lse))
    s = scale or q.shape[-1] ** -0.5
    bias = additive_bias(q.shape[2], k.shape[2], mask, causal, torch.float64, "cpu")
    p = (q @ k.mT * s + bias - lse[..., None]).exp()
    ds = p * (grad_o @ v.mT - (grad_o * o).sum(-1, keepdim=True))
    return s * ds @ k, s * ds.mT @ q, p.mT @ grad_o


@pytest.mark.parametrize("device", DEVICES)
def test_the_backward_op_takes_the_softmax_statistics_from_the_given_o_and_lse(device):
    """o and lse enter as FlashAttention-2 takes them (grad_o . o for each row, probabilities
    exp(s - lse)), on every device alike, so a kernel and the reference agree for any o and lse
    (opforge verify draws them at random)."""
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    q, k, v, m = inputs(2, 3, 33, 70, 64, dtype, device, mask=True)
    grad_o, o = torch.randn_like(q), torch.randn_like(q)
    lse = expected_lse(q, k, m, causal=True).float().to(device) + torch.rand(q.shape[:3], device=device)
    got = torch.ops.examples.attention_backward(q, k, v, grad_o, o, lse, 64, m, True)
    want = fa2_grads(grad_o, q, k, v, o, lse, m, causal=True)
    tol = 1e-10 if dtype == torch.float64 else 3e-2
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double().cpu(), w, atol=tol * (1 + w.abs().max().item()), rtol=tol)


def test_precompile_refuses_what_the_cuda_kernels_do_not_take():
    """Ahead-of-time kernels (attention_backward's) keep to their kernel_dtypes as run-time ones do."""
    requests = (("attention", dict.fromkeys("qkv", torch.float32)), ("attention_backward", {"q": torch.float32}))
    for name, dtypes in requests:
        with pytest.raises(ValueError, match="expected dtype one of {float16, bfloat16} on cuda"):
            opforge.precompile(f"examples::{name}", dtypes, {"head_dim": 64})
