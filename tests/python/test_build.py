"""Building op libraries from Python, and what loading reports about bad ones."""

from __future__ import annotations

import multiprocessing
import os
import re
import textwrap
from pathlib import Path

import pytest
import torch

import opforge
from spawned_builds import build_when_all_are_ready

OP_FILE = """
#include <opforge/op.h>

static void {name}_cpu(opforge::Tensor x, int64_t k, opforge::MutableTensor y) {{
  OPFORGE_CHECK(k != 13, "k = ", k, " is unlucky");
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = x.data<float>()[i] * static_cast<float>(k);
}}

OPFORGE_OP(built, {name})
    .doc("y = x * k")
    .input("x", opforge::kFloat32)
    .param<int64_t>("k", 2, opforge::in_range(0, 100))
    .output("y", opforge::like("x"))
    .reference({name}_cpu);
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.cpp"
    path.write_text(textwrap.dedent(text))
    return path


def test_build_load_and_call(tmp_path):
    src = _write(tmp_path, "scale", OP_FILE.format(name="scale"))
    lib_path = opforge.build_library("scale_ops", [src], build_dir=tmp_path / "build")
    lib = opforge.load_library(lib_path)
    assert lib.op_names == ["built::scale"]
    assert lib.ops[0].schema == "built::scale(Tensor x, int k=2) -> Tensor"
    assert lib.ops[0].file == str(src)
    x = torch.randn(5)
    torch.testing.assert_close(torch.ops.built.scale(x, 3), x * 3)
    assert opforge.load_library(lib_path) is lib  # loading again is a no-op
    with pytest.raises(ValueError, match="^built::scale: k = 13 is unlucky$"):  # OPFORGE_CHECK in a kernel
        torch.ops.built.scale(x, 13)

    # Another library declaring the same op is refused, naming both declarations.
    other = tmp_path / "other"
    other.mkdir()
    src2 = _write(other, "scale", OP_FILE.format(name="scale"))
    lib2 = opforge.build_library("scale_again", [src2], build_dir=other / "build")
    with pytest.raises(ValueError) as err:
        opforge.load_library(lib2)
    assert str(err.value).splitlines() == [
        f"opforge: {lib2} has invalid op declarations:",
        f"{src2}:9: built::scale: already loaded from {lib_path} (declared at {src}:9)",
    ]


def test_invalid_declaration_is_reported_with_file_and_line(tmp_path):
    src = _write(
        tmp_path,
        "bad",
        """
        #include <opforge/op.h>
        static void ref(opforge::Tensor x, opforge::MutableTensor y) {}
        OPFORGE_OP(built, bad)
            .input("x", opforge::floating)
            .output("y", opforge::like("z"))
            .reference(ref);
        """,
    )
    lib_path = opforge.build_library("bad_ops", [src], build_dir=tmp_path / "build")
    with pytest.raises(ValueError) as err:
        opforge.load_library(lib_path)
    assert str(err.value).splitlines()[1:] == [
        f"{src}:4: built::bad: output 'y': like(): \"z\" names no tensor input (tensor inputs: x)",
    ]
    assert not hasattr(torch.ops.built, "bad")


def test_compile_error_names_file_and_line(tmp_path):
    src = _write(
        tmp_path,
        "typo",
        """
        #include <opforge/op.h>
        static void ref(opforge::Tensor x, double k, opforge::MutableTensor y) {}
        OPFORGE_OP(built, typo)
            .input("x", opforge::floating)
            .param<int64_t>("k")
            .output("y", opforge::like("x"))
            .reference(ref);
        """,
    )
    with pytest.raises(opforge.BuildError) as err:
        opforge.build_library("typo_ops", [src], build_dir=tmp_path / "build")
    message = str(err.value)
    assert "opforge: a kernel must be `void fn([const opforge::Context&,] args...)`" in message
    assert f"{src}:8" in message  # the .reference() line


def test_not_an_op_library():
    from opforge._adapter import adapter_path

    with pytest.raises(ValueError, match="is not an opforge op library"):
        opforge.load_library(adapter_path())


def test_missing_file(tmp_path):
    with pytest.raises(opforge.OpforgeError, match="cannot open .*nothing.so: No such file or directory"):
        opforge.load_library(tmp_path / "nothing.so")


def test_an_op_folder_builds_against_the_prebuilt_runtime(tmp_path):
    # The op folder layout: op files beside kernels/*.cu; the runtime is linked, not compiled.
    folder = tmp_path / "twice"
    (folder / "kernels").mkdir(parents=True)
    _write(
        folder,
        "twice",
        OP_FILE.format(name="twice").replace(
            ".reference(twice_cpu);",
            """.reference(twice_cpu)
    .cuda_source("twice.cu", "twice")
    .launch(opforge::elementwise("y"));""",
        ),
    )
    (folder / "kernels" / "twice.cu").write_text("// never compiled on a machine without a GPU\n")
    lib_path = opforge.build_library("twice_ops", folder=folder, build_dir=tmp_path / "build")
    lib = opforge.load_library(lib_path)
    assert lib.op_names == ["built::twice"]
    assert (lib_path.parent / "libtwice_ops.kernels" / "twice.cu").exists()
    x = torch.randn(4)
    torch.testing.assert_close(torch.ops.built.twice(x, 2), x * 2)
    compiled = {p.name for p in (tmp_path / "build" / "out").rglob("*.o")}
    assert compiled == {"twice.cpp.o"}, "the op-library runtime is linked from opforge's build, not rebuilt"


def test_an_op_file_compiles_again_after_opforge_s_headers_change(tmp_path):
    """An op file compiled with opforge's precompiled header is compiled again once that header
    is newer than its object (opforge's headers changed and the header was rebuilt): linking an
    object of the old struct layouts against the new runtime corrupts the heap at load time."""
    from opforge import _paths

    runtime = _paths.runtime_dir()
    pch = runtime / "pch" / "opforge" / "op.h.gch" if runtime else None
    if pch is None or not pch.exists():
        pytest.skip("no precompiled op.h in this build (a compiler other than GCC, or no prebuilt runtime)")
    src = _write(tmp_path, "thrice", OP_FILE.format(name="thrice"))
    build = tmp_path / "build"
    opforge.build_library("thrice_ops", [src], build_dir=build)
    (obj,) = (build / "out").rglob("thrice.cpp.o")
    before = pch.stat().st_mtime - 3600  # as if compiled an hour before the header was rebuilt
    os.utime(src, (before - 60, before - 60))  # and the op file older still
    os.utime(obj, (before, before))
    opforge.build_library("thrice_ops", [src], build_dir=build)
    assert obj.stat().st_mtime > before, "the op file's object was kept although the precompiled header is newer"


def _cmake_error(output: str) -> str:
    """The text of the first ``message(FATAL_ERROR ...)`` in CMake's output, its lines (which
    CMake wraps and indents) joined again."""
    lines = output[output.index("CMake Error at ") :].splitlines()[1:]
    return " ".join(line.strip() for line in lines[: lines.index("")])


def test_files_that_declare_no_op_fail_the_build_naming_them(tmp_path):
    helper = _write(tmp_path, "helper", "#include <opforge/op.h>\nint helper() { return 1; }\n")
    empty = _write(tmp_path, "empty", "// an op file whose declaration was left out\n")
    with pytest.raises(opforge.BuildError) as err:
        opforge.build_library("no_ops", [helper, empty], build_dir=tmp_path / "build")
    assert _cmake_error(str(err.value)) == (
        f"opforge_add_library(no_ops): no OPFORGE_OP or OPFORGE_CLASS declaration in {helper}, {empty}; "
        "an op library declares at least one op (see opforge/op.h)"
    )
    assert not (tmp_path / "build" / "libno_ops.so").exists()  # nothing left that would fail to load
    with pytest.raises(opforge.BuildError, match=re.escape("no OPFORGE_OP or OPFORGE_CLASS declaration")):
        opforge.build_library("no_ops", [helper, empty], build_dir=tmp_path / "build")  # and again


def test_processes_building_one_library_into_one_folder_take_turns(tmp_path):
    """torchrun ranks and pytest-xdist workers build the same library into the same folder at
    once: each gets the library (one builds it, the others find it built), none a CMake error."""
    src = _write(tmp_path, "shared", OP_FILE.format(name="shared"))
    ctx = multiprocessing.get_context("spawn")
    world = 4
    barrier, results = ctx.Barrier(world), ctx.Queue()
    procs = [
        ctx.Process(target=build_when_all_are_ready, args=(barrier, src, tmp_path / "build", results))
        for _ in range(world)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert got == [str((tmp_path / "build" / "libshared_ops.so").resolve())] * world, "\n".join(got)
    assert [p.exitcode for p in procs] == [0] * world
    assert opforge.load_library(got[0]).op_names == ["built::shared"]
