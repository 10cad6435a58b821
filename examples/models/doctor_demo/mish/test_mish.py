"""demo::mish: build the op folder and verify every kernel against the CPU reference (on a
machine without a GPU, the reference against the description's .equivalent() expression)."""

from pathlib import Path

import pytest
import torch

import opforge
from opforge import verify

FOLDER = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The folder built and loaded once for the tests below."""
    return opforge.load_library(opforge.build_library("mish", folder=FOLDER, build_dir=tmp_path_factory.mktemp("b")))


@pytest.mark.parametrize("name", ["demo::mish", "demo::mish_backward"])
def test_mish_passes_verify(library, name):
    report = verify.verify_op(name, device="cuda" if torch.cuda.is_available() else "cpu", seed=0)
    verify.print_report(report)
    assert report.ok, [(r.check, r.case, r.message) for r in report.failures]


def test_mish_at_the_shape_of_the_model(library):
    """The shape and dtype the model calls it with ((4096, 1024), float32): the device's result
    against the CPU reference."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn((4096, 1024), dtype=torch.float32, device=device)
    expected = torch.ops.demo.mish(x.cpu())
    torch.testing.assert_close(torch.ops.demo.mish(x).cpu(), expected)
