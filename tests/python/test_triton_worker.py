"""opforge._triton_worker, the process that inspects and compiles @triton.jit functions for op
libraries: one JSON request on stdin, one JSON answer on stdout. Kernels compile for sm_90 and
sm_80 without a GPU (Triton compiles for a given target)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "triton"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed in this Python (requirements.txt pins it; the worker runs where Triton is)",
)

SCRATCH = [
    {"name": "global_scratch", "type": "*i8", "bytes": 8},
    {"name": "profile_scratch", "type": "*i8", "bytes": 8},
]


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("triton_cache")


def run(request: dict | str, cache: Path, pythonpath: str = "") -> tuple[dict, str]:
    """Runs the worker on ``request``; returns its answer and stderr. Its stdout must hold the
    answer and nothing else, and it exits 0 when it answers."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT / "python")) if p),
        "TRITON_CACHE_DIR": str(cache),
    }
    text = request if isinstance(request, str) else json.dumps(request)
    proc = subprocess.run(
        [sys.executable, "-m", "opforge._triton_worker"],
        input=text,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.endswith("\n"), proc.stdout
    return json.loads(proc.stdout), proc.stderr


def inspect(file: Path, function: str, cache: Path) -> dict:
    return run({"verb": "inspect", "file": str(file), "function": function}, cache)[0]


def compile_(file: Path, function: str, variants: list, cache: Path, arch: int = 90, **extra) -> dict:
    request = {"verb": "compile", "file": str(file), "function": function, "target": {"arch": arch}}
    return run({**request, "variants": variants, **extra}, cache)[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def line_of(path: Path, text: str) -> int:
    """The 1-based number of the line of ``path`` that contains ``text``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def param(name, annotation="", constexpr=False, default=None, has_default=False, dns=False, dns_align=False):
    return {
        "name": name,
        "constexpr": constexpr,
        "annotation": annotation,
        "has_default": has_default,
        "default": default,
        "do_not_specialize": dns,
        "do_not_specialize_on_alignment": dns_align,
    }


AXPY = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "scale": "fp32"}


def test_inspect_reports_parameters_and_sources(triton_cache):
    import triton

    file = FIXTURES / "add.py"
    answer = inspect(file, "axpy", triton_cache)
    assert answer == {
        "ok": True,
        "triton_version": triton.__version__,
        "function": "axpy",
        "line": line_of(file, "def axpy("),
        "params": [
            param("x_ptr"),
            param("y_ptr"),
            param("out_ptr"),
            param("n"),
            param("alpha"),
            param("scale", "fp32"),
            param("BLOCK", "constexpr", constexpr=True, default=256, has_default=True),
        ],
        "debug": False,
        "wrappers": [],
        "autotune": None,
        "heuristics": None,
        "sha256": sha256(file),
        "sources": [{"path": str(file), "sha256": sha256(file)}],
        "jit_cache_key": answer["jit_cache_key"],
    }
    assert len(answer["jit_cache_key"]) == 64


def test_inspect_reports_specialisation_flags(triton_cache):
    assert inspect(FIXTURES / "add.py", "scalars", triton_cache)["params"] == [
        param("out_ptr"),
        param("rows", dns=True),
        param("flag", "u1"),
        param("cols", dns_align=True),
        param("half", "fp16"),
        param("big", "i64"),
        param("none_arg"),
    ]


def test_prints_of_the_kernel_file_go_to_stderr(triton_cache):
    answer, stderr = run({"verb": "inspect", "file": str(FIXTURES / "add.py"), "function": "axpy"}, triton_cache)
    assert answer["ok"] and "add.py imported" in stderr


def cubin_sm(cubin: bytes) -> int:
    """The compute capability in a cubin's ELF header, read as src/oplib/kernel_image.h reads it:
    e_flags' low byte under ELF ABI version 7, its bits 8-15 under version 8 (the ptxas of CUDA
    13 writes version 8; the one Triton bundles, version 7 for some targets)."""
    flags = struct.unpack_from("<I", cubin, 48)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


@pytest.mark.parametrize("arch", [90, 80])
def test_compile_for_a_target_without_a_gpu(arch, triton_cache):
    import triton

    variant = {
        "signature": AXPY,
        "constexprs": {"alpha": 1},  # an integer argument equal to 1 is a constexpr to Triton
        "attrs": {"x_ptr": [["tt.divisibility", 16]], "n": [["tt.divisibility", 16]]},
        "options": {"num_warps": 4},
    }
    answer = compile_(FIXTURES / "add.py", "axpy", [variant], triton_cache, arch=arch, ptx=True)
    assert answer["ok"] and answer["sources"] == [
        {"path": str(FIXTURES / "add.py"), "sha256": sha256(FIXTURES / "add.py")}
    ]
    (kernel,) = answer["variants"]
    cubin = base64.b64decode(kernel.pop("cubin_b64"))
    assert cubin[:4] == b"\x7fELF" and cubin_sm(cubin) == arch
    ptx = base64.b64decode(kernel.pop("ptx_b64")).decode()
    assert f".target sm_{arch}" in ptx and ".entry axpy(" in ptx
    assert isinstance(kernel.pop("shared"), int) and len(kernel.pop("hash")) == 64
    assert kernel == {
        "ok": True,
        "name": "axpy",
        "num_warps": 4,
        "num_ctas": 1,
        "cluster_dims": [1, 1, 1],
        "global_scratch_size": 0,
        "global_scratch_align": 1,
        "profile_scratch_size": 0,
        "profile_scratch_align": 1,
        "launch_pdl": False,
        "launch_cooperative_grid": False,
        "tensordesc_meta": [],
        # alpha (a constexpr) and BLOCK (its default) are compiled in; the two scratch pointers
        # Triton's launcher appends follow the arguments.
        "kernel_params": [
            {"name": "x_ptr", "type": "*fp32", "bytes": 8},
            {"name": "y_ptr", "type": "*fp32", "bytes": 8},
            {"name": "out_ptr", "type": "*fp32", "bytes": 8},
            {"name": "n", "type": "i32", "bytes": 4},
            {"name": "scale", "type": "fp32", "bytes": 4},
            *SCRATCH,
        ],
        "triton_version": triton.__version__,
    }


def test_kernel_params_of_every_scalar_kind(triton_cache):
    signature = {"out_ptr": "*fp32", "rows": "i32", "flag": "u1", "cols": "i32", "half": "fp16", "big": "i64"}
    variant = {"signature": signature, "constexprs": {"none_arg": None}}
    (kernel,) = compile_(FIXTURES / "add.py", "scalars", [variant], triton_cache, arch=80)["variants"]
    assert kernel["kernel_params"] == [
        {"name": "out_ptr", "type": "*fp32", "bytes": 8},
        {"name": "rows", "type": "i32", "bytes": 4},
        {"name": "flag", "type": "u1", "bytes": 1},
        {"name": "cols", "type": "i32", "bytes": 4},
        {"name": "half", "type": "fp16", "bytes": 2},
        {"name": "big", "type": "i64", "bytes": 8},
        *SCRATCH,
    ]


def test_tensor_descriptors_and_global_scratch(triton_cache):
    file = FIXTURES / "descriptors.py"
    host = {"signature": {"desc": "tensordesc<fp16[64, 64]>", "out_ptr": "*fp16"}, "constexprs": {"BLOCK": 64}}
    (sm90,) = compile_(file, "from_host", [host], triton_cache, arch=90)["variants"]
    (sm80,) = compile_(file, "from_host", [host], triton_cache, arch=80)["variants"]
    shape32 = [{"name": f"desc.shape[{i}]", "type": "i32", "bytes": 4} for i in range(2)]
    shape64 = [{"name": f"desc.shape[{i}]", "type": "i64", "bytes": 8} for i in range(2)]
    strides = [{"name": f"desc.strides[{i}]", "type": "i64", "bytes": 8} for i in range(2)]
    out = {"name": "out_ptr", "type": "*fp16", "bytes": 8}
    assert sm90["tensordesc_meta"] == [
        {"swizzle": 3, "elem_size": 2, "elem_type": 6, "block_size": [64, 64], "fp4_padded": False}
    ]
    assert sm90["kernel_params"] == [
        {"name": "desc.tma", "type": "nvTmaDesc", "bytes": 128},
        *shape32,
        *strides,
        out,
        *SCRATCH,
    ]
    base = {"name": "desc.base", "type": "*fp16", "bytes": 8}
    padding = {"name": "desc.padding_nan", "type": "i1", "bytes": 1}
    assert sm80["tensordesc_meta"] == []
    assert sm80["kernel_params"] == [base, *shape64, *strides, padding, *shape32, *strides, out, *SCRATCH]

    device = {"signature": {"a_ptr": "*fp16", "M": "i32", "N": "i32"}, "constexprs": {"BLOCK": 64}}
    (sm90,) = compile_(file, "on_device", [device], triton_cache, arch=90)["variants"]
    (sm80,) = compile_(file, "on_device", [device], triton_cache, arch=80)["variants"]
    assert (sm90["global_scratch_size"], sm90["global_scratch_align"]) == (128, 128)  # the descriptor, per program
    assert (sm80["global_scratch_size"], sm80["global_scratch_align"]) == (0, 1)


def test_inspect_autotuned(triton_cache):
    answer = inspect(FIXTURES / "autotuned.py", "scale", triton_cache)
    assert answer["wrappers"] == ["autotune"] and answer["heuristics"] is None
    assert [p["name"] for p in answer["params"]] == ["x_ptr", "out_ptr", "n", "BLOCK"]
    config = {"num_ctas": 1, "ir_override": None, "pre_hook": False}
    assert answer["autotune"] == {
        "configs": [
            {"kwargs": {"BLOCK": 128}, "num_warps": 4, "num_stages": 2, "maxnreg": None, **config},
            {"kwargs": {"BLOCK": 1024}, "num_warps": 8, "num_stages": 3, "maxnreg": 128, **config},
        ],
        "key": ["n"],
        "reset_to_zero": ["out_ptr"],
        "restore_value": [],
        "prune_configs_by": False,
        "early_config_prune": False,
        "perf_model": False,
        "top_k": 1.0,
        "pre_hook": False,
        "post_hook": False,
        "do_bench": False,
        "cache_results": False,
    }


def test_compile_every_autotune_config_in_one_request(triton_cache):
    file = FIXTURES / "autotuned.py"
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
    variants = [
        {"signature": signature, "config": 0},
        {"signature": signature, "config": 1},
        {"signature": signature, "constexprs": {"BLOCK": 1024}, "options": {"num_warps": 8, "num_stages": 3}},
        {"signature": signature, "config": 1, "constexprs": {"BLOCK": 4}},
        {"signature": signature, "config": 2},
    ]
    first, second, by_hand, conflict, missing = compile_(file, "scale", variants, triton_cache)["variants"]
    assert first["ok"] and second["ok"] and (first["num_warps"], second["num_warps"]) == (4, 8)
    assert first["hash"] != second["hash"]
    assert by_hand["ok"] and by_hand["hash"] != second["hash"]  # config 1 also sets maxnreg
    assert conflict == {
        "ok": False,
        "error": f"{file}: scale, variant 3: 'BLOCK' is given by the variant and by autotune config "
        "BLOCK: 1024, num_warps: 8, num_ctas: 1, num_stages: 3, maxnreg: 128",
    }
    assert missing == {"ok": False, "error": f"{file}: scale, variant 4: 'config' must be an index below 2, got 2"}
    (plain,) = compile_(FIXTURES / "add.py", "axpy", [{"signature": AXPY, "config": 0}], triton_cache)["variants"]
    assert (
        plain["error"]
        == f"{FIXTURES / 'add.py'}: axpy, variant 0: 'config' given, but axpy is not wrapped by triton.autotune"
    )


def test_inspect_heuristics(triton_cache):
    answer = inspect(FIXTURES / "heuristics.py", "copy", triton_cache)
    assert (answer["wrappers"], answer["heuristics"], answer["autotune"]) == (["heuristics"], ["BLOCK", "EVEN"], None)


def test_sources_list_the_helpers_beside_the_kernel(triton_cache):
    file = FIXTURES / "uses_helper.py"
    helpers = [FIXTURES / "helpers" / name for name in ("__init__.py", "broken.py", "scaling.py")]
    answer = inspect(file, "double", triton_cache)
    assert answer["sources"] == [{"path": str(p), "sha256": sha256(p)} for p in [file, *helpers]]
    assert answer["sha256"] == sha256(file)
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
    compiled = compile_(file, "double", [{"signature": signature, "constexprs": {"BLOCK": 128}}], triton_cache)
    assert compiled["sources"] == answer["sources"] and compiled["variants"][0]["ok"]


def test_an_edit_of_a_helper_changes_its_hash(tmp_path, triton_cache):
    folder = tmp_path / "kernels"
    shutil.copytree(FIXTURES, folder)
    before = inspect(folder / "uses_helper.py", "double", triton_cache)
    helper = folder / "helpers" / "scaling.py"
    helper.write_text(helper.read_text().replace("x * 2", "x * 3"))
    after = inspect(folder / "uses_helper.py", "double", triton_cache)
    changed = [a["path"] for a, b in zip(after["sources"], before["sources"]) if a != b]
    assert changed == [str(helper)] and after["sha256"] == before["sha256"]
    assert after["jit_cache_key"] != before["jit_cache_key"]


def test_syntax_error_names_file_and_line(tmp_path, triton_cache):
    file = tmp_path / "bad.py"
    file.write_text("import triton\n\n\n@triton.jit\ndef k(x):\n    return x +\n")
    expected = {"ok": False, "error": f"{file}:6: SyntaxError: invalid syntax\n    return x +"}
    assert inspect(file, "k", triton_cache) == expected
    assert compile_(file, "k", [{"signature": {"x": "i32"}}], triton_cache) == expected
    # in a module the kernel file imports: that module's file and line
    helper = tmp_path / "helper.py"
    helper.write_text("x = (\n")
    (tmp_path / "uses.py").write_text("import helper  # noqa: F401\n")
    assert inspect(tmp_path / "uses.py", "k", triton_cache) == {
        "ok": False,
        "error": f"{helper}:1: SyntaxError: '(' was never closed\n    x = (",
    }


def test_error_while_importing_names_file_and_line(tmp_path, triton_cache):
    file = tmp_path / "raises.py"
    file.write_text("import triton\n\nBLOCK = 1 // 0\n")
    assert inspect(file, "k", triton_cache) == {
        "ok": False,
        "error": f"{file}:3: ZeroDivisionError: integer division or modulo by zero",
    }


def test_unsupported_reference_names_the_function(tmp_path, triton_cache):
    file = tmp_path / "refers.py"
    file.write_text(
        textwrap.dedent(
            """\
            import triton
            import triton.language as tl

            class Helper:
                def __call__(self, x):
                    return x

                def __repr__(self):
                    return "Helper()"

            helper = Helper()

            @triton.jit
            def k(x_ptr):
                tl.store(x_ptr, helper(1))
            """
        )
    )
    message = "RuntimeError: Unsupported function referenced: Helper()"
    assert inspect(file, "k", triton_cache) == {"ok": False, "error": f"{file}: k: {message}"}
    (compiled,) = compile_(file, "k", [{"signature": {"x_ptr": "*i32"}}], triton_cache)["variants"]
    assert compiled == {"ok": False, "error": f"{message}\n(compiling k of {file} for sm_90, variant 0)"}


def test_missing_function(triton_cache):
    file = FIXTURES / "uses_helper.py"
    assert inspect(file, "nothing", triton_cache) == {
        "ok": False,
        "error": f"{file}: no function 'nothing' (its @triton.jit functions: double, broken, asserts)",
    }
    assert inspect(FIXTURES / "add.py", "not_a_kernel", triton_cache) == {
        "ok": False,
        "error": f"{FIXTURES / 'add.py'}: 'not_a_kernel' is not a @triton.jit function (it is a function)",
    }


def test_compile_error_in_a_helper_names_its_file_and_line(triton_cache):
    file, helper = FIXTURES / "uses_helper.py", FIXTURES / "helpers" / "broken.py"
    (answer,) = compile_(
        file, "broken", [{"signature": {"x_ptr": "*fp32"}, "constexprs": {"BLOCK": 16}}], triton_cache
    )["variants"]
    assert answer == {
        "ok": False,
        "error": f"{helper}:{line_of(helper, 'not_defined_anywhere')}: CompilationError: "
        "NameError('not_defined_anywhere is not defined')\n"
        "at 3:15:\n"
        "def undefined_call(x):\n"
        "    y = x + 1\n"
        "    return y * not_defined_anywhere  # noqa: F821\n"
        "               ^\n"
        "NameError('not_defined_anywhere is not defined')\n"
        f"called from {file}:{line_of(file, 'undefined_call(tl.load')}",
    }


def test_static_assert_names_file_and_line(triton_cache):
    file = FIXTURES / "uses_helper.py"
    variants = [{"signature": {"x_ptr": "*fp32"}, "constexprs": {"BLOCK": 128}}, {"signature": {"x_ptr": "*fp32"}}]
    failed, unsatisfied = compile_(file, "asserts", variants, triton_cache, arch=80)["variants"]
    assert failed["error"].startswith(
        f"{file}:{line_of(file, 'tl.static_assert')}: CompileTimeAssertionFailure: BLOCK must be at most 64\nat 2:4:\n"
    )
    assert unsatisfied == {
        "ok": False,
        "error": f"{file}: asserts, variant 1: parameter 'BLOCK' is tl.constexpr and has no value in constexprs",
    }


def test_variant_errors(triton_cache):
    file = FIXTURES / "add.py"
    variants = [
        {"signature": {"x_ptr": "*fp32"}},
        {"signature": {**AXPY, "scale": "fp16", "alpha": "fp32"}},
        {"signature": {**AXPY, "alpha": "i32"}, "constexprs": {"alpha": 2}},
        {"signature": {**AXPY, "alpha": "i32", "z": "i32"}, "attrs": {"w": []}},
        {"signature": {**AXPY, "alpha": "i32"}, "options": {"num_warp": 4, "arch": "sm80"}},
        {"signature": AXPY, "constexprs": {"alpha": [1]}},
        "not an object",
        {"signature": AXPY, "options": [4]},
    ]
    errors = [v["error"] for v in compile_(file, "axpy", variants, triton_cache)["variants"]]
    known = (
        "allowed_dot_input_precisions, backend_name, debug, default_dot_input_precision, "
        "deprecated_fp8_dot_operand_dtypes, enable_fp_fusion, enable_reflect_ftz, extern_libs, "
        "instrumentation_mode, ir_override, launch_cooperative_grid, launch_pdl, max_num_imprecise_acc_default, "
        "maxnreg, num_ctas, num_stages, num_warps, ptx_options, ptx_version, sanitize_overflow, "
        "supported_fp8_dtypes, warp_size"
    )
    assert errors == [
        f"{file}: axpy, variant {i}: {message}"
        for i, message in enumerate(
            [
                "parameter 'y_ptr' has no type in signature",
                "parameter 'scale' is annotated fp32, signature gives fp16",
                "parameter 'alpha' has both a type and a constexpr value",
                "signature names z, not parameters of axpy",
                f"unknown options arch, num_warp (known: {known})",
                "a constexpr value must be a scalar, a string or {'dtype': name}, got [1]",
                "a variant must be a JSON object",
                "'options' must be an object, got [4]",
            ]
        )
    ]


def test_dtype_constexpr(triton_cache):
    file = FIXTURES / "add.py"
    assert inspect(file, "cast", triton_cache)["params"][-1] == param(
        "OUT", "constexpr", constexpr=True, default={"dtype": "fp16"}, has_default=True
    )
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp16"}
    variants = [{"signature": signature}, {"signature": signature, "constexprs": {"OUT": {"dtype": "fp16"}}}]
    variants += [{"signature": {**signature, "out_ptr": "*bf16"}, "constexprs": {"OUT": {"dtype": "bf16"}}}]
    default, fp16, bf16 = compile_(file, "cast", variants, triton_cache)["variants"]
    assert default["hash"] == fp16["hash"] != bf16["hash"]
    (bad,) = compile_(file, "cast", [{"signature": signature, "constexprs": {"OUT": {"type": "fp16"}}}], triton_cache)[
        "variants"
    ]
    assert bad["error"] == (
        f"{file}: cast, variant 0: a constexpr value must be a scalar, a string or {{'dtype': name}}, "
        "got {'type': 'fp16'}"
    )


@pytest.mark.parametrize(
    ("request_text", "error"),
    [
        ("nonsense", "the request is not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("[]", "the request must be a JSON object"),
        ('{"verb": "run"}', "unknown verb 'run': expected 'inspect' or 'compile'"),
        ('{"verb": "inspect", "file": 3}', "'file' must be a string, got 3"),
        (
            '{"verb": "inspect", "file": "k.py", "function": "k"}',
            "k.py: the kernel file must be given by an absolute path",
        ),
        (
            '{"verb": "inspect", "file": "/nonexistent/k.py", "function": "k"}',
            "/nonexistent/k.py: cannot read the kernel file: No such file or directory",
        ),
    ],
)
def test_request_errors(request_text, error, triton_cache):
    assert run(request_text, triton_cache)[0] == {"ok": False, "error": error}


def test_compile_request_errors(triton_cache):
    request = {"verb": "compile", "file": str(FIXTURES / "add.py"), "function": "axpy", "variants": []}
    assert (
        run({**request, "target": {"arch": "sm_90"}}, triton_cache)[0]["error"]
        == "'arch' must be an integer, got \"sm_90\""
    )
    assert run({**request, "target": {"arch": 90}}, triton_cache)[0] == {
        "ok": True,
        "triton_version": run({**request, "verb": "inspect"}, triton_cache)[0]["triton_version"],
        "sources": [{"path": str(FIXTURES / "add.py"), "sha256": sha256(FIXTURES / "add.py")}],
        "variants": [],
    }


def test_without_triton(tmp_path, triton_cache):
    (tmp_path / "triton.py").write_text("raise ImportError('Triton is hidden by the test')\n")
    answer, _ = run(
        {"verb": "inspect", "file": str(FIXTURES / "add.py"), "function": "axpy"}, triton_cache, str(tmp_path)
    )
    assert answer == {
        "ok": False,
        "error": f"Triton is not installed in {sys.executable}: Triton is hidden by the test",
    }


def test_serve_answers_a_request_per_line_and_reads_an_edited_helper_anew(tmp_path, triton_cache):
    """``--serve`` (how op libraries run the worker, kept between requests): an answer line per
    request line, a failed request answered without ending the process, and the kernel folder's
    own modules imported anew for each request, so that an edit to a helper is seen."""
    folder = tmp_path / "kernels"
    shutil.copytree(FIXTURES, folder)
    request = json.dumps({"verb": "inspect", "file": str(folder / "uses_helper.py"), "function": "double"})
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "TRITON_CACHE_DIR": str(triton_cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "opforge._triton_worker", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        proc.stdin.write(request + "\n")
        proc.stdin.flush()
        before = json.loads(proc.stdout.readline())
        proc.stdin.write("not json\n")
        proc.stdin.flush()
        refused = json.loads(proc.stdout.readline())
        helper = folder / "helpers" / "scaling.py"
        helper.write_text(helper.read_text().replace("x * 2", "x * 3"))
        proc.stdin.write(request + "\n")
        proc.stdin.flush()
        after = json.loads(proc.stdout.readline())
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0 and proc.stdout.read() == ""
    finally:
        proc.kill()
        proc.wait()
    assert refused == {"ok": False, "error": "the request is not JSON: Expecting value: line 1 column 1 (char 0)"}
    assert before["ok"] and after["ok"]
    assert [s["path"] for s in after["sources"]] == [s["path"] for s in before["sources"]]
    changed = [a["path"] for a, b in zip(after["sources"], before["sources"]) if a != b]
    assert changed == [str(helper)] and after["jit_cache_key"] != before["jit_cache_key"]
