"""Liger-Kernel's Triton kernels as opforge ops (examples/ops/liger, its PROVENANCE.md): the kernel
files are upstream's bytes; on the CPU the references match the ops' torch expressions, the
backward ops are the forward ops' gradients (float64 gradcheck), every kernel compiles for sm_90
and sm_80 without a GPU, and `opforge verify` passes; on a GPU the kernels match the references
in float32, float16 and bfloat16 over shapes with tails, under torch.compile without recompiles,
through autograd into the Triton backward kernels, and under CUDA graph capture."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import opforge
from conftest import TOLERANCE, requires_cuda

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "ops" / "liger"
ops = torch.ops.examples

requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed in this Python"
)

#: Each Triton op, the input dtypes of an instantiation, and a call's shapes (by input) with a
#: tail: rows of 1000 take a block of 1024.
TRITON_CALLS = {
    "examples::liger_rms_norm": (
        {"x": torch.bfloat16, "weight": torch.float32},
        {"x": (3, 5, 1000), "weight": (1000,)},
    ),
    "examples::liger_rms_norm_backward": (
        {"grad_y": torch.float16, "weight": torch.float16, "rstd": torch.float32},
        {"grad_y": (300, 1000), "x": (300, 1000), "weight": (1000,), "rstd": (300, 1)},
    ),
    "examples::liger_swiglu": ({"a": torch.bfloat16}, {"a": (7, 1000), "b": (7, 1000)}),
    "examples::liger_swiglu_backward": (
        {"grad_c": torch.float32},
        {"grad_c": (7, 1000), "a": (7, 1000), "b": (7, 1000)},
    ),
    "examples::liger_softmax": ({"x": torch.float16}, {"x": (9, 1000)}),
    "examples::liger_softmax_backward": ({"grad_y": torch.bfloat16}, {"grad_y": (9, 1000), "y": (9, 1000)}),
}


@pytest.fixture(scope="module")
def liger():
    return opforge.load_library(opforge.example_library("liger"))


def rms_norm_torch(x, weight, eps=1e-6, offset=0.0):
    """liger_rms_norm's equivalent: (y, rstd) in x's dtype computed in float64, rstd float32."""
    rstd = torch.rsqrt(x.double().square().mean(-1, keepdim=True) + eps)
    return (x.double() * rstd * (offset + weight.double())).to(x.dtype), rstd.float()


def test_the_kernel_files_are_upstreams():
    """Every vendored file has the sha256 its PROVENANCE.md row (from the wheel's RECORD) gives."""
    rows = re.findall(
        r"^\| `kernels/(\S+)` \| `\S+` \| `([0-9a-f]{64})` \|$", (FOLDER / "PROVENANCE.md").read_text(), re.M
    )
    assert len(rows) == 5
    for path, digest in rows:
        assert hashlib.sha256((FOLDER / "kernels" / path).read_bytes()).hexdigest() == digest, path


def test_the_description_names_liger_functions(liger):
    kernels = {op.name: [(k.source, k.name, k.backend) for k in op.runtime_kernels] for op in liger.ops}
    assert kernels["examples::liger_rms_norm"] == [("rms_norm.py", "_rms_norm_forward_kernel", "triton")]
    assert kernels["examples::liger_rms_norm_backward"] == [("rms_norm.py", "_rms_norm_backward_kernel", "triton")]
    assert kernels["examples::liger_swiglu"] == [("swiglu.py", "_swiglu_forward_kernel", "triton")]
    assert kernels["examples::liger_swiglu_backward"] == [("swiglu.py", "_swiglu_backward_kernel", "triton")]
    assert kernels["examples::liger_softmax"] == [("softmax.py", "_softmax_single_block_forward_kernel", "triton")]


@pytest.mark.parametrize("shape", [(6, 40), (2, 3, 1000), (1, 1), (4, 0), (0, 8)])
@pytest.mark.parametrize("casting_mode", ["llama", "gemma"])
def test_rms_norm_reference_matches_torch(liger, shape, casting_mode):
    x = torch.randn(shape, dtype=torch.float64)
    w = 1 + 0.1 * torch.randn(shape[-1], dtype=torch.float64)
    y, rstd = ops.liger_rms_norm(x, w, 1e-5, 0.5, casting_mode)
    want_y, want_rstd = rms_norm_torch(x, w, 1e-5, 0.5)
    torch.testing.assert_close(y, want_y, atol=1e-12, rtol=1e-12)
    assert rstd.dtype == torch.float32 and rstd.shape == (*shape[:-1], 1)
    torch.testing.assert_close(rstd, want_rstd, equal_nan=True)  # a row of no columns: 0/0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_and_softmax_references_match_torch(liger, dtype):
    a, b = torch.randn(3, 5, 100, dtype=dtype), torch.randn(3, 5, 100, dtype=dtype)
    want = (F.silu(a.double() * 0.7) * b.double()).to(dtype)
    torch.testing.assert_close(ops.liger_swiglu(a, b, 0.7), want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    x = 4 * torch.randn(7, 333, dtype=dtype)
    want = torch.softmax(x.double(), -1).to(dtype)
    torch.testing.assert_close(ops.liger_softmax(x), want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_gradients_are_those_of_the_forward_ops(liger):
    """torch.autograd.gradcheck in float64 through each forward op's Autograd kernel, which runs
    its backward op (rstd is saved in float32, within gradcheck's tolerance)."""
    x = torch.randn(3, 4, 7, dtype=torch.float64, requires_grad=True)
    w = (1 + 0.1 * torch.randn(7, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: ops.liger_rms_norm(x, w, 1e-6, 1.0, "gemma")[0], (x, w))
    a = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ops.liger_swiglu(a, b, 0.8), (a, b))
    assert torch.autograd.gradcheck(
        lambda x: ops.liger_softmax(x), (torch.randn(4, 6, dtype=torch.float64).requires_grad_(),)
    )


def test_swiglu_backward_writes_none_of_its_inputs(liger):
    """The op's schema mutates nothing, and a, b keep their values (on a GPU the kernel writes
    the copies of a and b in grad_a and grad_b: test_backward_kernels_match_the_references)."""
    schema = torch.ops.examples.liger_swiglu_backward.default._schema
    assert not any(arg.alias_info and arg.alias_info.is_write for arg in schema.arguments)
    grad_c, a, b = (torch.randn(4, 50) for _ in range(3))
    a0, b0 = a.clone(), b.clone()
    grad_a, grad_b = ops.liger_swiglu_backward(grad_c, a, b, 1.5)
    assert torch.equal(a, a0) and torch.equal(b, b0)
    want_a, want_b = torch.func.vjp(lambda a, b: F.silu(a * 1.5) * b, a.double(), b.double())[1](grad_c.double())
    torch.testing.assert_close(grad_a, want_a.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_b, want_b.float(), atol=1e-5, rtol=1e-5)


def test_rstd_of_other_rows_is_refused(liger):
    x = torch.randn(6, 8)
    with pytest.raises(ValueError) as err:
        ops.liger_rms_norm_backward(x, x, torch.ones(8), torch.ones(5, 1), 0.0, "llama")
    assert str(err.value) == (
        "examples::liger_rms_norm_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor rstd, float offset=0.0, "
        "str casting_mode='llama') -> (Tensor, Tensor): invalid arguments\n"
        "  rstd: expected leading dims [6] (those of grad_y, shape [6, 8]), got [5] (shape [5, 1])"
    )


def test_rows_wider_than_a_block_are_refused(liger):
    """Liger's kernels hold a row in one block of at most 65536 columns."""
    x = torch.randn(1, 65537)
    with pytest.raises(ValueError) as err:
        ops.liger_softmax(x)
    assert str(err.value) == (
        "examples::liger_softmax(Tensor x) -> Tensor: invalid arguments\n"
        "  expected x.size(-1) <= 65536, got 65537 <= 65536"
    )
    with pytest.raises(ValueError) as err:
        ops.liger_swiglu_backward(x, x, x)
    assert str(err.value) == (
        "examples::liger_swiglu_backward(Tensor grad_c, Tensor a, Tensor b, float gate_multiplier=1.0) -> "
        "(Tensor, Tensor): invalid arguments\n  expected a.size(-1) <= 65536, got 65537 <= 65536"
    )


@requires_triton
@pytest.mark.parametrize("op", TRITON_CALLS)
def test_every_kernel_compiles_for_sm_90_and_sm_80_without_a_gpu(liger, tmp_path, op):
    """Triton compiles the call's variant and the general one for each target; a second
    precompile finds them in the cache."""
    dtypes, shapes = TRITON_CALLS[op]
    for arch in ("sm_90", "sm_80"):
        assert not opforge.precompile(op, dtypes, arch=arch, cache_dir=tmp_path, shapes=shapes)
    assert len(list(tmp_path.iterdir())) == 1 + 2 * 2  # the description; per target two variants
    assert opforge.precompile(op, dtypes, arch="sm_80", cache_dir=tmp_path, shapes=shapes)


#: The checks of `opforge verify` that compile run-time kernels on a machine without a GPU.
COMPILE_CHECKS = ("nvrtc", "triton")


def run_verify(device: str, tmp_path: Path) -> dict:
    """`opforge verify liger --device DEVICE --dtype bfloat16 --seed 0 --json ...` in a process
    of its own: its JSON report, after checking that it exited 0 with "all passed". Every Triton
    variant a case needs compiles in a worker process, or comes from the tests' shared kernel
    cache (found only under its source text and compile options); bfloat16 (the dtype Liger's kernels serve)
    bounds them to one dtype's cases (the kernels' other dtypes: the tests below)."""
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "opforge", "verify", "liger", "--device", device, "--dtype", "bfloat16"]
        + ["--seed", "0", "--json", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "OPFORGE_QUIET": "1"},  # the test's cache folder: the tests' shared kernels
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "6 ops," in proc.stdout and "all passed" in proc.stdout.splitlines()[-1]
    return json.loads(out.read_text())


@pytest.mark.slow
@requires_triton
def test_opforge_verify_passes_on_the_cpu(tmp_path):
    """`opforge verify liger --device cpu`: every op's reference against its torch expression,
    opcheck, torch.compile, Meta against real, gradcheck of the backward ops, and every Triton
    instantiation the cases use compiled for sm_90 and sm_80 without a GPU."""
    report = run_verify("cpu", tmp_path)
    compiles = [r for r in report["results"] if r["check"] in COMPILE_CHECKS]
    assert {(r["op"], r["repro"]["arch"]) for r in compiles} == {
        (op, arch) for op in TRITON_CALLS for arch in ("sm_90", "sm_80")
    }
    assert all(r["status"] == "pass" for r in compiles)


# ---- on a GPU -------------------------------------------------------------------------------------

#: Rows of one column (n == 1), leading dims with a tail (1000 columns in a block of 1024), more
#: rows than the backward's 264 programs with a tail (96 in 128), and a row wider than 4096 with
#: a tail (5000 in 8192, 16 warps). Each shape is a Triton compile per kernel, dtype and casting
#: mode: few shapes keep the CUDA tests within a minute with an empty kernel cache.
SHAPES = [(1, 1), (4, 7, 1000), (300, 96), (2, 5000)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def close(got, want, dtype, scale=1.0):
    tol = scale * TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu().double(), want.double(), atol=tol, rtol=tol)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_kernels_match_the_references(liger, dtype):
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = (1 + 0.1 * torch.randn(shape[-1], device="cuda")).to(dtype)
        for mode in ("llama", "gemma"):
            y, rstd = ops.liger_rms_norm(x, w, 1e-6, 0.25, mode)
            want_y, want_rstd = rms_norm_torch(x.cpu(), w.cpu(), 1e-6, 0.25)
            close(y, want_y, dtype, 2)  # llama rounds x * rstd to x's dtype before the weight
            close(rstd, want_rstd, torch.float32, 10)
        b = torch.randn_like(x)
        close(ops.liger_swiglu(x, b, 0.5), F.silu(x.cpu().double() * 0.5) * b.cpu().double(), dtype, 4)
        close(ops.liger_softmax(4 * x), torch.softmax(4 * x.cpu().double(), -1), dtype, 4)  # exp in float32


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_kernels_match_the_references(liger, dtype):
    for shape in SHAPES:
        g, x = torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype)
        w = (1 + 0.1 * torch.randn(shape[-1], device="cuda")).to(dtype)
        _, rstd = ops.liger_rms_norm(x, w, 1e-6, 0.0, "llama")
        gx, gw = ops.liger_rms_norm_backward(g, x, w, rstd, 0.0, "llama")
        want_gx = ops.liger_rms_norm_backward(g.cpu().double(), x.cpu().double(), w.cpu().double(), rstd.cpu(), 0.0)[0]
        close(gx, want_gx, dtype, 4)
        # Under the llama casting mode each term of grad_weight's sum over rows is rounded twice to
        # x's dtype (x * rstd, then its product with grad_y: Triton multiplies two bfloat16 values
        # into a bfloat16) and then added in float32; the reference rounds nothing. The roundings
        # add up over rows in a sum that can cancel to far below its terms, so grad_weight is held
        # to the sum of the same rounded terms, taken in float64: what is left is the float32
        # accumulation and the rounding of the result to weight's dtype.
        rounded = (x.cpu().float() * rstd.cpu()).to(dtype).float()
        terms = (g.cpu().float() * rounded).to(dtype).double()
        close(gw, terms.reshape(-1, shape[-1]).sum(0), dtype, 4)
        a, b = torch.randn_like(x), torch.randn_like(x)
        a0, b0 = a.clone(), b.clone()
        want_ga, want_gb = ops.liger_swiglu_backward(g.cpu().double(), a.cpu().double(), b.cpu().double(), 0.5)
        ga, gb = ops.liger_swiglu_backward(g, a, b, 0.5)
        close(ga, want_ga, dtype, 4)
        close(gb, want_gb, dtype, 2)
        assert torch.equal(a, a0) and torch.equal(b, b0)  # the kernel wrote the copies
        y = ops.liger_softmax(x)
        close(
            ops.liger_softmax_backward(g, y), ops.liger_softmax_backward(g.cpu().double(), y.cpu().double()), dtype, 4
        )


@requires_cuda
def test_autograd_runs_the_triton_backward_kernels(liger):
    x = torch.randn(6, 300, device="cuda", requires_grad=True)
    w = (1 + 0.1 * torch.randn(300, device="cuda")).requires_grad_()
    loss = (ops.liger_softmax(ops.liger_rms_norm(x, w, 1e-6)[0]) * torch.arange(300, device="cuda")).sum()
    gx, gw = torch.autograd.grad(loss, (x, w))
    x64, w64 = x.detach().cpu().double().requires_grad_(), w.detach().cpu().double().requires_grad_()
    want = (torch.softmax(F.rms_norm(x64, (300,), w64, 1e-6), -1) * torch.arange(300)).sum()
    want_gx, want_gw = torch.autograd.grad(want, (x64, w64))
    torch.testing.assert_close(gx.cpu().double(), want_gx, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(gw.cpu().double(), want_gw, atol=1e-3, rtol=1e-3)


@requires_cuda
def test_compile_without_recompiles_and_cuda_graphs(liger):
    def f(x, w, gate, up):
        n = ops.liger_rms_norm(x, w, 1e-6)[0]
        return ops.liger_softmax(ops.liger_swiglu(n @ gate.mT, n @ up.mT))  # rows vary, widths do not

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    w = torch.rand(64, device="cuda") + 0.5
    gate, up = torch.randn(48, 64, device="cuda"), torch.randn(48, 64, device="cuda")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for rows in (3, 7, 12, 100):
            x = torch.randn(rows, 64, device="cuda")
            torch.testing.assert_close(compiled(x, w, gate, up), f(x, w, gate, up))
    x = torch.randn(8, 64, device="cuda")
    want = f(x, w, gate, up)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        f(x, w, gate, up)  # the first call compiles; capture may not
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(x, w, gate, up)
    graph.replay()
    torch.testing.assert_close(out, want)


@requires_cuda
def test_compiled_backward_runs_the_triton_backward_kernels_without_recompiles(liger):
    """Gradients through torch.compile(fullgraph=True, dynamic=True) of the three forward ops
    (AOTAutograd's backward graph calls the backward ops) equal eager's, over row counts."""

    def f(x, w, b):
        n = ops.liger_rms_norm(x, w, 1e-6)[0]
        return ops.liger_softmax(ops.liger_swiglu(n, b)).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    w = (torch.rand(96, device="cuda") + 0.5).requires_grad_()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for rows in (3, 7, 40):
            x = torch.randn(rows, 96, device="cuda", requires_grad=True)
            b = torch.randn(rows, 96, device="cuda", requires_grad=True)
            got = torch.autograd.grad(compiled(x, w, b), (x, w, b))
            want = torch.autograd.grad(f(x, w, b), (x, w, b))
            for g, e in zip(got, want, strict=True):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)


@requires_cuda
def test_opforge_verify_passes_on_cuda(tmp_path):
    """`opforge verify liger --device cuda`: each Triton kernel against its CPU reference over the
    cases' shapes (tails, strided inputs, empty tensors) and parameters, and opcheck,
    torch.compile without recompiles, Meta against real and gradcheck on CUDA."""
    report = run_verify("cuda", tmp_path)
    checked = {r["op"] for r in report["results"] if r["check"] == "values" and r["status"] == "pass"}
    assert checked == set(TRITON_CALLS)
