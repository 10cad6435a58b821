"""Shape rules beyond exact sizes, end to end on fixture::scale4 (fixtures/shape_ops.cpp), whose
input's last dim is declared opforge::multiple_of(4): calls, the error for other sizes,
torch.compile with that dim dynamic, and opforge verify, which must generate only such sizes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import opforge
from opforge import verify

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module", autouse=True)
def shape_ops(tmp_path_factory):
    path = opforge.build_library("shape_ops", [FIXTURES / "shape_ops.cpp"], build_dir=tmp_path_factory.mktemp("shape"))
    return opforge.load_library(path)


def test_multiples_pass_and_other_sizes_are_refused():
    for cols in (0, 4, 12):
        x, w = torch.randn(3, cols), torch.randn(cols)
        torch.testing.assert_close(torch.ops.fixture.scale4(x, w), x * w)
    message = (
        "fixture::scale4(Tensor x, Tensor w) -> Tensor: invalid arguments\n"
        "  x: expected shape [*, multiple of 4], got [3, 6]"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.fixture.scale4(torch.randn(3, 6), torch.randn(6))
    assert opforge.find_op("fixture::scale4").args[0].shape == ("*", "multiple of 4")


def test_compile_keeps_a_multiple_of_dim_dynamic():
    fn = torch.compile(lambda x, w: torch.ops.fixture.scale4(x, w) + 1, fullgraph=True, dynamic=True)
    for rows, cols in ((2, 8), (5, 12), (3, 20)):
        x, w = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(fn(x, w), x * w + 1)
    with pytest.raises(Exception, match=re.escape("expected shape [*, multiple of 4]")):
        fn(torch.randn(2, 6), torch.randn(6))


def test_compile_with_a_data_dependent_size_checks_it_when_the_graph_runs():
    fn = torch.compile(lambda x, w: torch.ops.fixture.scale4(x, w) + 1, fullgraph=True)
    x, w = torch.randn(3, 8), torch.randn(8)
    torch._dynamo.decorators.mark_unbacked(x, 1)
    torch.testing.assert_close(fn(x, w), x * w + 1)  # no guard on an unbacked size: a runtime check


def test_verify_generates_only_multiples():
    report = verify.verify_op("fixture::scale4", device="cpu", seed=11)
    assert report.ok, report.failures
    cols = {r.repro["args"][0]["shape"][-1] for r in report.results if r.check == "values" and r.repro}
    assert cols and all(c % 4 == 0 for c in cols), cols
    assert len(cols) > 2  # several sizes (the edge sizes verify uses, each rounded up to a multiple)


def test_verify_satisfies_a_multiple_of_declared_on_a_same_shape_input():
    report = verify.verify_op("fixture::add8", device="cpu", seed=5)
    assert report.ok, report.failures
    cols = {r.repro["args"][0]["shape"][-1] for r in report.results if r.check == "values" and r.repro}
    assert cols and all(c % 8 == 0 for c in cols), cols


def test_an_equivalent_may_use_lambdas_and_comprehensions():
    report = verify.verify_op("fixture::twice", device="cpu", seed=2, dtypes=["float32"])
    values = [r for r in report.results if r.check == "values"]
    assert values and all(r.status == "pass" for r in values), [r.message for r in report.failures]
