"""examples::scaled_fp8_quant (examples/ops/fp8_quant), vLLM's functional scaled_fp8_quant: shape
rules that follow a parameter's value (the scale, given or returned, is [tokens, 1] under
use_per_token_if_dynamic and [1] otherwise; Note [Rules that follow a parameter]). The CPU reference
against a torch expression of vLLM's rules, bit for bit, in each mode; the messages; the Meta kernel
under torch.compile(dynamic=True) and torch.export for both values; the description and stubs;
CUDA against the reference (on a GPU); verify."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch._dynamo.testing

import opforge
from conftest import DEVICES, requires_cuda
from opforge import verify
from opforge.stubs import stub_text

ROOT = Path(__file__).resolve().parents[2]
E4M3 = torch.float8_e4m3fn
TOP = torch.finfo(E4M3).max
SMALLEST = 1 / (TOP * 512)
ACTIVATIONS = (torch.float32, torch.float16, torch.bfloat16)
HEAD = (
    "examples::scaled_fp8_quant(Tensor input, Tensor? scale=None, SymInt num_token_padding=0, "
    "Tensor? scale_ub=None, bool use_per_token_if_dynamic=False) -> (Tensor, Tensor): invalid arguments\n"
)


@pytest.fixture(scope="module", autouse=True)
def fp8_quant():
    opforge.load_library(opforge.example_library("fp8_quant"))


def quant(x, scale=None, padding=0, scale_ub=None, per_token=False):
    """vLLM's scaled_fp8_quant in torch (functional), with padding rows zero and their per-token
    scale 1, and a computed scale at least 1 / (448 * 512)."""
    rows = max(x.shape[0], padding)
    xf = x.float()
    if per_token:
        if scale is None:
            absmax = xf.abs().nan_to_num(nan=0.0).amax(-1, keepdim=True)
            if scale_ub is not None:
                absmax = absmax.clamp(max=scale_ub)
            scale = (absmax / TOP).clamp(min=SMALLEST)
        q = (xf / scale).clamp(-TOP, TOP).to(E4M3)
        scale = torch.cat([scale, torch.ones(rows - x.shape[0], 1)])
    else:
        if scale is None:
            scale = (xf.abs().nan_to_num(nan=0.0).amax() / TOP).clamp(min=SMALLEST).reshape(1)
        q = (xf * scale.reciprocal()).clamp(-TOP, TOP).to(E4M3)
    q = torch.cat([q, torch.zeros(rows - x.shape[0], x.shape[1]).to(E4M3)])
    return q, scale


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    g, w = got.cpu().contiguous(), want.cpu().contiguous()
    return bool(((g.view(torch.uint8) == w.view(torch.uint8)) | (g.float().isnan() & w.float().isnan())).all())


def activations(rows, cols, dtype, device="cpu"):
    x = (torch.randn(rows, cols, device=device) * 100).to(dtype)
    if rows > 2 and cols > 2:
        x[1, 2], x[0] = float("nan"), 0.0
    return x


MODES = {
    "static per tensor": dict(scale=torch.tensor([0.37])),
    "dynamic per tensor": dict(),
    "dynamic per token": dict(per_token=True),
    "dynamic per token, scale_ub": dict(per_token=True, scale_ub=torch.tensor([50.0])),
    "static per token": dict(per_token=True, scale=torch.rand(7, 1) + 0.1),
    "dynamic per tensor, padded": dict(padding=10),
    "dynamic per token, padded": dict(per_token=True, padding=10),
}


def call(x, scale=None, padding=0, scale_ub=None, per_token=False):
    return torch.ops.examples.scaled_fp8_quant(x, scale, padding, scale_ub, per_token)


@pytest.mark.parametrize("xtype", ACTIVATIONS)
@pytest.mark.parametrize("mode", MODES)
def test_reference_is_vllms_rule(xtype, mode):
    x = activations(7, 40, xtype)
    out, scale = call(x, **MODES[mode])
    want, want_scale = quant(x, **MODES[mode])
    assert out.dtype == E4M3 and out.shape == want.shape
    assert same_bytes(out, want)
    assert torch.equal(scale, want_scale)


def test_the_scale_follows_use_per_token_if_dynamic():
    x = torch.randn(4, 8)
    assert call(x, per_token=True)[1].shape == (4, 1)
    assert call(x)[1].shape == (1,)
    assert call(x, padding=6, per_token=True)[1].shape == (6, 1)
    assert call(x, padding=6)[0].shape == (6, 8)
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape(HEAD + "  scale: expected rank 2 where use_per_token_if_dynamic is true, got rank 1 (shape [1])")
        + "$",
    ):
        call(x, torch.ones(1), per_token=True)
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape(
            HEAD
            + "  scale: expected shape [input.size(0), 1] = [4, 1] where use_per_token_if_dynamic is true, got [5, 1]"
        )
        + "$",
    ):
        call(x, torch.ones(5, 1), per_token=True)
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape(HEAD + "  scale: expected shape [1] = [1] where use_per_token_if_dynamic is false, got [4]")
        + "$",
    ):
        call(x, torch.ones(4))


@pytest.mark.parametrize("per_token", [True, False])
def test_compiles_once_for_every_token_count(per_token):
    frames = torch._dynamo.testing.CompileCounter()
    fn = torch.compile(lambda x: call(x, per_token=per_token), backend=frames, fullgraph=True, dynamic=True)
    for rows in (3, 5, 8, 13):
        x = torch.randn(rows, 16)
        out, scale = fn(x)
        want, want_scale = quant(x, per_token=per_token)
        assert same_bytes(out, want) and torch.equal(scale, want_scale)
    assert frames.frame_count == 1


class Quant(torch.nn.Module):
    def __init__(self, per_token: bool):
        super().__init__()
        self.per_token = per_token

    def forward(self, x):
        return call(x, per_token=self.per_token)


@pytest.mark.parametrize("per_token", [True, False])
def test_export_keeps_the_token_dim_dynamic(per_token):
    tokens = torch.export.Dim("tokens", min=2, max=1024)
    program = torch.export.export(Quant(per_token), (torch.randn(4, 16),), dynamic_shapes={"x": {0: tokens}})
    x = torch.randn(9, 16)
    out, scale = program.module()(x)
    assert out.shape == (9, 16) and scale.shape == ((9, 1) if per_token else (1,))
    assert same_bytes(out, quant(x, per_token=per_token)[0])


def test_the_description_and_stubs_show_the_rules():
    op = opforge.find_op("examples::scaled_fp8_quant")
    scale = next(a for a in op.tensors if a.name == "scale")
    assert scale.shape == ("1",)
    assert [(c.param, c.value, c.shape) for c in scale.shape_cases] == [
        ("use_per_token_if_dynamic", True, ("input.size(0)", "1"))
    ]
    assert [(c.value, c.shape) for c in op.outputs[1].cases] == [(True, ("max(input.size(0), num_token_padding)", "1"))]
    # verify draws each value of the parameter the shape rules follow.
    assert {c["use_per_token_if_dynamic"] for c in op.dtype_combinations} == {True, False}
    text = stub_text("examples", [op])
    assert (
        "Shapes: scale: [input.size(0), 1] where use_per_token_if_dynamic is True, else [1]; "
        "output_scale: [max(input.size(0), num_token_padding), 1] where use_per_token_if_dynamic is True, else [1]."
    ) in text


def test_kernels_compile_for_both_values_without_a_gpu(tmp_path):
    for per_token in (True, False):
        for xtype in ACTIVATIONS:
            opforge.precompile(
                "examples::scaled_fp8_quant",
                {"input": xtype},
                {"use_per_token_if_dynamic": per_token},
                arch="sm_90",
                cache_dir=tmp_path,
            )  # raises OpforgeError with NVRTC's log where a kernel does not compile


@requires_cuda
@pytest.mark.parametrize("xtype", ACTIVATIONS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cols", [40, 4096 + 8])
def test_cuda_kernel_matches_the_reference(xtype, mode, cols):
    kwargs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in MODES[mode].items()}
    x = activations(7, cols, xtype, "cuda")
    out, scale = call(x, **kwargs)
    want, want_scale = call(x.cpu(), **MODES[mode])
    assert same_bytes(out, want)
    assert torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("device", DEVICES)
def test_verify(device):
    report = verify.verify_op("examples::scaled_fp8_quant", device=device, seed=11)
    assert report.ok, [(r.check, r.dtype, r.case, r.message) for r in report.failures]


@pytest.mark.parametrize(
    "rule",
    [
        '.input("s", opforge::kFloat32, opforge::when("wide", true, opforge::shape({2})), opforge::mutated)'
        '.param<bool>("wide").reference(ref_in)',
        '.param<bool>("wide").output("s", opforge::when("wide", true, opforge::shape({2})), opforge::kFloat32)'
        ".reference(ref_out)",
    ],
)
def test_a_shape_rule_without_otherwise_does_not_compile(tmp_path, rule):
    """opforge::when(param, value, shape) without .otherwise(shape) leaves some values without a
    shape: the declaration stops at compile time with one sentence (a static_assert)."""
    src = tmp_path / "partial.cpp"
    src.write_text(
        "#include <opforge/op.h>\n"
        "static void ref_in(opforge::Tensor, opforge::MutableTensor, bool) {}\n"
        "static void ref_out(opforge::Tensor, bool, opforge::MutableTensor) {}\n"
        f'OPFORGE_OP(unit, partial).input("x", opforge::kFloat16){rule};\n'
    )
    proc = subprocess.run(
        ["c++", "-std=c++20", "-fsyntax-only", f"-I{ROOT / 'include'}", str(src)], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "opforge: opforge::when(...) needs .otherwise(shape): the shape rule of the values no case names" in (
        proc.stderr
    )
