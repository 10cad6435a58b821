"""libopforge_core from Python: the typed description, the rules the core evaluates (example
sizes, output shapes), defaults that survive every path, and the error JSON of its entry points."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import opforge
import opforge.aoti
from opforge import _core
from opforge._paths import core_path
from opforge.description import REQUIRED

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TAG = 'it\'s \\ "q"\n'
OFFSET = 0.5 + 1.5 + len(TAG)  # fixture::offset at its defaults


@pytest.fixture(scope="module", autouse=True)
def param_ops(tmp_path_factory):
    opforge.load_library(opforge.example_library("attention"))
    path = opforge.build_library("param_ops", [FIXTURES / "param_ops.cpp"], build_dir=tmp_path_factory.mktemp("params"))
    return opforge.load_library(path)


def test_defaults_are_typed_values():
    op = opforge.find_op("fixture::offset")
    assert [(p.name, p.type, p.default) for p in op.params] == [
        ("pads", "int[]", []),
        ("scales", "float[]", [0.5, 1.5]),
        ("tag", "str", TAG),
    ]
    assert opforge.find_op("examples::attention").arg("head_dim").default is REQUIRED


def test_a_string_default_with_quotes_and_backslashes_round_trips():
    schema = torch.ops.fixture.offset.default._schema
    assert schema.arguments[3].default_value == TAG  # torch's parser read back what the core printed
    x = torch.randn(3)
    torch.testing.assert_close(torch.ops.fixture.offset(x), x + OFFSET)


def test_list_defaults_apply_in_the_cpp_runner(tmp_path):
    """An empty int[] default left out of the call arrived in the runner as None (AOTInductor's
    proxy executor serialises it so) and failed; the declared default applies."""

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.fixture.offset(x)

    x = torch.randn(4, 3)
    program = torch.export.export(Model(), (x,))
    run = opforge.aoti.run(opforge.aoti.package(program, tmp_path), [x])
    torch.testing.assert_close(run.outputs[0], x + OFFSET)


def test_output_shapes_are_evaluated_by_the_core():
    args = {"x": {"dtype": "bfloat16", "shape": [2, 3, 8]}, "bias": {"dtype": "bfloat16", "shape": [8]}}
    assert _core.output_shapes("examples::bias_gelu", args) == [{"name": "y", "dtype": "bfloat16", "shape": [2, 3, 8]}]
    args["bias"] = {"dtype": "float32", "shape": [4]}
    with pytest.raises(ValueError) as err:  # the message a call raises
        _core.output_shapes("examples::bias_gelu", args)
    assert str(err.value) == (
        "examples::bias_gelu(Tensor x, Tensor bias) -> Tensor: invalid arguments\n"
        "  bias: expected dtype bfloat16 (the dtype of x), got float32\n"
        "  bias: expected shape [x.size(-1)] = [8], got [4]"
    )
    with pytest.raises(ValueError) as err:
        _core.output_shapes("examples::softshrink", {"x": {"dtype": "float32", "shape": [2]}, "lambd": "big"})
    assert str(err.value) == (
        "examples::softshrink(Tensor x, float lambd=0.5) -> Tensor: invalid arguments\n"
        '  lambd: expected a value of type float, got "big"'
    )


def test_example_shapes_satisfy_the_rules():
    assert _core.example_shapes("examples::bias_gelu", 3, 37, {}) == {
        "shapes": {"x": [3, 37], "bias": [37]},
        "bounds": {},
        "rule_problems": [],
    }
    shapes = _core.example_shapes("examples::attention", 2, 37, {"head_dim": 64})["shapes"]
    assert shapes["q"][-1] == 64 and shapes["mask"] == [shapes["q"][0], shapes["k"][2]]


def test_requests_for_unknown_ops_name_them():
    with pytest.raises(ValueError) as err:
        _core.example_shapes("nowhere::nothing", 3, 37, {})
    assert str(err.value) == "opforge: no loaded op named nowhere::nothing (load its library first)"


def test_loading_checks_before_registering(tmp_path):
    """The core validates a library (here: not an op library at all) and nothing reaches torch."""
    with pytest.raises(ValueError) as err:
        _core.load_library(core_path())
    assert str(err.value) == (
        f"opforge: {core_path()} is not an opforge op library (no opforge_library_v1 "
        "symbol; build it with opforge_add_library or opforge.build_library)"
    )


def test_parameter_values_a_json_request_cannot_mean(rule_ops):
    """NaN for a float parameter without bounds says what was expected (no bound is made up), and
    an integer past int64 is not wrapped round."""
    x = {"dtype": "float32", "shape": [3, 8]}
    with pytest.raises(ValueError) as err:
        _core.output_shapes("fixture::scale_pair", {"x": x, "key": None, "alpha": "nan"})
    assert str(err.value).splitlines()[1:] == ["  alpha: expected a number, got nan"]
    q = {"dtype": "float16", "shape": [1, 1, 4, 64]}
    with pytest.raises(ValueError) as err:
        _core.output_shapes("examples::attention", {"q": q, "k": q, "v": q, "head_dim": 2**63})
    assert str(err.value).splitlines()[1:] == [f"  head_dim: expected a value of type int, got {2**63}"]
