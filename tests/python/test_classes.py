"""Custom classes (Note [Custom classes] in opforge/op_class.h): IdentityConvClass and Int8Linear in
eager calls, through torch.save/torch.load in a fresh process, torch.compile, torch.export,
AOTInductor and the C++ runner; class declarations that must fail to load. Int8Linear's numbers
are test_int8_linear.py's."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opforge
from conftest import DEVICES, requires_cuda
from opforge import aoti
from opforge._core import OpforgeError

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def classes():
    for lib in ("identity_conv", "int8_linear"):
        opforge.load_library(opforge.example_library(lib))
    return torch.classes.examples


class Model(torch.nn.Module):
    """x [b, 3, 128] -> IdentityConvClass(3) -> Int8Linear(128 -> 64) -> relu."""

    def __init__(self, classes, linear: torch.nn.Linear):
        super().__init__()
        self.conv = classes.IdentityConvClass(3)
        self.proj = classes.Int8Linear(linear.weight.detach(), linear.bias.detach())

    def forward(self, x):
        return torch.relu(self.proj.forward(self.conv.forward(x)))


def test_identity_conv_class_keeps_its_field_and_checks_arguments(classes):
    conv = classes.IdentityConvClass(channels=4)
    assert conv.channels == 4 and conv.__obj_flatten__() == (("channels", 4),)
    x = torch.randn(2, 4, 5).transpose(1, 2).transpose(1, 2)
    assert torch.equal(conv.forward(x), x)
    with pytest.raises(ValueError) as err:
        conv.forward(torch.randn(2, 3, 5))
    assert str(err.value).startswith("examples::IdentityConvClass.forward: examples::identity_conv_forward(")
    assert "expected x.size(1) == channels, got 3 == 4" in str(err.value)
    with pytest.raises(ValueError, match=r"IdentityConvClass.__init__: .*\n  channels: expected a value >= 1, got 0"):
        classes.IdentityConvClass(0)


def test_int8_linear_refuses_arguments_by_name(classes):
    with pytest.raises(
        ValueError, match=r"Int8Linear.__init__: .*\n  weight: expected rank 2, got rank 1 \(shape \[10\]\)"
    ):
        classes.Int8Linear(torch.randn(10))
    q8 = classes.Int8Linear(torch.randn(8, 64))
    assert q8.bias_fp32 is None
    with pytest.raises(ValueError, match=r"Int8Linear.forward: .*\n  x: expected dtype one of"):
        q8.forward(torch.randn(2, 64, dtype=torch.float64))
    # x's input features against the object's: the message names x, not the field
    with pytest.raises(
        ValueError, match=re.escape("\n  x: expected shape [*, qweight.size(1)] = [*, 64], got [2, 32]")
    ):
        q8.forward(torch.randn(2, 32))


@requires_cuda
def test_a_method_on_an_object_on_another_device_names_the_class_and_the_arguments(classes):
    q8 = classes.Int8Linear(torch.randn(8, 64))
    with pytest.raises(ValueError) as err:
        q8.forward(torch.randn(2, 64, device="cuda"))
    assert str(err.value).startswith("examples::Int8Linear.forward: ")
    assert "qweight" in str(err.value) and "cpu" in str(err.value) and "cuda" in str(err.value)


def test_torch_save_and_load_round_trip_in_a_fresh_process(classes, tmp_path):
    """Two models, one whose Int8Linear has tails (1000 x 1000: N % 8 and K % 64 not 0)."""
    saved = {}
    for name, (k, n) in (("model", (128, 64)), ("tails", (1000, 1000))):
        model, x = Model(classes, torch.nn.Linear(k, n)), torch.randn(2, 3, k)
        saved.update({name: model, f"{name}_x": x, f"{name}_y": model(x)})
    torch.save(saved, tmp_path / "model.pt")
    load = (
        "import sys, torch, opforge\n"
        "if sys.argv[2] == 'load': [opforge.load_library(opforge.example_library(n)) "
        "for n in ('identity_conv', 'int8_linear')]\n"
        "saved = torch.load(sys.argv[1], weights_only=False)\n"
        "for name in ('model', 'tails'):\n"
        "    assert torch.equal(saved[name](saved[name + '_x']), saved[name + '_y'])\n"
        "    print(tuple(saved[name].proj.qweight.shape), tuple(saved[name].proj.scales.shape))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))

    def fresh(mode: str) -> subprocess.CompletedProcess:  # Model is pickled by reference to this module
        return subprocess.run(
            [sys.executable, "-c", load, str(tmp_path / "model.pt"), mode], capture_output=True, text=True, env=env
        )

    run = fresh("load")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["(64, 128) (64,)", "(1000, 1000) (1000,)"]
    run = fresh("no")
    assert run.returncode != 0 and "__torch__.torch.classes.examples.IdentityConvClass" in run.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_traces_the_methods(classes, device):
    model = Model(classes, torch.nn.Linear(128, 64).to(device))
    x = torch.randn(4, 3, 128, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    assert torch.equal(compiled(x), model(x))


@pytest.mark.parametrize("device", DEVICES)
def test_export_and_the_aotinductor_package_run_in_the_cpp_runner(classes, device, tmp_path):
    model = Model(classes, torch.nn.Linear(128, 64).to(device))
    x = torch.randn(2, 3, 128, device=device)
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    calls = [n for n in program.graph.nodes if n.target is torch.ops.higher_order.call_torchbind]
    assert [n.args[1] for n in calls] == ["forward", "forward"]
    other = torch.randn(5, 3, 128, device=device)
    assert torch.equal(program.module()(other), model(other))
    assert sorted(aoti.custom_classes(program)) == ["examples::IdentityConvClass", "examples::Int8Linear"]
    package = aoti.package(program, tmp_path / "pkg")
    result = aoti.run(package, [other], device=device)
    torch.testing.assert_close(result.outputs[0], model(other).cpu(), atol=1e-5, rtol=1e-5)
    for f in package.parent.iterdir():  # the package without the library that defines Int8Linear
        if f.is_file() and f.name != "libint8_linear.so":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(OpforgeError) as err:
        aoti.run(tmp_path / "model.pt2", [other], device=device)
    assert str(err.value).splitlines()[-1] == (
        f"  class examples::Int8Linear (from libint8_linear.so, not found in {tmp_path})"
    )


def test_class_declarations_that_do_not_match_their_ops_fail_to_load(tmp_path):
    path = opforge.build_library("bad_classes", [FIXTURES / "bad_classes.cpp"], build_dir=tmp_path)
    with pytest.raises(ValueError) as err:
        opforge.load_library(path)
    site = str(FIXTURES / "bad_classes.cpp")
    assert str(err.value).splitlines()[1:] == [
        f'{site}:23: badcls::Dunder: method "__call__": expected an identifier that does not start with "__" '
        "(torch reserves __init__, __getstate__, __setstate__ and __obj_flatten__ for what opforge derives)",
        f"{site}:24: badcls::Both: .field() and .constructor() together: with a constructor op, the object's fields "
        "are its outputs and the arguments a method takes",
        f"{site}:25: badcls::Empty: no .method(): a class is used through its methods",
    ]
    # the problems that need the library's ops, once the declarations above are valid
    good = (FIXTURES / "bad_classes.cpp").read_text().split("OPFORGE_CLASS(badcls, Dunder)")[0]
    (tmp_path / "cross.cpp").write_text(good)
    path = opforge.build_library("bad_classes_cross", [tmp_path / "cross.cpp"], build_dir=tmp_path / "cross")
    with pytest.raises(ValueError) as err:
        opforge.load_library(path)
    site = str(tmp_path / "cross.cpp")
    assert str(err.value).splitlines()[1:] == [
        f"{site}:19: badcls::Missing: method forward (op badcls::nowhere): not declared in this library",
        f"{site}:20: badcls::WrongType: method forward (op badcls::take): argument scale is float, but the field "
        "scale is int",
        f"{site}:21: badcls::Writes: method update (op badcls::write): argument y is opforge::mutated: a method may "
        "not write the object's fields (torch.export and AOTInductor treat an object's tensors as constants)",
        f"{site}:22: badcls::NoCtor: constructor op badcls::absent: not declared in this library",
    ]
