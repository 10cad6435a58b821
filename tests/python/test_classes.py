"""Custom classes (Note [Custom classes] in opforge/op_class.h): IdentityConvClass and Int8Linear in
eager calls, through torch.save/torch.load in a fresh process, torch.compile, torch.export,
AOTInductor and the C++ runner; class declarations that must fail to load."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opforge
from conftest import DEVICES, TOLERANCE, requires_cuda
from opforge import aoti
from opforge._core import OpforgeError

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def classes():
    for lib in ("identity_conv", "int8_linear"):
        opforge.load_library(opforge.example_library(lib))
    return torch.classes.examples


def quantised(weight: torch.Tensor):
    """Symmetric per-output-channel int8 in float32, as torchao's int8_weight_only: (q, scales)."""
    w = weight.float()
    scales = w.abs().amax(1) / 127
    return torch.round(w / scales[:, None]).clamp(-127, 127), scales


def dequantised_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y in float64 with the weight dequantised in float32 and rounded to x's dtype once, as the
    CPU reference and the cuBLAS path do (the small-M kernels scale exact integer sums instead,
    which stays within the tests' tolerance), on x's device."""
    w = (q * scales[:, None]).to(x.dtype).to(x.device)
    return torch.nn.functional.linear(x.double(), w.double(), bias.double().to(x.device))


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
# rows: the CUDA kernels' variants (on sm_90: the pass kernel with 8 rows of x, 1-8, and 16,
# 9-16; per-warp rings, 17-64; cuBLAS past 64); 4672 input features = 73 chunks of 64, past a warp's
# ring of weight stages and one chunk into the pass kernel's last stage of 8.
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 16, 40, 200])
@pytest.mark.parametrize("in_features", [192, 4672])
def test_int8_linear_computes_with_the_quantised_weights(classes, device, dtype, rows, in_features):
    linear = torch.nn.Linear(in_features, 72)  # 72 = 9 strips of 8 output channels: an odd count
    weight = linear.weight.detach().to(device)
    q8 = classes.Int8Linear(weight, linear.bias.detach().to(device))
    q, scales = quantised(linear.weight.detach())
    assert torch.equal(q8.scales.cpu(), scales)
    assert torch.equal(q8.qweight.cpu().flatten().sort().values, q.to(torch.int8).flatten().sort().values)
    x = torch.randn(rows, in_features, device=device).to(dtype)
    y = q8.forward(x)
    ref = dequantised_linear(x.cpu(), q, scales, linear.bias.detach())
    tol = TOLERANCE[dtype] * in_features**0.5  # float32 sums of K products, in any order
    torch.testing.assert_close(y.double().cpu(), ref, atol=tol, rtol=tol)
    assert y.dtype == dtype and y.device == x.device


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("strips_per_sm", [3.1, 17.2])
def test_int8_linear_splits_many_strips_over_the_multiprocessors(classes, dtype, rows, strips_per_sm):
    """Output channels in strips of 8, a few more than a multiple of the multiprocessors: blocks
    with unequal shares, in one pass over K (3-4 strips a block) and in three (17-18 strips, 8 a
    pass)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out_features, in_features = 8 * int(strips_per_sm * sms), 4672
    weight = torch.randn(out_features, in_features, device="cuda") / in_features**0.5
    bias = torch.randn(out_features, device="cuda")
    q8 = classes.Int8Linear(weight, bias)
    q, scales = quantised(weight)
    x = torch.randn(rows, in_features, device="cuda").to(dtype)
    ref = dequantised_linear(x, q, scales, bias)
    tol = TOLERANCE[dtype] * in_features**0.5
    torch.testing.assert_close(q8.forward(x).double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [3, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_linear_without_input_channels_gives_the_bias(classes, device, rows, dtype):
    bias = torch.randn(16, device=device)
    q8 = classes.Int8Linear(torch.randn(16, 0, device=device), bias)
    y = q8.forward(torch.randn(rows, 0, device=device, dtype=dtype))
    assert torch.equal(y, bias.to(dtype).expand(rows, 16))


@pytest.mark.parametrize("device", DEVICES)
def test_int8_linear_quantises_non_finite_weights_to_zero(classes, device):
    w = torch.randn(8, 64)
    w[0, 3], w[1, 5], w[2, :] = float("nan"), float("inf"), 0.0
    q8 = classes.Int8Linear(w.to(device))
    q, scales = q8.qweight.cpu(), q8.scales.cpu()
    assert torch.equal(q, classes.Int8Linear(w).qweight)  # the same bytes as the CPU reference
    amax = w.nan_to_num(nan=0.0, posinf=float("inf")).abs().amax(1)  # NaN weights do not count
    assert torch.equal(scales, amax / 127) and scales[1] == float("inf") and scales[2] == 0
    expected = torch.round(w / scales[:, None])  # inf/inf, x/inf, 0/0 and NaN: not finite, so 0
    expected = torch.where(expected.isfinite(), expected, 0).clamp(-127, 127).to(torch.int8)
    assert torch.equal(q.flatten().sort().values, expected.flatten().sort().values)


def test_int8_linear_refuses_shapes_its_packing_cannot_hold(classes):
    with pytest.raises(ValueError, match=r"Int8Linear.__init__: .*\n  expected weight.size\(0\) % 8 == 0"):
        classes.Int8Linear(torch.randn(10, 64))
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
    model = Model(classes, torch.nn.Linear(128, 64))
    x = torch.randn(2, 3, 128)
    torch.save({"model": model, "x": x, "y": model(x)}, tmp_path / "model.pt")
    load = (
        "import sys, torch, opforge\n"
        "if sys.argv[2] == 'load': [opforge.load_library(opforge.example_library(n)) "
        "for n in ('identity_conv', 'int8_linear')]\n"
        "saved = torch.load(sys.argv[1], weights_only=False)\n"
        "assert torch.equal(saved['model'](saved['x']), saved['y'])\n"
        "print(saved['model'].proj.scales.shape)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))

    def fresh(mode: str) -> subprocess.CompletedProcess:  # Model is pickled by reference to this module
        return subprocess.run(
            [sys.executable, "-c", load, str(tmp_path / "model.pt"), mode], capture_output=True, text=True, env=env
        )

    run = fresh("load")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "torch.Size([64])"
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
