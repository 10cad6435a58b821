"""AOTInductor packages with opforge ops, run by the C++ runner in a fresh process."""

from __future__ import annotations

import subprocess
import warnings

import pytest
import torch

import opforge
from conftest import DEVICES, requires_two_gpus, run_runner
from opforge import OpforgeError, aoti
from opforge._adapter import runner_path


class Pipeline(torch.nn.Module):
    """linear -> bias_gelu -> softshrink: one custom op's output feeds the next."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(24, 40, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(40))

    def forward(self, x):
        return torch.ops.examples.softshrink(torch.ops.examples.bias_gelu(self.linear(x), self.bias), lambd=0.1)


#: The warnings each device's package prints under Python's default filters (packaged fixture).
PACKAGING_WARNINGS: dict[str, list[str]] = {}


@pytest.fixture(scope="module", params=DEVICES)
def packaged(request, tmp_path_factory):
    device = request.param
    model = Pipeline().to(device).eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (torch.randn(3, 24, device=device),), dynamic_shapes=({0: batch},))
    # sm_90 binaries of the run-time kernels go into the package, also for a CPU package.
    with warnings.catch_warnings(record=True) as caught:  # what Python prints by default
        warnings.resetwarnings()
        for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", hidden)
        # Inductor's advice on the first float32 matmul it compiles on a GPU with TF32 (once per
        # process, so it lands in whichever test compiles first): one the user can act on.
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores for float32 matrix multiplication")
        package = aoti.package(program, tmp_path_factory.mktemp(f"pkg-{device}"), archs=["sm_90"])
    PACKAGING_WARNINGS[device] = [str(w.message) for w in caught]
    return model, package, device


def test_packaging_warns_of_nothing(packaged):
    assert PACKAGING_WARNINGS[packaged[2]] == []


def test_round_trip_in_cpp_runner(packaged, tmp_path, monkeypatch):
    model, package, device = packaged
    manifest = (package.parent / aoti.MANIFEST).read_text().splitlines()
    assert manifest[1:] == ["examples::bias_gelu libbias_gelu.so", "examples::softshrink libsoftshrink.so"]
    runner_cache = tmp_path / "runner-cache"
    for batch in (1, 7):  # neither is the export example's batch of 3
        x = torch.randn(batch, 24, device=device)
        with torch.no_grad():
            expected = model(x).cpu()
        with monkeypatch.context() as m:
            m.setenv("OPFORGE_CACHE_DIR", str(runner_cache))  # the runner's own kernel cache
            result = aoti.run(package, [x], device=device)
        assert result.device.startswith(device)
        assert len(result.outputs) == 1 and result.outputs[0].shape == (batch, 40)
        torch.testing.assert_close(result.outputs[0], expected, atol=1e-5, rtol=1e-5)
        assert result.latency_ms["median"] > 0
    # The package carries sm_90 binaries of its run-time kernels: the runner compiled nothing.
    if device == "cuda" and torch.cuda.get_device_capability() == (9, 0):
        assert not list((runner_cache / "kernels").glob("*.bin"))


def test_the_runner_refuses_inputs_the_package_was_not_compiled_for(packaged):
    """AOTInductor's input checks, which the runner turns on: a size past the export's bound and
    a dtype the graph was not compiled for fail with AOTInductor's message naming the input (a
    float64 input was read as float32 before); a batch of 1, under Inductor's lower bound of 2,
    still runs."""
    model, package, device = packaged
    for x, message in (
        (torch.randn(4097, 24, device=device), "input_handles[0]: dim value is too large at 0, expected to be <= 4096"),
        (torch.randn(3, 24, device=device, dtype=torch.float64), "input_handles[0]: unmatched dtype"),
    ):
        with pytest.raises(OpforgeError) as err:
            aoti.run(package, [x], device=device)
        assert message in str(err.value) and "failed (AOTInductor's message is above)" in str(err.value)
    assert aoti.run(package, [torch.randn(1, 24, device=device)], device=device).outputs[0].shape == (1, 40)


@requires_two_gpus
def test_cuda_package_runs_on_the_second_gpu(packaged):
    """A package exported on cuda:0, run by the C++ runner on cuda:1: the custom ops compute on
    the runner's device (their device guard and stream), not on the current device 0."""
    model, package, device = packaged
    if device != "cuda":
        pytest.skip("the CUDA package")
    x = torch.randn(5, 24)
    with torch.no_grad():
        expected = model(x.to(device)).cpu()
    result = aoti.run(package, [x], device="cuda:1")
    assert result.device == "cuda:1"
    torch.testing.assert_close(result.outputs[0], expected, atol=1e-5, rtol=1e-5)


def test_package_ships_run_time_kernels_precompiled(packaged):
    _, package, _ = packaged
    kernels = package.parent / "libsoftshrink.kernels"
    assert (kernels / "softshrink.cu").is_file() and not (kernels / "softshrink.cu").is_symlink()
    assert (kernels / "opforge" / "kernel.cuh").is_file() and (kernels / "opforge" / "tma.cuh").is_file()
    assert len(list((kernels / "cache").glob("*.bin"))) == 1  # float32 is the one instantiation
    assert not (package.parent / "libbias_gelu.kernels" / "cache").exists()  # ahead-of-time kernel


def test_runner_names_missing_ops_and_libraries(packaged, tmp_path):
    _, package, device = packaged
    for f in package.parent.iterdir():
        if f.is_file() and f.name != "libsoftshrink.so":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(OpforgeError) as err:
        aoti.run(tmp_path / "model.pt2", [torch.randn(2, 24)], device=device)
    assert str(err.value).splitlines()[-2:] == [
        f"opforge-runner: {tmp_path / 'model.pt2'} needs ops or classes that are not available:",
        f"  examples::softshrink (from libsoftshrink.so, not found in {tmp_path})",
    ]


def test_runner_refuses_package_without_manifest(packaged, tmp_path):
    _, package, device = packaged
    (tmp_path / "model.pt2").write_bytes(package.read_bytes())
    with pytest.raises(OpforgeError, match="no op manifest .*opforge_ops.txt beside"):
        aoti.run(tmp_path / "model.pt2", [torch.randn(2, 24)], device=device)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--iters", "0"], "--iters: Value 0 not in range 1 to"),
        (["--warmup", "-1"], "--warmup: Value -1 not in range 0 to"),
        (["--warmup", "two"], "--warmup: Value two not in range 0 to"),
        (["--bogus", "1"], "were not expected"),
    ],
)
def test_runner_rejects_bad_command_lines(tmp_path, args, expected):
    """The runner's flags are parsed by CLI11: a bad one is named, with a non-zero exit, before
    any package is loaded."""
    (tmp_path / "model.pt2").write_bytes(b"")
    (tmp_path / "in.pt").write_bytes(b"")
    proc = run_runner(tmp_path / "model.pt2", tmp_path / "in.pt", tmp_path / "out.pt", *args)
    assert proc.returncode != 0
    assert expected in proc.stderr
    assert "no op manifest" not in proc.stderr


def test_runner_names_a_missing_package_and_lists_its_flags(tmp_path):
    proc = run_runner(tmp_path / "absent.pt2", tmp_path / "in.pt", tmp_path / "out.pt")
    assert proc.returncode != 0
    assert f"File does not exist: {tmp_path / 'absent.pt2'}" in proc.stderr
    usage = subprocess.run([str(runner_path()), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0
    for flag in ("--inputs", "--output", "--device TEXT=cpu", "--warmup", "--iters"):
        assert flag in usage.stdout


def test_run_reports_the_runners_complaint(packaged):
    _, package, device = packaged
    with pytest.raises(OpforgeError, match=r"(?s)opforge-runner failed \(exit \d+\):.*--iters: Value 0 not in range"):
        aoti.run(package, [torch.randn(2, 24)], device=device, iters=0)


class PackWithoutBias(torch.nn.Module):
    """Int8Linear's constructor op with no bias: its third output (bias_fp32) is None."""

    def forward(self, w):
        return torch.ops.examples.int8_linear_pack(w)


def test_an_output_the_model_returns_as_none_comes_back_as_none(tmp_path):
    opforge.load_library(opforge.example_library("int8_linear"))
    w = torch.randn(16, 64)
    expected = PackWithoutBias()(w)
    assert expected[2] is None
    package = aoti.package(torch.export.export(PackWithoutBias(), (w,)), tmp_path)
    outputs = aoti.run(package, [w]).outputs
    assert outputs[2] is None
    torch.testing.assert_close(outputs[:2], list(expected[:2]))
