"""Ops whose device kernels are Triton functions (Note [Triton kernels] in opforge/op_launch.h):
the description says so, the CPU runs the reference, the worker compiles every variant for sm_90
and sm_80 without a GPU (precompile with a call's shapes) into the kernel cache, a compile holds
no GIL, binding errors name the op, the file, the function and the parameter; on a GPU the
kernels run from C++ and match the reference, autotune picks a config, torch.compile and CUDA
graphs work, and an edited kernel file runs after opforge.reload()."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

import opforge
from conftest import requires_cuda
from opforge import verify

pytest.importorskip("triton", reason="Triton is not installed in this Python")

FIXTURES = Path(__file__).resolve().parent / "fixtures"


KERNEL = FIXTURES / "kernels" / "triton_add.py"


@pytest.fixture(scope="module")
def kernel_file(tmp_path_factory) -> Path:
    """A copy of the fixture's kernel file, which the library's kernel folder links to: a test
    may edit it (and puts it back)."""
    copy = tmp_path_factory.mktemp("kernels") / "triton_add.py"
    shutil.copy(KERNEL, copy)
    return copy


@pytest.fixture(scope="module")
def library(tmp_path_factory, kernel_file):
    path = opforge.build_library(
        "triton_ops", [FIXTURES / "triton_ops.cpp"], kernels=[kernel_file], build_dir=tmp_path_factory.mktemp("build")
    )
    return opforge.load_library(path)


def test_the_description_names_the_triton_kernels(library):
    kernels = {op.name: op.runtime_kernels for op in library.ops}
    assert [(k.source, k.name, k.backend) for k in kernels["tt::add"]] == [("triton_add.py", "add_kernel", "triton")]
    assert [k.backend for k in kernels["tt::scale"]] == ["triton"]


def test_the_cpu_runs_the_reference(library):
    x, y = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)
    z = torch.randn(7, 33)
    torch.testing.assert_close(torch.ops.tt.softmax(z), torch.softmax(z, -1))


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_precompile_builds_both_variants_without_a_gpu(library, tmp_path, arch):
    cache = tmp_path / "cache"
    shapes = {"x": (3000,), "y": (3000,)}
    assert not opforge.precompile("tt::add", {"x": torch.float16}, arch=arch, cache_dir=cache, shapes=shapes)
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 3  # the description, the call's variant and the general one
    assert opforge.precompile("tt::add", {"x": torch.float16}, arch=arch, cache_dir=cache, shapes=shapes)
    assert sorted(p.name for p in cache.iterdir()) == entries


def test_an_autotuned_kernel_compiles_every_config(library, tmp_path):
    cache = tmp_path / "cache"
    assert not opforge.precompile("tt::scale", {"x": torch.float32}, cache_dir=cache, shapes={"x": (4096,)})
    assert len(list(cache.iterdir())) == 1 + 2 * 2  # the description; two configs, each specialised and general


def test_a_parameter_without_a_value_is_named(library, tmp_path):
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("tt::unbound", {"x": torch.float32}, cache_dir=tmp_path, shapes={"x": (64,)})
    assert str(err.value) == (
        "tt::unbound: the Triton function unbound_kernel of triton_add.py: parameter 'mystery' gets no "
        "value: name a tensor or parameter of the op after it (ignoring case and _ptr), or set it in the grid "
        "function (TritonLaunch::set); see Note [Triton kernels]"
    )


def test_without_python_a_missing_kernel_is_named(library, tmp_path, monkeypatch):
    monkeypatch.delenv("OPFORGE_TRITON_PYTHON")
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("tt::add", {"x": torch.float32}, cache_dir=tmp_path, shapes={"x": (8,), "y": (8,)})
    assert "this process cannot compile Triton kernels (OPFORGE_TRITON_PYTHON is unset" in str(err.value)
    assert str(err.value).startswith("tt::add: the Triton function add_kernel of triton_add.py")


def test_a_compile_holds_no_gil(library, tmp_path):
    """Other Python threads run while the worker compiles (ctypes releases the GIL, and the op
    library waits on a process, not on Python)."""
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        opforge.precompile("tt::softmax", {"x": torch.float32}, cache_dir=tmp_path, shapes={"x": (4, 100)})
    finally:
        done.set()
        counter.join()
    assert ticks > 50  # the compile takes seconds; a held GIL would allow a handful of ticks


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_kernels_match_the_reference_on_cuda(library, dtype):
    for n in (1, 16, 1000, 4097):  # an integer equal to 1, divisible by 16, neither
        x, y = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
        torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)
        x1 = x[1:]  # a pointer not 16-byte aligned: another variant
        torch.testing.assert_close(torch.ops.tt.add(x1, y[1:]), x1 + y[1:])
    for shape in ((1, 1), (5, 33), (64, 1024), (3, 5000)):
        z = torch.randn(shape, device="cuda", dtype=dtype)
        torch.testing.assert_close(
            torch.ops.tt.softmax(z), torch.softmax(z.float(), -1).to(dtype), atol=2e-3, rtol=2e-2
        )


@requires_cuda
def test_a_kernel_computing_in_place_gets_a_copy_of_its_input(library):
    x = torch.randn(1000, device="cuda")
    before = x.clone()
    torch.testing.assert_close(torch.ops.tt.double_through_a_copy(x), 2 * before)
    torch.testing.assert_close(x, before)  # the input is not written


@requires_cuda
def test_autotune_picks_a_config_and_keeps_it(library):
    for n in (100, 100_000):
        x = torch.randn(n, device="cuda")
        torch.testing.assert_close(torch.ops.tt.scale(x, 3.0), 3 * x)
        torch.testing.assert_close(torch.ops.tt.scale(x, 0.5), 0.5 * x)  # the choice is kept per key


@requires_cuda
def test_compile_and_cuda_graphs(library):
    def f(x, y):
        return torch.ops.tt.softmax(torch.ops.tt.add(x, y)) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for rows in (3, 7, 12):
            x, y = torch.randn(rows, 100, device="cuda"), torch.randn(rows, 100, device="cuda")
            torch.testing.assert_close(compiled(x, y), f(x, y))
    x, y = torch.randn(8, 100, device="cuda"), torch.randn(8, 100, device="cuda")
    want = f(x, y)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        f(x, y)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(x, y)
    graph.replay()
    torch.testing.assert_close(out, want)


@requires_cuda
def test_an_edited_kernel_runs_after_reload(library, kernel_file):
    x, y = torch.randn(100, device="cuda"), torch.randn(100, device="cuda")
    torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)
    text = kernel_file.read_text()
    kernel_file.write_text(text.replace("output = x + y", "output = x + y + 1"))
    try:
        opforge.reload()
        torch.testing.assert_close(torch.ops.tt.add(x, y), x + y + 1)
    finally:
        kernel_file.write_text(text)
        opforge.reload()
    torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)


def test_an_op_without_a_reference_refuses_the_cpu_and_verifies_against_its_equivalent(library):
    """Note [Equivalent-only ops]: no CPU kernel, a CPU call refused naming what the op lacks."""
    op = opforge.find_op("tt::add_without_reference")
    assert op.devices == ("cuda",)
    x = torch.randn(8)
    with pytest.raises(ValueError) as err:
        torch.ops.tt.add_without_reference(x, x)
    assert str(err.value) == (
        "tt::add_without_reference has no CPU kernel: it declares no .reference() (its device kernels are checked "
        "against its .equivalent() expression); call it with tensors on a device it has a kernel for"
    )
    report = verify.verify_op("tt::add_without_reference", device="cpu", seed=3)
    values = [r for r in report.results if r.check == "values"]
    assert values and all(r.status == "skip" for r in values)
    if torch.cuda.is_available():
        report = verify.verify_op("tt::add_without_reference", device="cuda", seed=3)
        assert report.ok, [(r.check, r.case, r.message) for r in report.failures]
        assert any(r.check == "values" and r.status == "pass" for r in report.results)
