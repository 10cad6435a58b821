"""AOTInductor packages that call opforge ops through generated C shims (Note [AOTInductor C shims]
in src/torch/aoti_shims.cpp) instead of the proxy executor, run by the C++ runner."""

from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import opforge
from conftest import DEVICES
from opforge import OpforgeError, _core, aoti
from opforge._aoti_shims import build
from opforge._torch import _load_adapter


class Block(torch.nn.Module):
    """linear -> bias_gelu -> softshrink -> rms_norm: tensors, a float parameter, a second weight."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(24, 64, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(64))
        self.weight = torch.nn.Parameter(torch.rand(64) + 0.5)

    def forward(self, x):
        h = torch.ops.examples.softshrink(torch.ops.examples.bias_gelu(self.linear(x), self.bias), lambd=0.1)
        return torch.ops.examples.rms_norm(h, self.weight, 1e-6)


def model_library(pt2: Path) -> bytes:
    """The compiled model's shared library inside an AOTInductor package."""
    with zipfile.ZipFile(pt2) as z:
        return b"".join(z.read(n) for n in z.namelist() if n.endswith(".so"))


@pytest.fixture(scope="module", params=DEVICES)
def shimmed(request, tmp_path_factory):
    """(model, model.pt2, device): Block packaged with C shims into a folder named relative to the
    working folder, as the README names it (the model's link finds the shim library there)."""
    device = request.param
    for op in ("bias_gelu", "softshrink", "rms_norm"):
        opforge.load_library(opforge.example_library(op))
    model = Block().to(device).eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (torch.randn(3, 24, device=device),), dynamic_shapes=({0: batch},))
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.filterwarnings("error", message="opforge: these ops keep")  # every op has its shim
        patch.chdir(tmp_path_factory.mktemp(f"shims-{device}"))
        package = aoti.package(program, Path("package"), c_shims=True)
        assert package == Path.cwd() / "package" / "model.pt2"  # absolute: usable after a chdir
        return model, package, device


def test_the_model_calls_the_shims_and_the_runner_loads_them(shimmed):
    model, package, device = shimmed
    manifest = (package.parent / aoti.MANIFEST).read_text().splitlines()
    shim_lines = [line for line in manifest if line.startswith("shims ")]
    assert len(shim_lines) == 1 and (package.parent / shim_lines[0].split()[1]).is_file()
    compiled = model_library(package)
    for op in ("bias_gelu", "softshrink", "rms_norm"):  # called by name, not through the proxy executor
        assert f"aoti_torch_{device}_{op}".encode() in compiled
    assert b"proxy_executor" not in compiled
    for batch in (1, 7):  # neither is the export example's batch of 3
        x = torch.randn(batch, 24, device=device)
        with torch.no_grad():
            expected = model(x).cpu()
        result = aoti.run(package, [x], device=device)
        torch.testing.assert_close(result.outputs[0], expected, atol=1e-5, rtol=1e-5)


def copy_package(package: Path, dest: Path, shim_library) -> None:
    """The package's folder into ``dest``, its shim library's bytes through ``shim_library``
    (None: left out)."""
    for f in package.parent.iterdir():
        if f.is_file():
            data = f.read_bytes()
            data = shim_library(data) if f.name.startswith("libopforge_shims_") else data
            if data is not None:
                (dest / f.name).write_bytes(data)


def test_a_package_without_its_shim_library_fails_naming_it(shimmed, tmp_path):
    _, package, device = shimmed
    copy_package(package, tmp_path, lambda data: None)
    with pytest.raises(
        OpforgeError,
        match=r"links the C shim library (.*libopforge_shims_\w+\.so), which cannot be loaded: opforge: cannot read "
        r"the C shim library \1: No such file or directory",
    ):
        aoti.run(tmp_path / "model.pt2", [torch.randn(2, 24)], device=device)


def test_repackaging_removes_what_the_previous_package_used_and_this_one_does_not(shimmed, tmp_path):
    """A package written over another: the old manifest's libraries (op libraries, their kernel
    folders, the shim library) that the new one does not use go; other files stay."""
    _, package, device = shimmed
    copy_package(package, tmp_path, lambda data: data)
    (tmp_path / "libbias_gelu.kernels").mkdir()
    (tmp_path / "notes.txt").write_text("the deployer's own file")
    program = torch.export.export(Softshrink().to(device), (torch.randn(3, 24, device=device),))
    aoti.package(program, tmp_path)
    left = {f.name for f in tmp_path.iterdir()}
    assert not any(name.startswith("libopforge_shims_") for name in left)
    assert not {"libbias_gelu.so", "librms_norm.so", "libbias_gelu.kernels"} & left
    assert {"libsoftshrink.so", "notes.txt", "model.pt2", aoti.MANIFEST} <= left
    x = torch.randn(3, 24, device=device)  # the static export's shape
    torch.testing.assert_close(aoti.run(tmp_path / "model.pt2", [x], device=device).outputs[0], Softshrink()(x).cpu())


class Softshrink(torch.nn.Module):
    def forward(self, x):
        return torch.ops.examples.softshrink(x, 0.25)


class OutCall(torch.nn.Module):
    """bias_gelu, then softshrink through its out= overload into a buffer."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        y = torch.empty_like(x)
        torch.ops.examples.softshrink.out(torch.ops.examples.bias_gelu(x, self.bias), 0.25, y=y)
        return y


def test_an_out_call_keeps_the_proxy_executor_and_says_so(tmp_path):
    for op in ("bias_gelu", "softshrink"):
        opforge.load_library(opforge.example_library(op))
    model, x = OutCall().eval(), torch.randn(4, 8)
    program = torch.export.export(model, (x,))
    with pytest.warns(
        UserWarning, match=r"keep AOTInductor's proxy executor:\n  examples::softshrink: its out= overload"
    ):
        package = aoti.package(program, tmp_path, c_shims=True)
    assert b"aoti_torch_cpu_bias_gelu" in model_library(package)
    with torch.no_grad():
        torch.testing.assert_close(aoti.run(package, [x]).outputs[0], model(x))


#: Ops that C shims cannot take, in a namespace of their own (a library loads into the test process
#: for good): a list parameter, and the name of an example op (AOTInductor's shim names drop the
#: namespace).
SKIPPED_OPS = """
#include <opforge/op.h>
#include <span>
#include <vector>
static void copy_cpu(opforge::Tensor x, opforge::MutableTensor y) {
  for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = x.data<float>()[i];
}
static void padded_cpu(opforge::Tensor x, std::span<const int64_t>, opforge::MutableTensor y) { copy_cpu(x, y); }
OPFORGE_OP(shimtest, padded)
    .input("x", opforge::kFloat32)
    .param<std::vector<int64_t>>("pads", std::vector<int64_t>{})
    .output("y", opforge::like("x"))
    .reference(padded_cpu);
OPFORGE_OP(shimtest, softshrink).input("x", opforge::kFloat32).output("y", opforge::like("x")).reference(copy_cpu);
"""


def test_a_truncated_shim_library_is_an_error_of_the_runner_not_a_crash(shimmed, tmp_path):
    _, package, device = shimmed
    copy_package(package, tmp_path, lambda data: data[:2000])
    with pytest.raises(
        OpforgeError,
        match=r"opforge-runner failed \(exit 2\):\nopforge-runner: .*model\.pt2 links the C shim library "
        r".*libopforge_shims_\w+\.so, which cannot be loaded: opforge: the C shim library .* is truncated: "
        r"its ELF headers describe \d+ bytes and the file has 2000",
    ):
        aoti.run(tmp_path / "model.pt2", [torch.randn(2, 24)], device=device)


def test_ops_that_shims_cannot_carry_keep_the_proxy_executor(tmp_path):
    (tmp_path / "skipped_ops.cpp").write_text(SKIPPED_OPS)
    opforge.load_library(opforge.build_library("shimtest", [tmp_path / "skipped_ops.cpp"], build_dir=tmp_path / "b"))
    opforge.load_library(opforge.example_library("softshrink"))
    padded, softshrink = torch.ops.shimtest.padded.default, torch.ops.examples.softshrink.default
    ops = [("shimtest::padded", padded), ("examples::softshrink", softshrink)]
    shims = build([*ops, ("shimtest::softshrink", torch.ops.shimtest.softshrink.default)], "cpu", tmp_path / "shims")
    assert list(shims.declarations) == [softshrink]
    assert shims.declarations[softshrink] == [
        "AOTITorchError aoti_torch_cpu_softshrink(AtenTensorHandle a0, double a1, AtenTensorHandle* ret0)"
    ]
    assert "shimtest::padded's argument pads (int[]) has no C shim type" in shims.skipped["shimtest::padded"]
    assert shims.skipped["shimtest::softshrink"] == (
        "examples::softshrink's shim has the same name, aoti_torch_cpu_softshrink"
    )
    assert shims.inductor_configs()["aot_inductor.custom_op_libs"] == [shims.path.name[3:-3]]
    assert build([("shimtest::padded", padded)], "cpu", tmp_path / "none") is None


def test_a_shim_is_refused_with_the_reason(tmp_path):
    opforge.load_library(opforge.example_library("softshrink"))
    entry = _load_adapter().opforge_torch_aoti_shim
    with pytest.raises(ValueError, match=re.escape('C shims are for device "cpu" or "cuda", not "tpu"')):
        _core.call(entry, "examples::softshrink tpu")
    with pytest.raises(ValueError, match="no loaded op library declares examples::no_such_op"):
        _core.call(entry, "examples::no_such_op cpu")
