"""AOTInductor packages with opforge ops, run by the C++ runner in a fresh process."""

from __future__ import annotations

import re
import struct
import subprocess
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import opforge
from conftest import DEVICES, requires_cuda, requires_two_gpus, run_runner
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


def test_a_package_folder_named_like_a_pt2_file_is_refused(packaged, tmp_path):
    model, package, device = packaged
    program = torch.export.export(model, (torch.randn(3, 24, device=device),))
    with pytest.raises(ValueError) as err:
        aoti.package(program, tmp_path / "model.pt2")
    assert str(err.value) == (
        f"opforge.aoti.package: package_dir {tmp_path / 'model.pt2'} names a .pt2 file; give the folder to write "
        f"model.pt2 and its op libraries into (e.g. {tmp_path / 'model'})"
    )
    assert list(tmp_path.iterdir()) == []


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
    still runs. A failed run, like a passing one, removes the copy of the package that
    AOTInductor's loader extracted (into /tmp/XXXXXX/, whatever TMPDIR says)."""
    model, package, device = packaged
    start = time.time()
    for x, message in (
        (torch.randn(4097, 24, device=device), "input_handles[0]: dim value is too large at 0, expected to be <= 4096"),
        (torch.randn(3, 24, device=device, dtype=torch.float64), "input_handles[0]: unmatched dtype"),
    ):
        with pytest.raises(OpforgeError) as err:
            aoti.run(package, [x], device=device)
        assert message in str(err.value) and "failed (AOTInductor's message is above)" in str(err.value)
    assert aoti.run(package, [torch.randn(1, 24, device=device)], device=device).outputs[0].shape == (1, 40)
    # The model's compiled library, named by a hash of its code: no other test's package has it.
    with zipfile.ZipFile(package) as archive:
        libraries = {Path(name).name for name in archive.namelist() if name.endswith(".so")}
    extracted = Path("/tmp").glob("*/model/data/aotinductor/model/*.so")
    left = [p for p in extracted if p.name in libraries and p.stat().st_mtime >= start - 1]
    assert libraries and not left


def test_the_runner_refuses_an_output_it_cannot_write(packaged, tmp_path):
    """An output in a folder that does not exist is refused before the run; one the system will
    not create fails the run; neither exits 0 with nothing written."""
    model, package, device = packaged
    inputs = tmp_path / "x.pt"
    inputs.write_bytes(torch._C._pickle_save((torch.randn(2, 24),)))
    missing = tmp_path / "results" / "y.pt"
    for flags in ((), ("--inputs-after", str(missing))):
        output = missing if not flags else tmp_path / "y.pt"
        proc = run_runner(package, inputs, output, "--device", device, *flags)
        assert (proc.returncode, proc.stderr) == (
            2,
            f"opforge-runner: cannot write {missing}: the folder {missing.parent} does not exist\n",
        )
    proc = run_runner(package, inputs, "/proc/y.pt", "--device", device)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].startswith("opforge-runner: cannot write /proc/y.pt: ")


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
    assert f"package: Path does not exist: {tmp_path / 'absent.pt2'}" in proc.stderr
    usage = subprocess.run([str(runner_path()), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0
    for flag in ("--inputs", "--output", "--device TEXT=cpu", "--warmup", "--iters"):
        assert flag in usage.stdout


def test_the_runner_takes_the_package_folder(packaged, tmp_path):
    """The folder opforge.aoti.package wrote names the package as well as its model.pt2 does."""
    _, package, device = packaged
    x = torch.randn(3, 24)
    by_folder = aoti.run(package.parent, [x], device=device).outputs
    torch.testing.assert_close(by_folder, aoti.run(package, [x], device=device).outputs, rtol=0, atol=0)
    (tmp_path / "in.pt").write_bytes(b"")
    proc = run_runner(tmp_path, tmp_path / "in.pt", tmp_path / "out.pt")
    assert proc.returncode == 2
    assert f"the package folder {tmp_path} holds no model.pt2 (opforge.aoti.package writes one there)" in proc.stderr


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


class TritonModel(torch.nn.Module):
    """tt::add, then tt::softmax (both Triton kernels), then a standard op."""

    def forward(self, x, y):
        return torch.ops.tt.softmax(torch.ops.tt.add(x, y)) * 2


def cache_entry(path: Path) -> tuple[str, str, str | None, str | None]:
    """(kind, function, target, variant) of a Triton entry of a kernel cache, read from the key it
    is stored under (src/oplib/runtime_kernel.cpp's format: 8 magic bytes, then the key's length
    and text; Triton's keys in src/oplib/triton_cuda.cpp): kind "inspect" (the function's
    description) or "variant"; the target ("sm_90") and the variant's key text of a variant."""
    data = path.read_bytes()
    assert data[:8] == b"OPFGRTC1", path
    (size,) = struct.unpack("<Q", data[8:16])
    key = data[16 : 16 + size].decode()
    kind = key.split("\n", 1)[0].removeprefix("opforge-triton-v1 ")
    function = re.search(r"^function (\w+)$", key, re.M)[1]
    variant = re.search(r"\ntarget (sm_\d+)\nvariant ([^\n]*)$", key)
    return kind, function, variant[1] if variant else None, variant[2] if variant else None


def _package_triton_model(device: str, folder: Path) -> tuple[TritonModel, Path]:
    """TritonModel exported on ``device`` with x, y of [3, 100] and a dynamic batch, packaged."""
    model = TritonModel()
    batch = torch.export.Dim("batch", min=1, max=64)
    x, y = torch.randn(3, 100, device=device), torch.randn(3, 100, device=device)
    program = torch.export.export(model, (x, y), dynamic_shapes=({0: batch}, {0: batch}))
    return model, aoti.package(program, folder, archs=["sm_90"] if device == "cpu" else None)


def test_a_package_carries_the_triton_kernels_of_its_calls(triton_ops, tmp_path, private_kernel_cache):
    """The kernel folder's .py files as files, and in its cache, for sm_90 (compiled here without
    a GPU), each function's description and, for the example call's shapes (the dynamic batch at
    its example size, 3), the variant Triton specialises and the general one. The C++ runner on
    the CPU runs the references."""
    model, package = _package_triton_model("cpu", tmp_path / "pkg")
    kernels = package.parent / "libtriton_ops.kernels"
    source = kernels / "triton_add.py"
    assert source.is_file() and not source.is_symlink()
    assert source.read_text() == (triton_ops.kernel_dir / "triton_add.py").read_text()
    entries = [cache_entry(p) for p in (kernels / "cache").glob("*.bin")]
    assert sorted((kind, function, target) for kind, function, target, _ in entries) == [
        ("inspect", "add_kernel", None),
        ("inspect", "softmax_kernel", None),
        ("variant", "add_kernel", "sm_90"),
        ("variant", "add_kernel", "sm_90"),
        ("variant", "softmax_kernel", "sm_90"),
        ("variant", "softmax_kernel", "sm_90"),
    ]
    # add_kernel(x_ptr, y_ptr, output_ptr, n_elements = 300, BLOCK_SIZE): aligned pointers, then every 64-bit
    add = sorted(v.split(", warps")[0] for _, f, _, v in entries if f == "add_kernel" and v)
    assert add == ["*fp32,*fp32,*fp32,i64,constexpr=1024", "*fp32:16,*fp32:16,*fp32:16,i32,constexpr=1024"]
    x, y = torch.randn(5, 100), torch.randn(5, 100)
    result = aoti.run(package, [x, y])
    torch.testing.assert_close(result.outputs[0], model(x, y))
    # Another shape to ship: precompiled into the package's cache, its variant joins the general one.
    shapes = {"x": (16, 100), "y": (16, 100)}
    assert not opforge.precompile(
        "tt::add", {"x": torch.float32}, arch="sm_90", cache_dir=kernels / "cache", shapes=shapes
    )
    entries = [cache_entry(p) for p in (kernels / "cache").glob("*.bin")]
    add = sorted(v.split(", warps")[0] for _, f, _, v in entries if f == "add_kernel" and v)
    assert add[1:] == [
        "*fp32:16,*fp32:16,*fp32:16,i32,constexpr=1024",
        "*fp32:16,*fp32:16,*fp32:16,i32:16,constexpr=1024",
    ]


@requires_cuda
def test_the_runner_runs_a_triton_package_from_its_cubins_alone(triton_ops, tmp_path, monkeypatch):
    """On CUDA, the runner (no OPFORGE_TRITON_PYTHON: aoti.run leaves it out, so it compiles
    nothing) with an empty kernel cache of its own runs the cubins the package carries: the
    example call's variants, and the general ones for sizes Triton would specialise otherwise
    (a batch of 16 makes sizes divisible by 16, a batch of 1 a row count of 1). Without the
    variants, a call fails naming the op, the kernel and the specialisation."""
    model, package = _package_triton_model("cuda", tmp_path / "pkg")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "runner-cache"))  # empty: only the package's
    for batch in (3, 16, 1):
        x, y = torch.randn(batch, 100), torch.randn(batch, 100)
        result = aoti.run(package, [x, y], device="cuda")
        torch.testing.assert_close(result.outputs[0], model(x, y), atol=1e-5, rtol=1e-5)
    assert not list((tmp_path / "runner-cache").rglob("*.bin"))
    cache = package.parent / "libtriton_ops.kernels" / "cache"
    for path in cache.glob("*.bin"):
        if cache_entry(path)[0] == "variant":
            path.unlink()
    with pytest.raises(OpforgeError) as err:
        aoti.run(package, [torch.randn(3, 100), torch.randn(3, 100)], device="cuda")
    assert (
        "tt::add (cuda:0 kernel): the Triton function add_kernel of triton_add.py: the kernel folder "
        f"{package.parent / 'libtriton_ops.kernels'} carries no variant for sm_"
    ) in str(err.value)
    assert "(x_ptr: *fp32 (divisible by 16), y_ptr: *fp32 (divisible by 16)" in str(err.value)


class MaskedAddModel(torch.nn.Module):
    """tt::add of the positive elements of x: its inputs' size depends on data."""

    def forward(self, x):
        positive = x[x > 0]
        return torch.ops.tt.add(positive, positive)


def test_a_triton_call_whose_size_depends_on_data_is_named_when_packaged(triton_ops, tmp_path):
    """No example size, so no variant to compile: the package warns, naming the op, and the
    runner on the CPU still runs the reference."""
    x = torch.randn(64)
    program = torch.export.export(MaskedAddModel(), (x,))
    with pytest.warns(UserWarning) as caught:
        package = aoti.package(program, tmp_path / "pkg", archs=["sm_90"])
    assert (
        "opforge.aoti.package: a call of tt::add has an input whose size depends on data, so the package carries "
        "no compiled variant of its Triton kernels for it: the C++ runner will fail on that call unless its cache "
        "holds one"
    ) in [str(w.message) for w in caught]
    torch.testing.assert_close(aoti.run(package, [x]).outputs[0], 2 * x[x > 0])


class ScaleModel(torch.nn.Module):
    """tt::scale, whose Triton kernel is autotuned on its size, then a standard op."""

    def forward(self, x):
        return torch.ops.tt.scale(x, 3.0) + 1


@requires_cuda
def test_a_package_carries_the_autotune_choice_its_call_was_tuned_with(triton_ops, tmp_path, monkeypatch):
    """A model run once on CUDA tunes tt::scale for its call (the choice kept in the kernel cache);
    the package carries that choice, and the runner, which cannot tune, runs with it. A call of
    another tuning key fails naming the op, the kernel and the key."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    model, x = ScaleModel(), torch.randn(3, 1000, device="cuda")
    torch.testing.assert_close(model(x), 3 * x + 1)  # tunes for n = 3000
    batch = torch.export.Dim("batch", min=1, max=64)
    package = aoti.package(torch.export.export(model, (x,), dynamic_shapes=({0: batch},)), tmp_path / "pkg")
    kernels = package.parent / "libtriton_ops.kernels"
    assert [cache_entry(p)[:2] for p in (kernels / "cache").glob("*.bin")].count(("autotune", "scale_kernel")) == 1
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "runner-cache"))  # empty: only the package's
    torch.testing.assert_close(aoti.run(package, [x.cpu()], device="cuda").outputs[0], 3 * x.cpu() + 1)
    with pytest.raises(OpforgeError) as err:
        aoti.run(package, [torch.randn(5, 1000)], device="cuda")
    assert (
        f"tt::scale (cuda:0 kernel): the Triton function scale_kernel of triton_add.py is autotuned, and the kernel "
        f"folder {kernels} "
        "carries no choice for the tuning key n=5000 "
    ) in str(err.value)
