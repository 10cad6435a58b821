"""Ops that write their inputs (opforge::mutated) and the out= overload of fresh-output ops:
schemas, eager, the layout rule for written inputs, torch.compile, torch.export, the C++ runner,
CUDA graphs, opcheck and verify (fixtures/inplace_ops.cpp)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import opforge
import opforge.aoti
from conftest import DEVICES, requires_cuda
from opforge import verify

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCALE = "fixture::scale_(Tensor(a!) x, float alpha=2.0) -> (): invalid arguments\n"


@pytest.fixture(scope="module", autouse=True)
def inplace_ops(tmp_path_factory):
    path = opforge.build_library("inplace_ops", [FIXTURES / "inplace_ops.cpp"], build_dir=tmp_path_factory.mktemp("ip"))
    return opforge.load_library(path)


def test_schemas_annotate_what_is_written():
    scale = opforge.find_op("fixture::scale_")
    assert (scale.schema, scale.out_schema) == ("fixture::scale_(Tensor(a!) x, float alpha=2.0) -> ()", None)
    acc = opforge.find_op("fixture::accumulate")
    assert acc.schema == "fixture::accumulate(Tensor x, Tensor(a!) acc) -> Tensor"
    assert acc.out_schema is None  # it writes an input: no out= overload
    assert [a.mutated for a in acc.tensors] == [False, True]
    assert opforge.find_op("examples::softshrink").out_schema == (
        "examples::softshrink.out(Tensor x, float lambd=0.5, *, Tensor(a!) y) -> Tensor(a!)"
    )
    assert str(torch.ops.examples.softshrink.out._schema) == opforge.find_op("examples::softshrink").out_schema


def test_eager_writes_in_place_and_bumps_the_version():
    device = "cpu"  # the fixtures have CPU references only; the example ops run these paths on CUDA
    x = torch.randn(5, 7, device=device)
    before, version = x.clone(), x._version
    assert torch.ops.fixture.scale_(x, 3.0) is None
    torch.testing.assert_close(x, before * 3)
    assert x._version > version  # autograd sees the write
    acc = torch.randn(5, 7, device=device)
    acc0 = acc.clone()
    y = torch.ops.fixture.accumulate(x, acc)
    torch.testing.assert_close(acc, acc0 + x)
    torch.testing.assert_close(y, 2 * (acc0 + x))


def test_a_strided_mutated_input_is_written_through_its_strides():
    x = torch.zeros(4, 3).t()  # [3, 4] with strides [1, 3]
    torch.ops.fixture.index_fill(x)
    torch.testing.assert_close(x, torch.arange(3.0)[:, None] * 100 + torch.arange(4.0))


def test_layouts_a_mutated_input_cannot_take_are_refused():
    with pytest.raises(ValueError) as err:
        torch.ops.fixture.scale_(torch.randn(4, 3).t())
    assert str(err.value) == SCALE + (
        "  x: expected a dense, row-major tensor whose data pointer is a multiple of 16 bytes (it is written in "
        "place, so it cannot be copied), got shape [3, 4] with strides [1, 3]"
    )
    with pytest.raises(ValueError) as err:
        torch.ops.fixture.scale_(torch.randn(13)[1:].view(4, 3))
    assert str(err.value) == SCALE + (
        "  x: expected a dense, row-major tensor whose data pointer is a multiple of 16 bytes (it is written in "
        "place, so it cannot be copied), got shape [4, 3] with strides [3, 1] at a data pointer 4 bytes past a "
        "16-byte boundary"
    )
    with pytest.raises(ValueError) as err:
        torch.ops.fixture.index_fill(torch.zeros(1, 3).expand(4, 3))
    assert str(err.value) == (
        "fixture::index_fill(Tensor(a!) x) -> (): invalid arguments\n"
        "  x: expected a tensor whose elements do not overlap in memory (it is written in place), got shape [4, 3] "
        "with strides [0, 1]"
    )


def test_gradients_do_not_flow_through_writes():
    x = torch.randn(3, requires_grad=True)
    y = torch.ops.fixture.accumulate(x, torch.randn(3))  # forward-only use stays free
    with pytest.raises(RuntimeError, match="^derivative for fixture::accumulate is not implemented$"):
        y.sum().backward()
    with pytest.raises(
        RuntimeError, match="^a leaf Variable that requires grad is being used in an in-place operation.$"
    ):
        torch.ops.fixture.scale_(torch.randn(3, requires_grad=True))
    saved = torch.randn(3, requires_grad=True) * 1  # a non-leaf that requires grad
    z = saved.sin()  # saves `saved` for its backward
    torch.ops.fixture.scale_(saved)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def scale_then_accumulate(x, acc):
    torch.ops.fixture.scale_(acc, 0.5)
    return torch.ops.fixture.accumulate(x, acc) + 1


def test_compile_functionalises_and_writes_in_place_without_recompiles():
    torch._dynamo.reset()
    compiled = torch.compile(scale_then_accumulate, fullgraph=True, dynamic=True)
    compiled(torch.randn(3, 8), torch.randn(3, 8))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (4, 9, 17):
            x, acc = torch.randn(n, 8), torch.randn(n, 8)
            mine, theirs = acc.clone(), acc.clone()
            torch.testing.assert_close(compiled(x, mine), scale_then_accumulate(x, theirs))
            torch.testing.assert_close(mine, theirs)


class ScaleThenAccumulate(torch.nn.Module):
    def forward(self, x, acc):
        return scale_then_accumulate(x, acc)


@pytest.mark.parametrize("c_shims", [False, True])  # the proxy executor, or C shims (opforge.aoti.package)
def test_export_and_the_runner_leave_the_writes_in_the_inputs(tmp_path, c_shims):
    n = torch.export.Dim("n")
    program = torch.export.export(
        ScaleThenAccumulate(), (torch.randn(4, 8), torch.randn(4, 8)), dynamic_shapes={"x": {0: n}, "acc": {0: n}}
    )
    decomposed = program.run_decompositions()
    assert [s.kind.name for s in decomposed.graph_signature.output_specs] == ["USER_INPUT_MUTATION", "USER_OUTPUT"]
    package = opforge.aoti.package(program, tmp_path, c_shims=c_shims)
    assert ("shims " in (tmp_path / opforge.aoti.MANIFEST).read_text()) == c_shims
    x, acc = torch.randn(6, 8), torch.randn(6, 8)
    expected_acc = acc.clone()
    expected = scale_then_accumulate(x, expected_acc)
    run = opforge.aoti.run(package, [x, acc], warmup=2, iters=3)  # each run starts from the same inputs
    torch.testing.assert_close(run.outputs[0], expected)
    torch.testing.assert_close(run.inputs_after[1], expected_acc)
    torch.testing.assert_close(run.inputs_after[0], x)


@pytest.mark.parametrize("device", DEVICES)
def test_out_writes_into_the_callers_tensor(device):
    x = torch.randn(4, 6, device=device)
    y = torch.empty(4, 6, device=device)
    assert torch.ops.examples.softshrink.out(x, 0.25, y=y) is y
    torch.testing.assert_close(y, F.softshrink(x, 0.25))
    strided = torch.empty(6, 4, device=device).t()  # written through a dense temporary
    torch.ops.examples.softshrink.out(x, 0.25, y=strided)
    torch.testing.assert_close(strided, F.softshrink(x, 0.25))
    empty = torch.empty(0, device=device)  # torch's rule: an out tensor without elements is resized
    torch.ops.examples.softshrink.out(x, y=empty)
    assert empty.shape == (4, 6)


def test_out_of_the_wrong_dtype_or_device_is_refused():
    x = torch.randn(4, 6)
    with pytest.raises(ValueError) as err:
        torch.ops.examples.softshrink.out(x, y=torch.empty(4, 6, dtype=torch.float64))
    assert str(err.value) == (
        "examples::softshrink.out(Tensor x, float lambd=0.5, *, Tensor(a!) y) -> Tensor(a!): invalid arguments\n"
        "  y: expected dtype float32 (the dtype its rule gives), got float64"
    )


@requires_cuda
def test_out_on_another_device_is_refused():
    with pytest.raises(ValueError) as err:
        torch.ops.examples.softshrink.out(torch.randn(4, 6, device="cuda"), y=torch.empty(4, 6))
    assert str(err.value).endswith("  y: expected device cuda:0 (the device of x), got cpu")


def softshrink_into(x, y):
    torch.ops.examples.softshrink.out(x, 0.25, y=y)
    return y + 1


class SoftshrinkInto(torch.nn.Module):
    def forward(self, x, y):
        return softshrink_into(x, y)


def test_out_under_compile_export_and_the_runner(tmp_path):
    torch._dynamo.reset()
    compiled = torch.compile(softshrink_into, fullgraph=True, dynamic=True)
    compiled(torch.randn(3, 5), torch.empty(3, 5))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (4, 7):
            x, y = torch.randn(n, 5), torch.empty(n, 5)
            torch.testing.assert_close(compiled(x, y), F.softshrink(x, 0.25) + 1)
            torch.testing.assert_close(y, F.softshrink(x, 0.25))
    n = torch.export.Dim("n")
    program = torch.export.export(
        SoftshrinkInto(), (torch.randn(4, 5), torch.empty(4, 5)), dynamic_shapes={"x": {0: n}, "y": {0: n}}
    )
    x = torch.randn(6, 5)
    run = opforge.aoti.run(opforge.aoti.package(program, tmp_path), [x, torch.zeros(6, 5)])
    torch.testing.assert_close(run.inputs_after[1], F.softshrink(x, 0.25))


def test_opcheck():
    x = torch.randn(4, 6)
    for op, args, kwargs in [
        (torch.ops.fixture.scale_.default, (x.clone(), 0.5), {}),
        (torch.ops.fixture.accumulate.default, (x, x.clone()), {}),
        (torch.ops.fixture.index_fill.default, (torch.empty(6, 4).t(),), {}),
        (torch.ops.examples.softshrink.out, (x, 0.5), {"y": torch.empty(4, 6)}),
    ]:
        results = torch.library.opcheck(op, args, kwargs)
        assert all(v == "SUCCESS" for v in results.values()), (op, results)


@requires_cuda
def test_out_under_cuda_graph_capture_on_a_side_stream():
    x = torch.randn(64, 33, device="cuda")
    y = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.examples.softshrink.out(x, 0.25, y=y)  # warm-up: compiles and loads the kernel
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    y.fill_(float("nan"))
    with torch.cuda.graph(graph, stream=stream):
        torch.ops.examples.softshrink.out(x, 0.25, y=y)
    x.copy_(torch.randn_like(x))  # a replay reads what x holds then
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, F.softshrink(x, 0.25))


@pytest.mark.parametrize("name", ["fixture::scale_", "fixture::accumulate", "fixture::index_fill"])
def test_verify_checks_the_final_values_of_written_inputs(name):
    report = verify.verify_op(name, device="cpu", seed=5)
    assert report.ok, [(r.case, r.message) for r in report.failures]
    checks = {r.check for r in report.results}
    assert {"values", "opcheck", "meta", "compile"} <= checks


def test_verify_leaves_out_layouts_a_written_input_refuses():
    cases = {r.case for r in verify.verify_op("fixture::scale_", device="cpu", seed=1).results if r.check == "values"}
    assert "permuted x" not in cases and "shape 3x37" in cases
    strided = {r.case for r in verify.verify_op("fixture::index_fill", device="cpu", seed=1).results}
    assert "permuted x" in strided and "expanded x" not in strided


def test_verify_catches_a_write_into_an_input_not_declared_mutated():
    failures = verify.verify_op("broken_inplace::clobbers", device="cpu", seed=2).failures
    assert failures and all(
        f.message == "wrote the input x, which is not declared opforge::mutated"
        for f in failures
        if f.check == "values"
    )


def test_verify_catches_a_mutated_input_left_unwritten():
    failures = [
        f for f in verify.verify_op("broken_inplace::forgets", device="cpu", seed=2).failures if f.check == "values"
    ]
    assert failures and "elements differ" in failures[0].message


def test_verify_runs_the_out_overload():
    report = verify.verify_op("examples::softshrink", device="cpu", seed=4, dtypes=["float32"])
    assert ("out", "pass") in {(r.check, r.status) for r in report.results}


def test_warnings_of_resizing_an_out_tensor_with_elements():
    """torch's resize_output rule: an out tensor with elements of another shape is resized (torch
    warns through its C++ warning handler)."""
    x = torch.randn(4, 6)
    y = torch.empty(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.ops.examples.softshrink.out(x, y=y)
    assert y.shape == (4, 6)
    torch.testing.assert_close(y, F.softshrink(x))


def test_an_out_tensor_that_needs_a_resize_is_refused_under_compile_and_resized_in_eager():
    """Resizing a graph input breaks a trace (torch's own out= ops graph-break there); opforge
    refuses it naming the op and the tensor, and eager calls resize by torch's rules."""
    x = torch.randn(4, 3)
    for y in (torch.empty(0), torch.empty(2, 2)):
        torch._dynamo.reset()
        with pytest.raises(Exception) as err:
            torch.compile(softshrink_into, fullgraph=True)(x, y)
        message = (
            "examples::softshrink.out(Tensor x, float lambd=0.5, *, Tensor(a!) y) -> Tensor(a!): invalid arguments\n"
            f"  y: expected shape [4, 3] (an out= tensor is resized in eager calls only, not under torch.compile or "
            f"torch.export), got {list(y.shape)}"
        )
        assert f"got ValueError({message!r})" in str(err.value)  # dynamo quotes the op's error
    y = torch.empty(0)
    torch.ops.examples.softshrink.out(x, 0.5, y=y)
    torch.testing.assert_close(y, F.softshrink(x, 0.5))
    torch._dynamo.reset()
    got = torch.compile(softshrink_into, fullgraph=True)(x, torch.empty(4, 3))
    torch.testing.assert_close(got, F.softshrink(x, 0.25) + 1)
