"""``opforge new``: the op folder it writes builds and passes its own verify test as written, that
test catches a reference that no longer matches the description, and bad names are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opforge.__main__ import main
from opforge._build import built_libraries


def run_generated_test(folder: Path) -> subprocess.CompletedProcess:
    """pytest on the folder's test file, in a fresh interpreter (as the author runs it)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(next(folder.glob("test_*.py")))],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_new_folder_passes_verify_and_its_test_catches_a_wrong_reference(tmp_path, capsys):
    argv = ["new", "scaffold_demo::twice", "--dir", str(tmp_path), "--dtypes", "float32,float64", "--shape", "5,7"]
    assert main(argv) == 0
    folder = tmp_path / "twice"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "kernels/twice.cu",
        "test_twice.py",
        "twice.cpp",
    ]
    assert "opforge::kFloat32 | opforge::kFloat64" in (folder / "twice.cpp").read_text()
    assert "next: edit twice.cpp" in capsys.readouterr().out
    ok = run_generated_test(folder)
    assert ok.returncode == 0 and "2 passed" in ok.stdout, ok.stdout + ok.stderr  # verify, and the shape's test
    assert "torch.randn((5, 7), dtype=torch.float32" in (folder / "test_twice.py").read_text()
    # The reference doubles x while the description still says x.clone(): verify must fail.
    op_file = folder / "twice.cpp"
    op_file.write_text(
        op_file.read_text().replace("T(static_cast<double>(in[i]))", "T(2 * static_cast<double>(in[i]))")
    )
    broken = run_generated_test(folder)
    assert broken.returncode != 0 and "scaffold_demo::twice" in broken.stdout, broken.stdout + broken.stderr
    # Both runs built into the folder's one build folder in opforge's cache (the one `opforge
    # build` uses), the second recompiling only the edited file.
    assert len(built_libraries("twice")) == 1


@pytest.mark.slow
def test_a_triton_folder_passes_verify_and_its_test_catches_a_kernel_triton_cannot_compile(tmp_path, capsys):
    """``opforge new --triton``: the device kernel is a Triton kernel file launched by a grid
    function; the folder builds and its test passes (on a machine without a GPU, verify compiles
    the kernel with Triton for every case), and a kernel that no longer compiles fails it."""
    pytest.importorskip("triton", reason="Triton is not installed in this Python")
    argv = ["new", "scaffold_triton::copy", "--triton", "--dir", str(tmp_path), "--dtypes", "float32,bfloat16"]
    assert main(argv) == 0
    folder = tmp_path / "copy"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "copy.cpp",
        "kernels/copy.py",
        "test_copy.py",
    ]
    op_file = (folder / "copy.cpp").read_text()
    assert '.triton_source("copy.py", "copy_kernel")' in op_file and ".launch_grid(copy_grid);" in op_file
    assert "next: edit copy.cpp and kernels/copy.py" in capsys.readouterr().out
    ok = run_generated_test(folder)
    assert ok.returncode == 0 and "1 passed" in ok.stdout, ok.stdout + ok.stderr
    kernel = folder / "kernels" / "copy.py"
    kernel.write_text(kernel.read_text().replace("tl.store(y_ptr + offsets, x, mask=mask)", "tl.store(y_ptr, x)"))
    broken = run_generated_test(folder)
    assert broken.returncode != 0 and "scaffold_triton::copy" in broken.stdout, broken.stdout + broken.stderr
    assert len(built_libraries("copy")) == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["new", "twice"], "expected a qualified op name ns::name, got 'twice'"),
        (["new", "ns::2x"], "op name '2x' must be a C++ and Python identifier"),
        (["new", "class::x"], "namespace 'class' must be a C++ and Python identifier"),
        (["new", "ns::x", "--dtypes", "int8"], "dtypes must be among float32, float64, float16, bfloat16; got int8"),
        (["new", "ns::new"], "op name 'new' is reserved in C++ or used by the generated code"),
        (["new", "ns::T"], "op name 'T' is reserved in C++ or used by the generated code"),
        (["new", "ns::__x"], "op name '__x' is reserved in C++ or used by the generated code"),
        (["new", "aten::x"], "namespace 'aten' is torch's own"),
        (["new", "ns::x", "--shape", "8,x"], "--shape takes comma-separated sizes such as 64,512; got '8,x'"),
        (["new", "ns::x", "--shape", "8,-1"], "sizes of --shape must be at least 0, got [8, -1]"),
        (["new", "ns::x", "--shape", ""], "--shape takes comma-separated sizes such as 64,512; got ''"),
        (["new", "ns::x", "--shape", "4,,5"], "--shape takes comma-separated sizes such as 64,512; got '4,,5'"),
        (["new", "ns::x", "--shape", "100000,100000"], "has 10000000000 elements; its test allocates it"),
    ],
)
def test_bad_names_and_dtypes_are_refused(tmp_path, capsys, argv, message):
    assert main([*argv, "--dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_dtypes_are_read_with_spaces_and_once_each(tmp_path):
    assert main(["new", "ns::y", "--dir", str(tmp_path), "--dtypes", "float32, float16,float32"]) == 0
    assert '.input("x", opforge::kFloat32 | opforge::kFloat16)' in (tmp_path / "y" / "y.cpp").read_text()


def test_a_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    assert main(["new", "ns::x", "--dir", str(tmp_path / "afile")]) == 2
    assert "opforge new: cannot write" in capsys.readouterr().err


def test_an_existing_folder_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("keep")
    assert main(["new", "ns::x", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "x" / "mine.txt").read_text() == "keep"


def test_opforge_new_does_not_import_torch(tmp_path):
    """Writing a folder takes a moment, not torch's seconds of import (a refused name too)."""
    script = (
        "import sys\nfrom opforge.__main__ import main\n"
        "codes = [main(['new', 'my_ops::my_op', '--dir', sys.argv[1]]), main(['new', 'my_op'])]\n"
        "print(codes, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[-1] == "[0, 2] False", proc.stdout + proc.stderr
    assert (tmp_path / "my_op" / "my_op.cpp").is_file()
