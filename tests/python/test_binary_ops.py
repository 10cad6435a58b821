"""Ops whose device kernels are prebuilt binaries (Note [Prebuilt kernels] in opforge/op_launch.h):
a cubin, a fatbin and PTX that nvcc writes here for sm_90 from fixtures/kernels/binary_scale.cu,
and a cubin CuTe DSL wrote (fixtures/kernels/cute_scale.py). Without a GPU: the description, the
CPU reference, and precompile's checks of each binary (code for the architecture, the symbol, the
parameters' sizes and a mangled name's types), which refuse deliberately wrong kernels with
pinned messages. On a GPU: results against the reference for every kind of file and launch
rule (PTX compiled by the driver), the same checks by the driver's reading, torch.compile, CUDA
graphs, and a replaced binary after opforge.reload()."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import opforge
from conftest import DEVICES, requires_cuda
from opforge import aoti
from readme_blocks import ROOT, blocks

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DOC = ROOT / "docs" / "prebuilt_kernels.md"
SOURCE = FIXTURES / "kernels" / "binary_scale.cu"
#: Written by CuTe DSL 4.8.1 (fixtures/kernels/cute_scale.py) for sm_90a. With OPFORGE_CUTE_DSL_PYTHON
#: naming a Python that has nvidia-cutlass-dsl, the tests compile it afresh instead.
CUTE_CUBIN = FIXTURES / "kernels" / "cute_scale.cubin"
NOTE = "see Note [Prebuilt kernels] in opforge/op_launch.h:"
PASSED = "(float const*, float*, int64_t, double)"
#: How a refusal of a binary without code for the GPU says where code runs.
RULE = "(machine code runs on GPUs of its major version and at least its minor; PTX on its architecture and newer)"


def nvcc() -> str | None:
    """The CUDA toolkit's nvcc: on PATH, under $CUDA_HOME, or in /usr/local/cuda."""
    for candidate in (
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "nvcc"),
        "/usr/local/cuda/bin/nvcc",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


pytestmark = pytest.mark.skipif(nvcc() is None, reason="needs nvcc (the CUDA toolkit) to build the fixture binaries")


#: How the fixture binaries are built: nvcc's output kind and target (docs/prebuilt_kernels.md shows them).
NVCC_BUILDS = (
    ("cubin", "-arch=sm_90"),
    ("fatbin", "-gencode=arch=compute_90,code=[sm_90,compute_90]"),
    ("ptx", "-arch=compute_90"),
)


def compile_binaries(folder: Path, *defines: str) -> list[Path]:
    """binary_scale.cubin (sm_90), .fatbin (sm_90 code and compute_90 PTX) and .ptx (compute_90)
    from fixtures/kernels/binary_scale.cu, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    outputs = []
    for kind, target in NVCC_BUILDS:
        out = folder / f"binary_scale.{kind}"
        subprocess.run([nvcc(), f"--{kind}", target, *defines, "-o", str(out), str(SOURCE)], check=True, timeout=300)
        outputs.append(out)
    return outputs


def write_cute_cubin(folder: Path) -> None:
    """folder/cute_scale.cubin: compiled now where OPFORGE_CUTE_DSL_PYTHON names a Python with CuTe
    DSL, else the one the fixture folder carries."""
    python = os.environ.get("OPFORGE_CUTE_DSL_PYTHON")
    if python:
        subprocess.run([python, str(FIXTURES / "kernels" / "cute_scale.py"), str(folder)], check=True, timeout=600)
    else:
        shutil.copy(CUTE_CUBIN, folder / "cute_scale.cubin")


@pytest.fixture(scope="module")
def binaries(tmp_path_factory) -> Path:
    """The folder of the kernel files the library's kernel folder links to (a test may replace
    one, and puts it back)."""
    folder = tmp_path_factory.mktemp("binaries")
    compile_binaries(folder)
    # Machine code for Ampere only, which runs on sm_80 to sm_89 and nowhere else.
    subprocess.run(
        [nvcc(), "--cubin", "-arch=sm_80", "-o", str(folder / "binary_scale_sm80.cubin"), str(SOURCE)],
        check=True,
        timeout=300,
    )
    write_cute_cubin(folder)
    shutil.copy(SOURCE, folder / "binary_scale.cu")
    return folder


@pytest.fixture(scope="module")
def library(tmp_path_factory, binaries):
    kernels = [binaries / name for name in sorted(os.listdir(binaries))]
    path = opforge.build_library(
        "binary_ops", [FIXTURES / "binary_ops.cpp"], kernels=kernels, build_dir=tmp_path_factory.mktemp("build")
    )
    with pytest.warns(UserWarning, match="absent.cubin"):  # bin::no_file's
        return opforge.load_library(path)


def refused(op: str, arch: str = "sm_90", **dtypes) -> str:
    """The message precompile refuses `op`'s float32 (or `dtypes`) instantiation with."""
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile(op, dtypes or {"x": torch.float32}, arch=arch)
    return str(err.value)


def test_the_description_names_the_prebuilt_kernels(library):
    kernels = {op.name: op.runtime_kernels for op in library.ops}
    assert [(k.source, k.name, k.backend) for k in kernels["bin::scale"]] == [
        ("binary_scale.cubin", "scale_kernel", "binary")
    ]
    assert [k.source for k in kernels["bin::scale_ptx"]] == ["binary_scale.ptx"]
    assert [k.name for k in kernels["bin::scale_typed"]] == ["scale_{T}"]


def test_the_cpu_runs_the_reference(library):
    x = torch.randn(1000)
    torch.testing.assert_close(torch.ops.bin.scale(x, 3.0), 3 * x)
    torch.testing.assert_close(torch.ops.bin.cute_scale(x), 2 * x)
    rows = torch.randn(7, 33)
    torch.testing.assert_close(torch.ops.bin.row_sum(rows), rows.sum(1))


@pytest.mark.parametrize(
    "op", ["scale", "scale_fatbin", "scale_ptx", "scale_grid", "scale_mangled", "cute_scale", "row_sum"]
)
def test_precompile_checks_each_binary_and_compiles_nothing(library, op, tmp_path):
    assert opforge.precompile(f"bin::{op}", {"x": torch.float32}, arch="sm_90", cache_dir=tmp_path) is True
    assert not list(tmp_path.iterdir())


def test_the_symbol_names_a_kernel_per_dtype(library):
    for dtype in (torch.float32, torch.float64):
        assert opforge.precompile("bin::scale_typed", {"x": dtype}) is True


def test_ptx_runs_on_newer_gpus_and_machine_code_on_its_own(library):
    assert opforge.precompile("bin::scale_ptx", {"x": torch.float32}, arch="sm_100") is True
    assert opforge.precompile("bin::scale_fatbin", {"x": torch.float32}, arch="sm_100") is True  # its PTX
    assert refused("bin::scale", arch="sm_80") == (
        "bin::scale: the prebuilt kernel scale_kernel of binary_scale.cubin: the file holds sm_90 code and no code "
        f"that runs on sm_80 {RULE}"
    )
    assert refused("bin::scale_ptx", arch="sm_80") == (
        "bin::scale_ptx: the prebuilt kernel scale_kernel of binary_scale.ptx: the file holds PTX for sm_90 and no "
        f"code that runs on sm_80 {RULE}"
    )
    assert opforge.precompile("bin::sm80_only", {"x": torch.float32}, arch="sm_86") is True
    assert refused("bin::sm80_only", arch="sm_90") == (
        "bin::sm80_only: the prebuilt kernel scale_kernel of binary_scale_sm80.cubin: the file holds sm_80 code and "
        f"no code that runs on sm_90 {RULE}"
    )


@pytest.mark.parametrize(
    ("op", "file", "code"),
    [
        ("int_n", "binary_scale.cubin", "sm_90 code"),
        ("int_n_fatbin", "binary_scale.fatbin", "sm_90 code"),
        ("int_n_ptx", "binary_scale.ptx", "PTX for sm_90"),
    ],
)
def test_a_parameter_of_another_size_is_refused(library, op, file, code):
    assert refused(f"bin::{op}") == (
        f"bin::{op}: the prebuilt kernel scale_int_n of {file} has parameters of 8, 8, 4, 8 bytes (as its {code} "
        f"records them) but is passed {PASSED}; {NOTE}\n"
        "  parameter 3 (launch value n): expected int64_t (8 bytes), found a parameter of 4 bytes"
    )


def test_a_missing_parameter_is_refused(library):
    assert refused("bin::no_flag") == (
        "bin::no_flag: the prebuilt kernel scale_kernel of binary_scale.cubin has parameters of 8, 8, 8, 8 bytes "
        f"(as its sm_90 code records them) but is passed (float const*, float*, int64_t, double, bool); {NOTE}\n"
        "  parameter 5 (parameter flag): expected bool (1 byte), the kernel has no such parameter"
    )


def test_a_mangled_name_is_checked_by_type(library):
    assert refused("bin::doubles") == (
        "bin::doubles: the prebuilt kernel _Z13scale_doublesPKdPdld of binary_scale.cubin is declared (double "
        f"const*, double*, long, double) but is passed {PASSED}; {NOTE}\n"
        "  parameter 1 (input x): expected float const*, found double const*\n"
        "  parameter 2 (output y): expected float*, found double*"
    )


def test_a_missing_symbol_names_the_kernels_there(library):
    assert refused("bin::no_symbol") == (
        "bin::no_symbol: the prebuilt kernel scale of binary_scale.cubin: its sm_90 code has no kernel named scale "
        "(its kernels: _Z13scale_doublesPKdPdld, _Z13scale_mangledPKfPfld, row_sum, scale_float32, scale_float64, "
        "scale_int_n, scale_kernel)"
    )


def test_a_missing_file_is_named(library):
    assert refused("bin::no_file") == (
        f"bin::no_file: the prebuilt kernel scale_kernel of absent.cubin: {library.kernel_dir}/absent.cubin cannot be "
        f"read (it ships beside the op library, in {library.kernel_dir})"
    )


def test_a_file_that_is_no_binary_is_refused(library):
    assert refused("bin::not_binary") == (
        "bin::not_binary: the prebuilt kernel scale_kernel of binary_scale.cu: "
        f"{library.kernel_dir}/binary_scale.cu is not a cubin, fatbin or PTX file (it starts with neither an ELF "
        "header, the fatbin magic nor a PTX .version directive)"
    )


def test_verify_checks_each_binary_for_the_architectures_it_holds(library):
    """opforge verify without a GPU: a binary's checks pass or fail where its file has code for the
    architecture, and are skipped, naming what it holds, where it has none."""
    from opforge.verify import verify_op

    def checks(op: str) -> list[tuple[str, str, str]]:
        report = verify_op(op, device="cpu", seed=0)
        return [(r.repro["arch"], r.status, r.message) for r in report.results if r.check == "binary"]

    assert checks("bin::cute_scale") == [
        ("sm_90", "pass", ""),
        (
            "sm_80",
            "skip",
            "OpforgeError: bin::cute_scale: the prebuilt kernel kernel_cutlass_scale_kernel_ptrf32gmem_ptrf32gmem___0 "
            f"of cute_scale.cubin: the file holds sm_90 code and no code that runs on sm_80 {RULE}",
        ),
    ]
    (sm90, sm80) = checks("bin::int_n")
    assert sm90 == ("sm_90", "FAIL", f"OpforgeError: {refused('bin::int_n')}")
    assert sm80[1] == "skip"


class Scales(torch.nn.Module):
    """Three prebuilt kernels in a row: nvcc's cubin and PTX, then CuTe DSL's cubin."""

    def forward(self, x):
        return torch.ops.bin.cute_scale(torch.ops.bin.scale_ptx(torch.ops.bin.scale(x, 3.0), 0.5)) + 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_package_carries_the_binaries_to_the_cpp_runner(library, device, tmp_path):
    """An AOTInductor package of prebuilt-kernel ops: the binaries travel in its kernel folder as
    files, nothing is compiled for it, and the C++ runner (no Python) runs it for sizes the export
    did not see, on the CPU (the references) and on a GPU (the binaries)."""
    model = Scales()
    n = torch.export.Dim("n", min=2, max=1 << 20)
    program = torch.export.export(model, (torch.randn(300, device=device),), dynamic_shapes=({0: n},))
    package = aoti.package(program, tmp_path / "package", archs=["sm_90"])
    kernels = package.parent / "libbinary_ops.kernels"
    for name in ("binary_scale.cubin", "binary_scale.ptx", "cute_scale.cubin"):
        assert (kernels / name).is_file() and not (kernels / name).is_symlink()
    assert not list(kernels.glob("cache/*.bin"))
    for size in (5, 4099):
        x = torch.randn(size, device=device)
        torch.testing.assert_close(aoti.run(package, [x], device=device).outputs[0], model(x).cpu())


def _jax_devices(platform: str) -> list:
    """JAX's devices of `platform` ("cpu", "gpu"); none where JAX is missing or has none."""
    try:
        import jax
    except ImportError:
        return []
    try:
        return jax.devices(platform)
    except RuntimeError:
        return []


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_jax_runs_the_prebuilt_kernels(library, platform):
    """The library under jax.jit through XLA's FFI: the references on the CPU, the binaries on a GPU."""
    devices = _jax_devices(platform)
    if not devices:
        pytest.skip(f"needs jax with a {platform} device; none here")
    import jax
    import jax.numpy as jnp

    import opforge.jax as ojax

    ojax.load_library(library.path)
    x = jax.device_put(jnp.linspace(-3.0, 3.0, 4099, dtype=jnp.float32), devices[0])
    f = jax.jit(lambda x: ojax.ops.bin.cute_scale(ojax.ops.bin.scale_ptx(ojax.ops.bin.scale(x, 3.0), 0.5)))
    assert jnp.allclose(f(x), 3.0 * x, rtol=1e-6)


def test_the_document_quotes_what_the_tests_build_and_print(library):
    """docs/prebuilt_kernels.md: its C++ block quotes the fixture (its lines appear there in order),
    its commands are the builds above, its message is the one precompile prints."""
    found = {b.lang: b for b in blocks(DOC.read_text())}
    assert sorted(found) == ["cpp", "sh", "text"]
    named, *quoted = found["cpp"].lines
    source = iter((ROOT / named.removeprefix("// ")).read_text().splitlines())
    assert all(any(line == have for have in source) for line in quoted)
    assert found["sh"].lines == [
        f"nvcc --{kind} {target} -o binary_scale.{kind} binary_scale.cu" for kind, target in NVCC_BUILDS
    ]
    assert found["text"].text.rstrip("\n") == refused("bin::int_n")


# ---- on a GPU ---------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("op", ["scale", "scale_fatbin", "scale_ptx", "scale_grid", "scale_mangled", "cute_scale"])
def test_the_kernels_match_the_reference_on_cuda(library, op):
    fn = getattr(torch.ops.bin, op)
    for n in (1, 255, 256, 1000, 100_003):
        x = torch.randn(n, device="cuda")
        torch.testing.assert_close(fn(x, 0.5), fn(x.cpu(), 0.5).cuda())
    x = torch.randn(64, device="cuda")[1:]  # an offset pointer
    torch.testing.assert_close(fn(x, 3.0), 3 * x)


@requires_cuda
def test_a_kernel_per_dtype_and_rows_on_cuda(library):
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(4097, device="cuda", dtype=dtype)
        torch.testing.assert_close(torch.ops.bin.scale_typed(x, 1.5), 1.5 * x)
    for shape in ((1, 1), (5, 33), (64, 1024), (3, 5000)):
        x = torch.randn(shape, device="cuda")
        torch.testing.assert_close(torch.ops.bin.row_sum(x), x.sum(1), atol=1e-4, rtol=1e-5)


@requires_cuda
def test_the_driver_refuses_what_the_binary_records(library):
    """A kernel's failure in a call reaches Python as torch's RuntimeError, naming the op and device."""
    x = torch.randn(8, device="cuda")
    with pytest.raises(RuntimeError) as err:
        torch.ops.bin.int_n(x)
    assert (
        "bin::int_n (cuda:0 kernel): the prebuilt kernel scale_int_n of binary_scale.cubin has parameters of 8, 8, "
        f"4, 8 bytes (as the driver reads them) but is passed {PASSED}; {NOTE}\n"
        "  parameter 3 (launch value n): expected int64_t (8 bytes), found a parameter of 4 bytes"
    ) in str(err.value)
    major, minor = torch.cuda.get_device_capability()
    if major != 8:
        with pytest.raises(RuntimeError) as err:
            torch.ops.bin.sm80_only(x)
        assert (
            "bin::sm80_only (cuda:0 kernel): the prebuilt kernel scale_kernel of binary_scale_sm80.cubin: the file "
            f"holds sm_80 code and no code that runs on sm_{major}{minor} {RULE}"
        ) in str(err.value)
    with pytest.raises(RuntimeError) as err:
        torch.ops.bin.no_symbol(x)
    assert (
        "bin::no_symbol (cuda:0 kernel): the prebuilt kernel scale of binary_scale.cubin: its sm_90 code has no "
        "kernel named scale (its kernels: _Z13scale_doublesPKdPdld,"
    ) in str(err.value)


@requires_cuda
def test_compile_and_cuda_graphs(library):
    def f(x):
        return torch.ops.bin.cute_scale(torch.ops.bin.scale_ptx(x, 3.0), 0.5) + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (300, 700, 1200):
            x = torch.randn(n, device="cuda")
            torch.testing.assert_close(compiled(x), f(x))
    x = torch.randn(5000, device="cuda")
    want = f(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        f(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(x)
    graph.replay()
    torch.testing.assert_close(out, want)


@requires_cuda
def test_a_replaced_binary_runs_after_reload(library, binaries, tmp_path):
    x = torch.randn(100, device="cuda")
    torch.testing.assert_close(torch.ops.bin.scale(x, 2.0), 2 * x)
    saved = (binaries / "binary_scale.cubin").read_bytes()
    (edited,) = [p for p in compile_binaries(tmp_path, "-DOFFSET=1") if p.suffix == ".cubin"]
    (binaries / "binary_scale.cubin").write_bytes(edited.read_bytes())
    try:
        opforge.reload()
        torch.testing.assert_close(torch.ops.bin.scale(x, 2.0), 2 * x + 1)
    finally:
        (binaries / "binary_scale.cubin").write_bytes(saved)
        opforge.reload()
    torch.testing.assert_close(torch.ops.bin.scale(x, 2.0), 2 * x)
