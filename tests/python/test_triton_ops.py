"""Ops whose device kernels are Triton functions (Note [Triton kernels] in opforge/op_launch.h):
the description says so, the CPU runs the reference, the worker compiles every variant for sm_90
and sm_80 without a GPU (precompile with a call's shapes) into the kernel cache, a compile holds
no GIL, binding errors name the op, the file, the function and the parameter; on a GPU the
kernels run from C++ and match the reference, autotune picks a config, torch.compile and CUDA
graphs work, and an edited kernel file runs after opforge.reload()."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import venv

import pytest
import torch

import opforge
from conftest import requires_cuda
from opforge import verify

# Each test here compiles Triton kernels into, and finds them in, an empty kernel cache of its own.
pytestmark = pytest.mark.usefixtures("private_kernel_cache")

pytest.importorskip("triton", reason="Triton is not installed in this Python")


def test_the_description_names_the_triton_kernels(triton_ops):
    kernels = {op.name: op.runtime_kernels for op in triton_ops.ops}
    assert [(k.source, k.name, k.backend) for k in kernels["tt::add"]] == [("triton_add.py", "add_kernel", "triton")]
    assert [k.backend for k in kernels["tt::scale"]] == ["triton"]


def test_the_cpu_runs_the_reference(triton_ops):
    x, y = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)
    z = torch.randn(7, 33)
    torch.testing.assert_close(torch.ops.tt.softmax(z), torch.softmax(z, -1))


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_precompile_builds_both_variants_without_a_gpu(triton_ops, tmp_path, arch):
    cache = tmp_path / "cache"
    shapes = {"x": (3000,), "y": (3000,)}
    assert not opforge.precompile("tt::add", {"x": torch.float16}, arch=arch, cache_dir=cache, shapes=shapes)
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 3  # the description, the call's variant and the general one
    assert opforge.precompile("tt::add", {"x": torch.float16}, arch=arch, cache_dir=cache, shapes=shapes)
    assert sorted(p.name for p in cache.iterdir()) == entries


def test_an_autotuned_kernel_compiles_every_config(triton_ops, tmp_path):
    cache = tmp_path / "cache"
    assert not opforge.precompile("tt::scale", {"x": torch.float32}, cache_dir=cache, shapes={"x": (4096,)})
    assert len(list(cache.iterdir())) == 1 + 2 * 2  # the description; two configs, each specialised and general


def test_a_parameter_without_a_value_is_named(triton_ops, tmp_path):
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("tt::unbound", {"x": torch.float32}, cache_dir=tmp_path, shapes={"x": (64,)})
    assert str(err.value) == (
        "tt::unbound: the Triton function unbound_kernel of triton_add.py: parameter 'mystery' gets no "
        "value: name a tensor or parameter of the op after it (ignoring case and _ptr), or set it in the grid "
        "function (TritonLaunch::set); see Note [Triton kernels]"
    )


def test_without_python_a_missing_kernel_is_named(triton_ops, tmp_path, monkeypatch):
    monkeypatch.delenv("OPFORGE_TRITON_PYTHON")
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("tt::add", {"x": torch.float32}, cache_dir=tmp_path, shapes={"x": (8,), "y": (8,)})
    assert "this process cannot compile Triton kernels (OPFORGE_TRITON_PYTHON is unset" in str(err.value)
    assert str(err.value).startswith("tt::add: the Triton function add_kernel of triton_add.py")


def test_a_compile_holds_no_gil(triton_ops, tmp_path):
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


def test_workers_stay_up_between_compiles(triton_ops, tmp_path, monkeypatch):
    """The op library keeps its Triton workers for the process's next compiles (Triton and the
    kernel file import once), runs a request's variants in up to two workers here (one per core),
    and starts new ones once the environment they were started in has changed (variables other
    than opforge's own: each test here has a kernel cache of its own)."""
    starts = tmp_path / "starts"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho started >> "{starts}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("OPFORGE_TRITON_PYTHON", str(python))

    def compile_rows(rows: int) -> None:
        shapes = {"x": (rows, 100)}
        assert not opforge.precompile("tt::softmax", {"x": torch.float32}, cache_dir=tmp_path, shapes=shapes)

    compile_rows(3)  # the variant and the general one side by side
    workers = min(2, os.cpu_count() or 1)
    assert starts.read_text().count("started") == workers
    compile_rows(16)  # another variant (rows divisible by 16), the same workers
    assert starts.read_text().count("started") == workers
    monkeypatch.setenv("TRITON_OPFORGE_TEST_MARK", "changed")
    compile_rows(1)  # n_rows == 1, the general variant cached: one compile, in a worker of the new environment
    assert starts.read_text().count("started") == workers + 1


def test_verify_draws_few_random_sizes_for_a_triton_op_on_a_device(triton_ops):
    """Each new size of a Triton op can be a Triton compile of its own: on a device its cases
    draw RANDOM_CASES random sizes, as on the CPU, not DEVICE_RANDOM_CASES; its fixed sizes,
    those of the device included, stay."""
    from opforge.verify import cases as vcases

    op = opforge.find_op("tt::softmax")
    dtypes = vcases.dtype_cases(op, ["float32"], "cuda")[0].dtypes
    labels = [c.label for c in vcases.generate_cases(op, dtypes, seed=0, device="cuda")]
    assert len([label for label in labels if label.startswith("random ")]) == vcases.RANDOM_CASES
    assert vcases.RANDOM_CASES < vcases.DEVICE_RANDOM_CASES
    assert {f"shape {lead}x{last}" for lead, last in vcases.DEVICE_SHAPES} <= set(labels)


def test_a_syntax_error_names_the_file_and_line(triton_broken_ops, tmp_path):
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("ttbroken::syntax", {"x": torch.float32}, cache_dir=tmp_path, shapes={"x": (64,)})
    assert str(err.value) == (
        "ttbroken::syntax: the Triton function copy_kernel of triton_syntax_error.py: "
        f"{triton_broken_ops.kernel_dir / 'triton_syntax_error.py'}:11: SyntaxError: unmatched ')'\n"
        "    mask = tl.arange(0, BLOCK_SIZE) < n_elements)"
    )


def test_a_compile_failure_shows_triton_s_message_with_the_op_the_variant_and_the_file(triton_broken_ops, tmp_path):
    shapes = {"x": (64,)}
    assert not opforge.precompile("ttbroken::no_half", {"x": torch.float32}, cache_dir=tmp_path, shapes=shapes)
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("ttbroken::no_half", {"x": torch.float16}, cache_dir=tmp_path, shapes=shapes)
    lines = str(err.value).splitlines()
    assert lines[:2] == [
        "ttbroken::no_half: the Triton function no_half_kernel of triton_broken.py: Triton failed to compile the "
        "variant (x_ptr: *fp16 (divisible by 16), y_ptr: *fp16 (divisible by 16), n_elements: i32 (divisible by 16), "
        "BLOCK_SIZE: constexpr = 1024; num_warps 4, num_stages 3) for sm_90:",
        f"{triton_broken_ops.kernel_dir / 'triton_broken.py'}:10: CompileTimeAssertionFailure: "
        "no_half_kernel takes no float16",
    ]


def test_without_triton_the_op_and_kernel_are_named_and_the_cpu_path_works(triton_ops, tmp_path):
    """A Python without Triton as the worker's (OPFORGE_TRITON_PYTHON, in a process of its own): a
    compile names the op and the kernel, CPU calls run the reference, and on a GPU a CUDA call
    fails with the same message."""
    venv.create(tmp_path / "venv", with_pip=False)  # no site-packages of this Python's: no Triton
    python = tmp_path / "venv" / "bin" / "python"
    assert subprocess.run([python, "-c", "import triton"], capture_output=True).returncode != 0
    script = f"""
import torch, opforge
opforge.load_library({str(triton_ops.path)!r})
x, y = torch.randn(100), torch.randn(100)
torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)
try:
    opforge.precompile("tt::add", {{"x": torch.float32}}, shapes={{"x": (100,), "y": (100,)}})
except opforge.OpforgeError as e:
    print(e)
if torch.cuda.is_available():
    try:
        torch.ops.tt.add(x.cuda(), y.cuda())
    except Exception as e:
        print(str(e).splitlines()[0])
torch.testing.assert_close(torch.ops.tt.softmax(x), torch.softmax(x, -1))
print("the CPU ran")
"""
    env = {**os.environ, "OPFORGE_TRITON_PYTHON": str(python), "OPFORGE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    message = (
        f"tt::add: the Triton function add_kernel of triton_add.py: Triton is not installed in {python}: "
        "No module named 'triton'"
    )
    lines = proc.stdout.splitlines()
    assert lines[0] == message and lines[-1] == "the CPU ran"
    assert len(lines) == (3 if torch.cuda.is_available() else 2), lines
    if torch.cuda.is_available():  # the call's error, as the torch adapter raises it, naming the kernel's device
        assert lines[1] == message.replace("tt::add:", "tt::add (cuda:0 kernel):", 1)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_kernels_match_the_reference_on_cuda(triton_ops, dtype):
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
def test_a_kernel_computing_in_place_gets_a_copy_of_its_input(triton_ops):
    x = torch.randn(1000, device="cuda")
    before = x.clone()
    torch.testing.assert_close(torch.ops.tt.double_through_a_copy(x), 2 * before)
    torch.testing.assert_close(x, before)  # the input is not written


@requires_cuda
def test_autotune_picks_a_config_and_keeps_it(triton_ops):
    for n in (100, 100_000):
        x = torch.randn(n, device="cuda")
        torch.testing.assert_close(torch.ops.tt.scale(x, 3.0), 3 * x)
        torch.testing.assert_close(torch.ops.tt.scale(x, 0.5), 0.5 * x)  # the choice is kept per key


@requires_cuda
def test_compile_and_cuda_graphs(triton_ops):
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
def test_an_edited_kernel_runs_after_reload(triton_ops, triton_kernel_file):
    x, y = torch.randn(100, device="cuda"), torch.randn(100, device="cuda")
    torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)
    text = triton_kernel_file.read_text()
    triton_kernel_file.write_text(text.replace("output = x + y", "output = x + y + 1"))
    try:
        opforge.reload()
        torch.testing.assert_close(torch.ops.tt.add(x, y), x + y + 1)
    finally:
        triton_kernel_file.write_text(text)
        opforge.reload()
    torch.testing.assert_close(torch.ops.tt.add(x, y), x + y)


def test_an_op_without_a_reference_refuses_the_cpu_and_verifies_against_its_equivalent(triton_ops):
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
