"""Optional tensor inputs (``.input("bias", opforge::optional, ...)``, schema ``Tensor? bias=None``)
end to end, on fixture::add_bias (fixtures/optional_ops.cpp): y = x + bias over the last dim, or
y = x when bias is left out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import opforge
from conftest import DEVICES, TOLERANCE, requires_cuda
from opforge import aoti, verify

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA = "fixture::add_bias(Tensor x, Tensor? bias=None) -> Tensor"


@pytest.fixture(scope="module", autouse=True)
def optional_ops(tmp_path_factory):
    path = opforge.build_library(
        "optional_ops",
        [FIXTURES / "optional_ops.cpp"],
        kernels=[FIXTURES / "kernels" / "optional_kernels.cu"],
        build_dir=tmp_path_factory.mktemp("optional"),
    )
    return opforge.load_library(path)


def add_bias(*args, **kwargs):
    return torch.ops.fixture.add_bias(*args, **kwargs)


def expected(x, bias=None):
    return x.double() + (bias.double() if bias is not None else 0)


def test_schema_and_description():
    assert str(torch.ops.fixture.add_bias.default._schema) == SCHEMA
    args = opforge.find_op("fixture::add_bias").args
    assert [a.optional for a in args] == [False, True]
    assert args[1].same_dtype == "x" and args[1].shape == ("x.size(-1)",)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_eager_with_and_without(device, dtype):
    x = torch.randn(7, 3, 37, dtype=dtype, device=device)
    bias = torch.randn(37, dtype=dtype, device=device)
    for out in (add_bias(x, bias), add_bias(x, bias=bias)):
        assert out.dtype == dtype and out.device == x.device
        torch.testing.assert_close(
            out.double().cpu(), expected(x, bias).cpu(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
        )
    for out in (add_bias(x), add_bias(x, None), add_bias(x, bias=None)):
        assert torch.equal(out, x)
    # Layouts: a sliced x and bias are made dense for the kernel.
    xs, bs = torch.randn(7, 74, dtype=dtype, device=device)[:, ::2], torch.randn(74, dtype=dtype, device=device)[::2]
    torch.testing.assert_close(
        add_bias(xs, bs).double().cpu(), expected(xs, bs).cpu(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )
    assert add_bias(x[:0]).shape == (0, 3, 37) and add_bias(x[:0], bias).shape == (0, 3, 37)


def raises(message):
    return pytest.raises(ValueError, match="^" + re.escape(SCHEMA + ": invalid arguments\n" + message) + "$")


def test_bad_optional_input_is_reported_when_given():
    x = torch.randn(2, 8)
    with raises(
        "  bias: expected dtype float32 (the dtype of x), got float64\n"
        "  bias: expected shape [x.size(-1)] = [8], got [4]"
    ):
        add_bias(x, torch.randn(4, dtype=torch.float64))
    with raises("  bias: expected rank 1, got rank 2 (shape [1, 8])"):
        add_bias(x, torch.randn(1, 8))
    with raises("  x: expected dtype one of {float32, float64, float16, bfloat16}, got int64"):
        add_bias(torch.arange(4))  # only x is checked when bias is left out
    with pytest.raises(RuntimeError, match="Expected a value of type 'Optional\\[Tensor\\]' for argument 'bias'"):
        add_bias(x, 1.5)


@requires_cuda
def test_optional_input_on_another_device():
    with raises("  bias: expected device cuda:0 (the device of x), got cpu"):
        add_bias(torch.randn(2, 8, device="cuda"), torch.randn(8))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_and_without(device):
    x, bias = torch.randn(5, 16, device=device), torch.randn(16, device=device)
    for args in ((x, bias), (x, None), (x,)):
        results = torch.library.opcheck(torch.ops.fixture.add_bias.default, args)
        assert set(results.values()) == {"SUCCESS"}, (len(args), results)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_compile_fullgraph_without_recompiles(device, with_bias):
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(lambda x, b: add_bias(x * 2, b), fullgraph=True, dynamic=True)
    bias = torch.randn(24, device=device) if with_bias else None
    compiled(torch.randn(3, 24, device=device), bias)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in (5, 9):
            x = torch.randn(batch, 24, device=device)
            torch.testing.assert_close(compiled(x, bias), expected(x * 2, bias).float())


class Model(torch.nn.Module):
    """linear -> add_bias, with or without the optional bias."""

    def __init__(self, with_bias: bool):
        super().__init__()
        self.linear = torch.nn.Linear(16, 24, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(24)) if with_bias else None

    def forward(self, x):
        return add_bias(self.linear(x), self.bias) if self.bias is not None else add_bias(self.linear(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_export_and_aoti_package_in_cpp_runner(device, with_bias, tmp_path):
    model = Model(with_bias).to(device).eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(model, (torch.randn(3, 16, device=device),), dynamic_shapes=({0: batch},))
    calls = [n for n in program.graph.nodes if n.target is torch.ops.fixture.add_bias.default]
    assert len(calls) == 1 and len(calls[0].args) == (2 if with_bias else 1)
    x = torch.randn(6, 16, device=device)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x))
    # The run-time kernel is precompiled for sm_90 with and without the bias (one instantiation).
    package = aoti.package(program, tmp_path / "pkg", archs=["sm_90"])
    assert (package.parent / aoti.MANIFEST).read_text().splitlines()[1:] == ["fixture::add_bias liboptional_ops.so"]
    assert len(list((package.parent / "liboptional_ops.kernels" / "cache").glob("*.bin"))) == 1
    for batch_size in (1, 7):
        x = torch.randn(batch_size, 16, device=device)
        with torch.no_grad():
            want = model(x).cpu()
        result = aoti.run(package, [x], device=device)
        torch.testing.assert_close(result.outputs[0], want, atol=1e-5, rtol=1e-5)


def test_precompile_without_the_optional_dtype(tmp_path, private_kernel_cache):
    assert opforge.precompile("fixture::add_bias", {"x": torch.float16}, arch="sm_90", cache_dir=tmp_path) is False
    assert (
        opforge.precompile(
            "fixture::add_bias", {"x": torch.float16, "bias": torch.float16}, arch="sm_90", cache_dir=tmp_path
        )
        is True
    )  # the same instantiation
    with pytest.raises(ValueError) as err:
        opforge.precompile("fixture::add_bias", {"bias": torch.float16}, arch="sm_90", cache_dir=tmp_path)
    assert str(err.value) == (
        "fixture::add_bias(Tensor x, Tensor? bias=None) -> Tensor: invalid arguments\n  x: expected a dtype, got none"
    )


@pytest.mark.parametrize("device", DEVICES)
def test_verify_passes_with_and_without(device):
    report = verify.verify_op("fixture::add_bias", device=device, seed=7)
    assert report.ok, [(r.dtype, r.case, r.message) for r in report.failures]
    cases = {(r.check, r.case) for r in report.results if r.status == "pass"}
    for check in ("opcheck", "meta"):
        assert {(check, "shape 3x37"), (check, "shape 3x37 without bias")} <= cases
    sweep = "sweep 3x37, 11x67, 19x101"  # the compile check's sizes (opforge/verify/sweep.py)
    assert {("compile", sweep), ("compile", sweep + " without bias")} <= cases
    values = [r for r in report.results if r.check == "values"]
    assert any(r.case == "shape 33x257 without bias" for r in values)
    assert any(r.case == "empty without bias" for r in values)
    without = next(r for r in values if r.case == "shape 3x37 without bias")
    assert without.repro["args"][1] is None and without.repro["args"][0]["shape"] == [3, 37]
    given = next(r for r in values if r.case == "shape 3x37")
    assert given.repro["args"][1]["shape"] == [37]


def test_sharding_strategies_skip_an_absent_optional_input():
    from torch.distributed.tensor import Replicate, Shard

    from opforge.distributed import strategies

    class Like:
        def __init__(self, ndim):
            self.ndim = ndim

    assert strategies("pointwise", 1, [Like(2), None]) == [
        ([Replicate()], [Replicate(), None]),
        ([Shard(0)], [Shard(0), None]),
        ([Shard(1)], [Shard(1), None]),
    ]


def _dtensor_worker(rank: int, world: int, library: str) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.device_mesh import init_device_mesh

    opforge.load_library(library)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same full tensors on every rank
    x, bias = torch.randn(6, 8), torch.randn(8)
    for d in range(2):
        dx = distribute_tensor(x, mesh, [Shard(d)])
        db = distribute_tensor(bias, mesh, [Shard(0)] if d == 1 else [Replicate()])
        for y, want in (
            (add_bias(dx, db), x + bias),
            (add_bias(dx, bias=db), x + bias),
            (add_bias(dx), x),
            (add_bias(dx, None), x),
        ):
            assert y.placements == (Shard(d),), (d, y.placements)
            torch.testing.assert_close(y.full_tensor(), want)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_dtensor_with_and_without(optional_ops):
    from test_distributed import run_in_processes

    failures = run_in_processes([("dtensor", _dtensor_worker, str(optional_ops.path))])
    assert not failures["dtensor"], failures["dtensor"]


MID_SCHEMA = "fixture::add_bias_mul(Tensor x, Tensor? bias, Tensor weight) -> Tensor"


def test_an_optional_input_before_a_required_one_has_no_default():
    """fixture::add_bias_mul: ``Tensor? bias`` before ``Tensor weight``, as torch's schemas allow
    (vLLM's rotary_embedding takes ``Tensor(b!)? key`` before ``int head_size``): the caller passes
    None, positionally or by name, in eager and compiled calls, and verify covers both."""
    op = torch.ops.fixture.add_bias_mul
    assert str(op.default._schema) == MID_SCHEMA
    bias = opforge.find_op("fixture::add_bias_mul").arg("bias")
    assert bias.optional and not bias.default_none
    assert opforge.find_op("fixture::add_bias").arg("bias").default_none
    x, b, w = torch.randn(3, 8), torch.randn(8), torch.randn(8)
    torch.testing.assert_close(op(x, b, w), (x + b) * w)
    torch.testing.assert_close(op(x, None, w), x * w)
    torch.testing.assert_close(op(x, bias=None, weight=w), x * w)
    compiled = torch.compile(lambda x, b, w: op(x, b, w), fullgraph=True)
    torch.testing.assert_close(compiled(x, None, w), x * w)
    report = verify.verify_op("fixture::add_bias_mul", device="cpu", seed=5)
    assert report.ok, [(r.check, r.case, r.message) for r in report.failures]
    assert any(r.case.endswith("without bias") for r in report.results)


def test_stubs_give_an_optional_input_before_a_required_one_no_default(optional_ops, tmp_path):
    from opforge.stubs import write_stubs

    stub = next(p for p in write_stubs(optional_ops, tmp_path) if p.suffix == ".pyi").read_text()
    assert "x: Tensor, bias: Tensor | None, weight: Tensor" in stub
    assert "bias: Tensor | None = None" in stub  # add_bias's, last
    compile(stub, "optional_ops.pyi", "exec")  # valid Python: no default before a required argument


def test_jax_signature_gives_an_optional_input_before_a_required_one_no_default(optional_ops):
    import inspect

    pytest.importorskip("jax")
    import opforge.jax as ojax

    ojax.load_library(optional_ops.path)

    empty = inspect.Parameter.empty
    mid = inspect.signature(ojax.ops.fixture.add_bias_mul).parameters
    assert [p.default for p in mid.values()] == [empty, empty, empty]
    assert inspect.signature(ojax.ops.fixture.add_bias).parameters["bias"].default is None
