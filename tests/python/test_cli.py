"""The ``opforge`` command line: each verb's work, --help, and exit codes (0 done, 1 failed,
2 bad arguments or input). Run as the installed console script would run it: a fresh Python
process with ``-m opforge``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opforge.__main__ import _library
from opforge._adapter import runner_path

OP = """
#include <opforge/op.h>

static void twice_cpu(opforge::Tensor x, double a, opforge::MutableTensor y) {
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = 2.0f * x.data<float>()[i] + static_cast<float>(a);
}

OPFORGE_OP(cli, twice)
    .doc("y = 2 x + a")
    .input("x", opforge::kFloat32)
    .param<double>("a", 0.0)
    .output("y", opforge::like("x"))
    .equivalent("2 * x + a")
    .reference(twice_cpu);
"""


def opforge_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600, cache: Path | None = None
) -> subprocess.CompletedProcess:
    """``python -m opforge *args``; with ``cache``, that is its cache folder (``$OPFORGE_CACHE_DIR``):
    a library name then means the checkout's example op alone, whatever this machine built before."""
    env = {**os.environ, "OPFORGE_QUIET": "1", **({"OPFORGE_CACHE_DIR": str(cache)} if cache else {})}
    return subprocess.run(
        [sys.executable, "-m", "opforge", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """``opforge build`` of an op folder holding one op file."""
    folder = tmp_path_factory.mktemp("cli") / "twice"
    folder.mkdir()
    (folder / "twice.cpp").write_text(textwrap.dedent(OP))
    proc = opforge_cli("build", str(folder), "--build-dir", str(folder.parent / "build"))
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.name == "libtwice.so" and path.exists()
    return path


def test_build_verify_and_stubs(built, tmp_path):
    proc = opforge_cli("verify", str(built), "--device", "cpu", "--seed", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cli::twice" in proc.stdout

    proc = opforge_cli("stubs", str(built), "-o", str(tmp_path / "typed"))
    assert proc.returncode == 0, proc.stderr
    stub, module = tmp_path / "typed" / "cli.pyi", tmp_path / "typed" / "cli.py"
    assert sorted(proc.stdout.split()) == sorted([str(module), str(stub)])
    tree = ast.parse(stub.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_twice")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    assert sorted(methods) == ["__call__", "default", "out"]
    assert ast.unparse(methods["__call__"].args) == "self, x: Tensor, a: float=0.0"
    assert ast.unparse(methods["out"].args) == "self, x: Tensor, a: float=0.0, *, y: Tensor"
    assert ast.unparse(methods["__call__"].returns) == "Tensor"
    assert ast.get_docstring(methods["__call__"]).startswith(
        "y = 2 x + a\n\nSchema: ``cli::twice(Tensor x, float a=0.0"
    )

    # The run-time module is torch.ops.cli itself.
    check = (
        "import sys, torch, opforge; opforge.load_library(sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
        "import cli; assert cli.twice is torch.ops.cli.twice; print(cli.twice(torch.ones(2), 1.0).tolist())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check, str(built), str(tmp_path / "typed")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[3.0, 3.0]"


def test_stubs_of_ops_whose_kernels_are_triton(triton_ops, tmp_path):
    """An op library whose kernels are Triton functions (fixtures/triton_ops.cpp) gets the same
    stubs: signatures from the description, and a module that is torch.ops.tt, whose CPU calls
    run the reference."""
    proc = opforge_cli("stubs", str(triton_ops.path), "-o", str(tmp_path / "typed"))
    assert proc.returncode == 0, proc.stderr
    tree = ast.parse((tmp_path / "typed" / "tt.pyi").read_text())
    calls = {
        n.name: ast.unparse(next(f for f in n.body if isinstance(f, ast.FunctionDef) and f.name == "__call__").args)
        for n in tree.body
        if isinstance(n, ast.ClassDef)
    }
    assert calls == {
        "_add": "self, x: Tensor, y: Tensor",
        "_softmax": "self, x: Tensor",
        "_softmax_backward": "self, grad_y: Tensor, y: Tensor",
        "_scale": "self, x: Tensor, alpha: float=2.0",
        "_unbound": "self, x: Tensor",
        "_add_without_reference": "self, x: Tensor, y: Tensor",
        "_double_through_a_copy": "self, x: Tensor",
    }
    check = (
        "import sys, torch, opforge; opforge.load_library(sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
        "import tt; assert tt.add is torch.ops.tt.add; print(tt.add(torch.ones(2), torch.ones(2)).tolist())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check, str(triton_ops.path), str(tmp_path / "typed")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[2.0, 2.0]"


def test_a_build_error_exits_1_with_the_compiler_output(tmp_path):
    (tmp_path / "broken.cpp").write_text("#include <opforge/op.h>\nthis is not C++;\n")
    proc = opforge_cli("build", str(tmp_path / "broken.cpp"), "--build-dir", str(tmp_path / "build"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("opforge build: ")
    assert "broken.cpp" in proc.stderr and "error" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["build", "/nonexistent/op.cpp"],
            "opforge build: opforge.build_library: missing source files: /nonexistent/op.cpp",
        ),
        (
            ["build", "/tmp", "/nonexistent/op.cpp"],
            "opforge build: give one op folder, or op files (.cpp) and CUDA sources (.cu)",
        ),
        (
            ["verify", "/nonexistent/libx.so"],
            "opforge verify: cannot open the op library /nonexistent/libx.so: No such file or directory",
        ),
        (["stubs", "/nonexistent/libx.so"], "opforge stubs: /nonexistent/libx.so does not exist"),
        (["stubs", "nosuchlib"], "opforge stubs: no op library named 'nosuchlib': give its op folder"),
        (["nonsense"], "invalid choice: 'nonsense'"),
        (["verify"], "the following arguments are required: targets"),
        (
            ["verify", "examples::nothing"],
            "opforge verify: no loaded op named 'examples::nothing' (pass the op library's path to load it)",
        ),
    ],
)
def test_bad_input_exits_2_and_says_what_is_wrong(args, message, opforge_main):
    proc = opforge_main(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_verify_says_what_a_newcomer_s_wrong_target_is_before_any_work(tmp_path, opforge_main):
    source = Path(__file__).resolve().parents[2] / "examples" / "ops" / "softshrink" / "softshrink.cpp"
    for args, message in (
        (
            [str(source)],
            f"opforge verify: {source} is a source file, not an op library: give its op folder ({source.parent}) "
            "or the lib<name>.so built from it\n",
        ),
        (
            ["examples::softshrnk", "softshrink"],
            "opforge verify: no op 'examples::softshrnk' in the op libraries given; they declare "
            "examples::softshrink, examples::softshrink_backward\n",
        ),
        (
            ["softshrink", "--json", str(tmp_path / "reports" / "v.json")],
            f"opforge verify: cannot write the json report {tmp_path / 'reports' / 'v.json'}: the folder "
            f"{tmp_path / 'reports'} does not exist\n",
        ),
    ):
        proc = opforge_main("verify", *args, cache=tmp_path)
        assert (proc.returncode, proc.stderr) == (2, message), args


def test_verify_of_a_library_and_one_of_its_ops_verifies_that_op(tmp_path, opforge_main):
    proc = opforge_main("verify", "bias_gelu", "examples::bias_gelu_backward", "--device", "cpu", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 op," in proc.stdout.splitlines()[-1] and "examples::bias_gelu " not in proc.stdout


def test_stubs_take_a_library_by_name_as_verify_does(tmp_path):
    proc = opforge_cli("stubs", "softshrink", "-o", str(tmp_path / "typed"), cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "typed").iterdir()) == ["examples.py", "examples.pyi"]
    stub = (tmp_path / "typed" / "examples.pyi").read_text()
    assert "def __call__(self, x: Tensor, lambd: float = 0.5) -> Tensor:" in stub


def test_verify_of_a_dtype_the_op_does_not_take_says_which_it_takes(tmp_path, opforge_main):
    proc = opforge_main("verify", "softshrink", "--device", "cpu", "--dtype", "int8", cache=tmp_path)
    assert proc.returncode == 2
    assert "examples::softshrink: no dtype combination has x in int8; x takes float32, float64" in proc.stderr
    assert "pass the op library's path" not in proc.stderr  # the op is loaded: no hint about loading it


@pytest.mark.parametrize("verb", ["build", "verify", "stubs"])
def test_each_verb_has_help(verb):
    proc = opforge_cli(verb, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"usage: opforge {verb}")


def test_top_level_help_lists_the_verbs_and_exit_codes():
    proc = opforge_cli("--help")
    assert proc.returncode == 0
    assert "{new,build,verify,doctor,run,stubs}" in proc.stdout and "Exit codes: 0 success, 1" in proc.stdout


@pytest.mark.skipif(not runner_path().exists(), reason="the C++ runner is not built (make build)")
def test_run_passes_its_arguments_to_the_runner(tmp_path):
    proc = opforge_cli("run", "--help")
    assert proc.returncode == 0
    assert "--inputs" in proc.stdout and "--iters" in proc.stdout
    proc = opforge_cli("run", str(tmp_path / "missing.pt2"), "--inputs", "x.pt", "--output", "y.pt")
    assert proc.returncode != 0
    assert "missing.pt2" in proc.stderr
    # Bad arguments exit 2, as every verb's (CLI11's own code for a missing option is 106).
    for args in (["model.pt2"], ["model.pt2", "--inputs", "x.pt", "--output", "y.pt", "--iters", "0"]):
        proc = opforge_cli("run", *args)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        assert "Run with --help for more information." in proc.stderr


def test_run_without_a_built_runner_says_how_to_build_it(tmp_path):
    env = {**os.environ, "OPFORGE_QUIET": "1", "OPFORGE_BUILD_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "opforge", "run", "--help"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"opforge run: the C++ runner {tmp_path / 'bin' / 'opforge-runner'} is not built; "
        "run `make build` in the checkout\n"
    )


def test_version_is_the_package_s():
    import opforge

    proc = opforge_cli("--version")
    assert (proc.returncode, proc.stdout) == (0, f"opforge {opforge.__version__}\n")


#: ``opforge`` in a fresh process of an opforge made to look installed, where building the adapter
#: or the runner fails the process.
INSTALLED_CLI = """
import sys
import opforge
from opforge import _adapter, _build, _paths
from opforge.__main__ import main

opforge.__version__ = "0"  # what an installed opforge reads from its metadata

def refuse(*args, **kwargs):
    raise AssertionError("opforge built something")

_paths.installed = lambda: True
_build.cmake_build = _adapter.cmake_build = refuse
sys.exit(main(sys.argv[1:]))
"""


def test_run_s_usage_in_an_installed_opforge_builds_nothing(tmp_path):
    from opforge.__main__ import RUN_USAGE

    env = {**os.environ, "OPFORGE_QUIET": "1", "OPFORGE_CACHE_DIR": str(tmp_path)}
    for args, code, out, err in [(["--help"], 0, RUN_USAGE + "\n", ""), ([], 2, "", RUN_USAGE + "\n")]:
        proc = subprocess.run(
            [sys.executable, "-c", INSTALLED_CLI, "run", *args], capture_output=True, text=True, env=env, timeout=300
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (code, out, err)
    assert list(tmp_path.iterdir()) == []


def twice_folder(parent: Path) -> Path:
    """An op folder named twice holding the op file OP."""
    folder = parent / "twice"
    folder.mkdir(parents=True)
    (folder / "twice.cpp").write_text(textwrap.dedent(OP))
    return folder


@pytest.mark.slow
def test_verify_takes_a_library_s_name_or_its_op_folder(tmp_path, opforge_main):
    first = twice_folder(tmp_path / "first")
    assert opforge_cli("build", str(first)).returncode == 0  # into the cache (OPFORGE_CACHE_DIR: the test's)
    proc = opforge_cli("verify", "twice", str(first), "--device", "cpu", "--seed", "1")  # its op, verified once
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 op," in proc.stdout and "cli::twice" in proc.stdout
    # The library file's stem names it too: verify's rule for its targets, asked in this process
    # (the verify above showed that a target so found is verified).
    assert _library("libtwice") == _library("twice") == _library(str(first))

    second = twice_folder(tmp_path / "second")
    assert opforge_cli("build", str(second)).returncode == 0
    proc = opforge_main("verify", "twice")  # the usage errors need no fresh Python: no library loads
    assert proc.returncode == 2
    built = sorted(Path(os.environ["OPFORGE_CACHE_DIR"]).glob("build/twice-*/libtwice.so"), key=os.path.getmtime)
    assert proc.stderr == (
        "opforge verify: 2 op libraries are named 'twice'; give the op folder or the path of one:\n"
        f"  {built[1]} (from {second.resolve()})\n  {built[0]} (from {first.resolve()})\n"
    )
    proc = opforge_main("verify", "libthrice")  # the library file's stem names it too
    assert proc.returncode == 2
    assert proc.stderr.startswith("opforge verify: no op library named 'thrice': give its op folder, its libthrice.so")
    proc = opforge_main("verify", "thrice")
    assert proc.returncode == 2
    assert proc.stderr == (
        "opforge verify: no op library named 'thrice': give its op folder, its libthrice.so, or an op name "
        "ns::op (`opforge build <folder>` builds libthrice.so from an op folder named thrice)\n"
    )
