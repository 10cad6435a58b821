"""The product's remaining messages, each pinned with its exact text: loading faults, the core's
request errors, building, artifacts that are not built, the runner's inputs, and a kernel name that
names no kernel. (Call checks, declarations and kernels' own messages are pinned beside the
features they belong to.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opforge
import opforge.aoti
from conftest import run_runner
from opforge import _core

ROOT = Path(__file__).resolve().parents[2]


def test_core_requests_that_are_not_valid():
    core = _core._core()
    with pytest.raises(ValueError) as err:
        _core.call(core.opforge_core_example_shapes, "{not json")
    assert str(err.value).startswith("opforge: the request is not valid JSON: [json.exception.parse_error.101]")
    with pytest.raises(ValueError) as err:
        _core.call(core.opforge_core_example_shapes, json.dumps({"lead": 3}))
    assert str(err.value) == 'opforge: the request names no op ("op": "ns::name")'
    with pytest.raises(ValueError) as err:
        opforge.precompile("examples::softshrink", {"x": torch.complex64})
    assert str(err.value) == (
        "examples::softshrink(Tensor x, float lambd=0.5) -> Tensor: invalid arguments\n"
        '  x: expected a dtype opforge knows, got "complex64"'
    )


def test_a_file_that_is_no_shared_object(tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an ELF file".ljust(4096, b"\0"))
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.load_library(junk)
    assert str(err.value) == f"opforge: cannot load the op library {junk}: {junk}: invalid ELF header"


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_a_truncated_op_library_is_refused_not_a_crash(tmp_path, keep):
    """The dynamic loader maps a file by its ELF headers' sizes; a truncated one killed the process
    with SIGBUS. Run in a child process, so that a crash fails this test and not the session."""
    whole = Path(opforge.example_library("softshrink")).read_bytes()
    cut = tmp_path / "libsoftshrink.so"
    cut.write_bytes(whole[: int(len(whole) * keep)])
    code = "import opforge, sys\ntry:\n    opforge.load_library(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code, str(cut)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"opforge: the op library {cut} is truncated: its ELF headers describe {len(whole)} bytes and the file has "
        f"{cut.stat().st_size} (build or copy it again)"
    )


def test_a_library_built_for_another_abi(tmp_path):
    src = tmp_path / "old_abi.c"
    src.write_text(
        textwrap.dedent("""
        #include "opforge/c_api.h"
        static const OpforgeLibrary lib = {sizeof(OpforgeLibrary), 2, 0, 0, 0, 0, 0};
        const OpforgeLibrary* opforge_library_v1(void) { return &lib; }
        """)
    )
    so = tmp_path / "libold_abi.so"
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{ROOT / 'include'}", str(src), "-o", str(so)], check=True)
    with pytest.raises(ValueError) as err:
        opforge.load_library(so)
    abi = re.search(r"#define OPFORGE_ABI_VERSION (\d+)", (ROOT / "include/opforge/c_api.h").read_text())[1]
    assert str(err.value) == (
        f"opforge: {so} was built for opforge ABI version 2, and this opforge reads version {abi}: "
        "rebuild the op library"
    )


def test_an_op_torch_already_has(tmp_path):
    src = tmp_path / "taken.cpp"
    src.write_text(
        textwrap.dedent("""
        #include <opforge/op.h>
        static void ref(opforge::Tensor x, opforge::MutableTensor y) {}
        OPFORGE_OP(taken, op).input("x", opforge::floating).output("y", opforge::like("x")).reference(ref);
        """)
    )
    path = opforge.build_library("taken_ops", [src], build_dir=tmp_path / "build")
    lib = torch.library.Library("taken", "DEF")  # noqa: F841 -- registered while it lives
    lib.define("op(Tensor x) -> Tensor")
    with pytest.raises(ValueError) as err:
        opforge.load_library(path)
    assert str(err.value) == (
        f"opforge: {path.resolve()} cannot be registered with torch:\n"
        f"{src}:4: taken::op: already registered with torch by other code"
    )


def test_build_arguments(tmp_path):
    with pytest.raises(ValueError) as err:
        opforge.build_library("my-ops", [tmp_path / "a.cpp"])
    assert str(err.value) == "opforge.build_library: name must be an identifier, got 'my-ops'"
    with pytest.raises(ValueError) as err:
        opforge.build_library("ops", [])
    assert str(err.value) == "opforge.build_library: give either sources (op files) or folder (an op folder)"
    with pytest.raises(ValueError) as err:
        opforge.build_library("ops", [tmp_path / "a.cpp"], folder=tmp_path)
    assert str(err.value) == "opforge.build_library: give either sources (op files) or folder (an op folder)"
    with pytest.raises(ValueError) as err:
        opforge.build_library("ops", folder=tmp_path / "nowhere")
    assert str(err.value) == f"opforge.build_library: {tmp_path / 'nowhere'} is not a folder"
    with pytest.raises(ValueError) as err:
        opforge.build_library("ops", [tmp_path / "a.cpp"])
    assert str(err.value) == f"opforge.build_library: missing source files: {tmp_path / 'a.cpp'}"


def test_artifacts_that_are_not_built(tmp_path):
    script = textwrap.dedent("""
        import torch, opforge, opforge.aoti
        from opforge import _core
        for call in (lambda: opforge.load_library("x.so"), lambda: _core.load_library("x.so"),
                     lambda: opforge.aoti.run("m.pt2", [])):
            try:
                call()
            except opforge.OpforgeError as e:
                print(e)
        """)
    env = {**os.environ, "OPFORGE_BUILD_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert proc.stdout.splitlines() == [
        f"opforge: the torch adapter {tmp_path}/lib/libopforge_torch.so is not built; run `make build`",
        f"opforge: {tmp_path}/lib/libopforge_core.so is not built; run `make build`",
        f"opforge: the C++ runner {tmp_path}/bin/opforge-runner is not built; run `make build`",
    ]


@pytest.mark.parametrize(
    "inputs, why",
    [
        ({"x": 1}, "expected a tensor or a list of tensors (saved with torch.save)"),
        ([torch.ones(2), 3], "expected a list of tensors"),
    ],
)
def test_runner_inputs_that_are_not_tensors(tmp_path, inputs, why):
    (tmp_path / "model.pt2").write_bytes(b"never read: the inputs are checked first")
    (tmp_path / "opforge_ops.txt").write_text("# op library for each custom op of model.pt2\n")
    torch.save(inputs, tmp_path / "in.pt")
    proc = run_runner(tmp_path / "model.pt2", tmp_path / "in.pt", tmp_path / "out.pt")
    assert proc.returncode == 2
    assert proc.stderr == f"opforge-runner: {tmp_path / 'in.pt'}: {why}\n"


def test_a_kernel_name_nvrtc_cannot_find(tmp_path):
    src, kernel = tmp_path / "named.cpp", tmp_path / "named.cu"
    src.write_text(
        textwrap.dedent("""
        #include <opforge/op.h>
        static void ref(opforge::Tensor x, opforge::MutableTensor y) {}
        OPFORGE_OP(named, op)
            .input("x", opforge::kFloat32)
            .output("y", opforge::like("x"))
            .reference(ref)
            .cuda_source("named.cu", "helper")
            .launch(opforge::elementwise("y"));
        """)
    )
    kernel.write_text(
        "__device__ float helper(float v) { return v; }\n"
        "__global__ void named(const float* x, float* y, long long n) {}\n"
    )
    opforge.load_library(opforge.build_library("named_ops", [src], kernels=[kernel], build_dir=tmp_path / "build"))
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile("named::op", {"x": torch.float32}, cache_dir=tmp_path / "c")
    lines = str(err.value).splitlines()  # NVRTC refuses the name expression, in its own words
    assert lines[:2] == [
        f"named::op: compiling helper from {kernel} for sm_90a failed:",
        "__nv_name_map(2): error: Name expression cannot form address of a non-__global__ function. "
        'Input name expression was: " helper"',
    ]


def test_an_adapter_built_for_another_torch(tmp_path):
    # The adapter of this checkout, stamped as built for another torch release.
    (tmp_path / "lib").mkdir()
    real = opforge.build_dir() / "lib" / "libopforge_torch.so"
    (tmp_path / "lib" / "libopforge_torch.so").symlink_to(real)
    (tmp_path / "lib" / "libopforge_torch.torch-version").write_text("9.9.9\n")
    script = f"import opforge; opforge.load_library({str(opforge.example_library('softshrink'))!r})"
    env = {**os.environ, "OPFORGE_BUILD_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"opforge._core.OpforgeError: opforge: the torch adapter {tmp_path / 'lib' / 'libopforge_torch.so'} was "
        f"built for torch 9.9.9, but this is torch {torch.__version__}; rebuild it (`make build`, with this Python "
        "as OPFORGE_PYTHON)"
    )


def test_an_adapter_build_that_fails(tmp_path, monkeypatch):
    # An installed opforge (a package folder with a CMake package) whose adapter sources break.
    from opforge import _adapter, _paths

    package = tmp_path / "opforge"
    (package / "cmake").mkdir(parents=True)
    (package / "cmake" / "opforge-config.cmake").write_text("")
    (package / "_src" / "src" / "torch").mkdir(parents=True)
    (package / "_src" / "src" / "torch" / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.28)\nproject(broken NONE)\nmessage(FATAL_ERROR "broken on purpose")\n'
    )
    monkeypatch.setattr(_paths, "PACKAGE", package)
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    _adapter.build_folder.cache_clear()
    try:
        folder = _adapter.build_folder()
        with pytest.raises(opforge.BuildError) as err:
            _adapter.adapter_path()
    finally:
        _adapter.build_folder.cache_clear()
    first, *rest = str(err.value).splitlines()
    assert first == (
        f"opforge: building the PyTorch adapter for torch {torch.__version__} failed (remove {folder} to start over):"
    )
    assert any("broken on purpose" in line for line in rest)


def test_stubs_for_a_namespace_no_module_can_carry(example_ops):
    from dataclasses import replace

    from opforge.stubs import write_stubs

    lib = example_ops["softshrink"]
    renamed = replace(lib, ops=(replace(lib.ops[0], name="lambda::softshrink"),))
    with pytest.raises(ValueError, match=r"^opforge stubs: namespace 'lambda' cannot be a Python module name$"):
        write_stubs(renamed, "unused")


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch warns of a missing CUDA runtime only where there is none")
def test_no_warning_of_a_missing_cuda_runtime():
    script = "import {} torch.utils.cpp_extension"
    runs = {
        first: subprocess.run([sys.executable, "-c", script.format(first)], capture_output=True, text=True)
        for first in ("opforge, ", "")
    }
    assert "No CUDA runtime is found" in runs[""].stderr  # torch's own warning, without opforge
    assert "No CUDA runtime is found" not in runs["opforge, "].stderr
