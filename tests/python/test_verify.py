"""opforge verify: passes the example ops, catches deliberately broken kernels, says how to
reproduce, and checks whole models in the C++ runner."""

from __future__ import annotations

import functools
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opforge
from opforge import verify
from opforge._core import poison_outputs
from opforge.verify.cases import dtype_cases, floating_as, generate_cases
from opforge.verify.checks import _equivalent_bound, out_results
from opforge.verify.compare import compare_outputs, equivalent_bound
from opforge.verify.poison import ALTERNATE, poison_value, poisoning

FIXTURES = Path(__file__).resolve().parent / "fixtures"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")


@pytest.fixture(scope="module")
def broken_ops(tmp_path_factory):
    return opforge.load_library(
        opforge.build_library(
            "broken_ops",
            [FIXTURES / "broken_ops.cpp", FIXTURES / "unwritten_ops.cpp", FIXTURES / "sweep_ops.cpp"],
            kernels=[
                FIXTURES / "kernels" / "broken_kernels.cu",
                FIXTURES / "kernels" / "syntax_error.cu",
                FIXTURES / "kernels" / "unwritten_kernels.cu",
            ],
            build_dir=tmp_path_factory.mktemp("broken"),
        )
    )


@functools.cache
def example_report(name: str, device: str) -> verify.Report:
    """``verify_op`` of an example op on ``device`` at seed 1234, once per test process: on the CPU,
    test_example_ops_pass and test_every_choice_and_unranged_float_is_verified read one report of
    examples::attention (each verify of it takes seconds). Callers only read it."""
    opforge.load_library(opforge.example_library(name.split("::")[1].removesuffix("_backward")))
    return verify.verify_op(name, device=device, seed=1234)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "examples::softshrink",
        "examples::softshrink_backward",
        "examples::bias_gelu",
        "examples::bias_gelu_backward",
        "examples::rms_norm",
        "examples::rms_norm_backward",
        "examples::add_layer_norm",
        "examples::add_layer_norm_backward",
        "examples::fused_add_rms_norm_backward",
        "examples::identity_conv",
        "examples::attention",
    ],
)
def test_example_ops_pass(name):
    report = example_report(name, "cuda" if torch.cuda.is_available() else "cpu")
    assert report.ok, [(r.case, r.message) for r in report.failures]
    checks = {(r.check, r.status) for r in report.results}
    assert {("opcheck", "pass"), ("meta", "pass"), ("compile", "pass")} <= checks
    has_backward = opforge.find_op(name).backward is not None
    assert (("gradcheck", "pass") in checks) == has_backward
    cases = {r.case for r in report.results if r.check == "values"}
    first = opforge.find_op(name).tensors[0].name
    if report.device == "cpu":  # the reference is checked against the description's torch expression
        assert {
            "shape 3x37",
            "shape 33x255",
            f"permuted {first}",
            f"sliced {first}",
            f"offset {first}",
            f"leading slice {first}",
            "empty",
            "nan/inf",
        } <= cases
        assert len([c for c in cases if c.startswith("random ")]) >= 2  # random sizes; fewer where two coincide


def failed_values(report: verify.Report, op: str) -> dict[str, verify.CaseResult]:
    return {f"{r.dtype} {r.case}": r for r in report.failures if r.op == op and r.check == "values"}


def test_catches_off_by_one(broken_ops):
    report = verify.verify_op("fixture::off_by_one", device="cpu", seed=5)
    failed = failed_values(report, "fixture::off_by_one")
    assert "float32 shape 3x37" in failed
    result = failed["float32 shape 3x37"]
    assert "1 of 111 elements differ; first at [2, 36]: nan, expected" in result.message  # the poisoned output
    assert result.repro["seed"] > 0 and result.repro["args"][0] == {
        "dtype": "float32",
        "shape": [3, 37],
        "stride": [37, 1],
        "storage_offset": 0,
    }
    assert "float32 empty" not in failed


#: int64's poison in mode 1 and in mode 2 (every byte 0x7b, then 0x5a).
INT64_POISON = (8897841259083430779, 6510615555426900570)
#: The last row of a bool output of 3x37 left unwritten: false (mode 2) where true is expected.
LAST_ROW = "37 of 111 elements differ; first at [2, 0]: 0.0, expected 1.0"


def test_the_alternate_run_message():
    assert ALTERNATE.format(n=111) == (
        "the reference holds the poison in 111 output elements; run again with the alternate poison: "
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("fixture::isfinite_skips_last_row", LAST_ROW),
        (
            "fixture::fill_skips_last_row",
            "37 of 111 elements differ; first at [2, 0]: 6.510615555426901e+18, expected 8.897841259083431e+18",
        ),
    ],
)
def test_an_element_left_unwritten_is_caught_where_the_reference_is_the_poison(broken_ops, name, message):
    """A bool output's primary poison is true and an int64's 0x7b7b7b7b7b7b7b7b: a reference of
    that value would hide a row the kernel never writes, so such cases run again with the
    alternate poison; every case with a row to skip fails, and so does the out= check."""
    report = verify.verify_op(name, device="cpu", seed=5)
    values = [r for r in report.results if r.check == "values"]
    assert values and all(r.status == "FAIL" for r in values if not r.case.startswith("empty")), [
        r.case for r in values if r.status != "FAIL"
    ]
    assert failed_values(report, name)["float32 shape 3x37"].message == ALTERNATE.format(n=111) + message
    (out,) = [r for r in report.results if r.check == "out"]
    assert out.status == "FAIL" and out.message == "out= differs from the op: " + ALTERNATE.format(n=111) + message


def test_a_nan_left_to_the_poison_is_caught(broken_ops):
    """A reference that leaves an element whose input is NaN unwritten, as if the output's memory
    held NaN: the NaN it propagates no longer hides it."""
    report = verify.verify_op("fixture::twice_skips_nan", device="cpu", seed=5)
    failed = failed_values(report, "fixture::twice_skips_nan")
    assert set(failed) == {f"{d} nan/inf" for d in ("float32", "float64", "float16", "bfloat16")}
    alternate = poison_value(torch.float32, 2).item()  # every byte 0x5a: finite
    assert failed["float32 nan/inf"].message == (
        ALTERNATE.format(n=1) + f"1 of 111 elements differ; first at [0, 0]: {alternate!r}, expected nan"
    )
    assert [r.check for r in report.failures] == ["values"] * 4


@pytest.mark.parametrize(
    ("name", "cases"),
    [
        # an optional output (key_out, given with key): y's and key_out's 111 elements, y's without key
        ("fixture::isfinite_pair_skips_last_row", {"shape 3x37": 222, "shape 3x37 without key": 111}),
        # an input written in place: the results are y, then x's final value
        ("fixture::isfinite_clear_skips_last_row", {"shape 3x37": 111}),
    ],
)
def test_an_op_without_an_out_overload_is_caught_where_the_reference_is_the_poison(broken_ops, name, cases):
    """An optional output or an input written in place leaves the op without an out= overload;
    the run with the alternate poison needs none, so every case with a row to skip fails (Note
    [Poison that equals the reference])."""
    assert opforge.find_op(name).out_schema is None
    report = verify.verify_op(name, device="cpu", seed=5, dtypes=["float32"])
    values = {r.case: r for r in report.results if r.check == "values"}
    assert all(r.status == "FAIL" for c, r in values.items() if not c.startswith("empty")), [
        c for c, r in values.items() if r.status != "FAIL"
    ]
    for case, n in cases.items():
        assert values[case].message == ALTERNATE.format(n=n) + "output 0: " + LAST_ROW


@pytest.mark.parametrize(
    ("dtype", "primary", "alternate"),
    [
        (torch.float16, math.nan, 203.25),
        (torch.bfloat16, math.nan, float.fromhex("0x1.b4p+53")),
        (torch.float32, math.nan, struct.unpack("<f", b"\x5a" * 4)[0]),
        (torch.float64, math.nan, struct.unpack("<d", b"\x5a" * 8)[0]),
        (torch.int8, 123, 90),
        (torch.uint8, 123, 90),
        (torch.int16, 31611, 23130),
        (torch.int32, 0x7B7B7B7B, 0x5A5A5A5A),
        (torch.int64, INT64_POISON[0], INT64_POISON[1]),
        (torch.bool, True, False),
        (torch.float8_e4m3fn, math.nan, 20.0),  # 0x7f, 0x5a
        (torch.float8_e5m2, math.nan, 192.0),  # 0x7f, 0x5a
        (torch.float8_e8m0fnu, math.nan, 2.0 ** (0x5A - 127)),  # 0xff, 0x5a
    ],
)
def test_the_poison_of_each_dtype_is_the_cores_byte_repeated(dtype, primary, alternate):
    """Each mode's poison is its byte repeated over the item (not one value for every width),
    and the two modes differ in every dtype, which makes the run in mode 2 catch what mode 1
    hides."""
    one, two = poison_value(dtype, 1), poison_value(dtype, 2)
    assert one.dtype == two.dtype == dtype and one.shape == two.shape == ()
    assert math.isnan(one.item()) if math.isnan(primary) else one.item() == primary, one
    assert two.item() == alternate
    assert not math.isnan(two.item()) and one.item() != two.item()


def test_poisoning_restores_the_mode_that_was_on(broken_ops):
    """verify sets its own poison mode and then the one before it, which a process's
    OPFORGE_POISON_OUTPUTS may have set: never off."""
    before = poison_outputs()
    try:
        opforge.set_poison_outputs(2)
        with poisoning(1):
            assert poison_outputs() == 1
            with poisoning(0):
                assert poison_outputs() == 0
            assert poison_outputs() == 1
        assert poison_outputs() == 2
        assert verify.verify_op("fixture::twice_skips_nan", device="cpu", seed=5, dtypes=["float32"]).results
        assert poison_outputs() == 2
    finally:
        opforge.set_poison_outputs(before)


def test_an_out_overload_that_returns_other_tensors_is_refused(broken_ops):
    class Handle:  # a torch.ops packet whose out= overload returns a copy of its out tensor
        @staticmethod
        def out(x, y):
            y.copy_(2 * x)
            return y.clone()

    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError) as err:
        out_results(opforge.find_op("fixture::correct"), Handle, [x], (2 * x,))
    assert str(err.value) == "the out= overload did not return its out tensors"


def test_a_cuda_fixture_that_skips_its_last_row_is_right_on_the_cpu(broken_ops):
    """The kernels of the cuda_ fixtures compile, and their CPU references are right: on a GPU,
    test_catches_kernels_that_skip_their_last_row finds what their kernels leave out."""
    for name in ("fixture::cuda_twice_skips_last_row", "fixture::cuda_isfinite_skips_last_row"):
        report = verify.verify_op(name, device="cpu", seed=5)
        assert report.ok, report.failures
        assert {r.case for r in report.results if r.check == "nvrtc"} == {"sm_90", "sm_80"}


@requires_cuda
def test_catches_kernels_that_skip_their_last_row(broken_ops):
    """Run-time kernels launched one block per row that return early in the last block: every
    case with rows fails on the device, the bool one through its run with other values."""
    for name in ("fixture::cuda_twice_skips_last_row", "fixture::cuda_isfinite_skips_last_row"):
        report = verify.verify_op(name, device="cuda", seed=5)
        values = [r for r in report.results if r.check == "values"]
        assert values and all(r.status == "FAIL" for r in values if not r.case.startswith("empty")), [
            (r.dtype, r.case) for r in values if r.status != "FAIL"
        ]
        assert "shape 1031x64" in {r.case for r in values}  # the device's own sizes
    message = failed_values(report, "fixture::cuda_isfinite_skips_last_row")["float32 shape 3x37"].message
    assert message == ALTERNATE.format(n=111) + LAST_ROW


def test_the_compile_check_never_meets_duck_sizing(broken_ops):
    """dequantize_blocks' scales are [t, h, ceildiv(c, 8)] beside x [t, h, c]: at c = 37 the last
    dim of scales equals the heads (5), at other sizes not, which torch.compile would recompile
    for (Note [Duck sizing]); the check leaves out that size and passes."""
    report = verify.verify_op("fixture::dequantize_blocks", device="cpu", seed=5, dtypes=["float32"])
    assert report.ok, report.failures
    (compile_check,) = [r for r in report.results if r.check == "compile"]
    assert (compile_check.status, compile_check.case) == ("pass", "sweep 11x67, 19x101, 29x131")
    shapes = [[a["shape"] for a in c["args"]] for c in compile_check.repro["cases"]]
    assert shapes == [[[11, 5, 67], [11, 5, 9]], [[19, 5, 101], [19, 5, 13]], [[29, 5, 131], [29, 5, 17]]]


def test_the_compile_check_takes_sizes_the_rules_admit_or_says_why_not(broken_ops):
    """An op of at most two rows compiles over sizes with two rows (none of the sizes the check
    starts from); an op of one shape gets the check as not applicable, with the reason."""
    report = verify.verify_op("fixture::two_rows_at_most", device="cpu", seed=5, dtypes=["float32"])
    assert report.ok, report.failures
    (compile_check,) = [r for r in report.results if r.check == "compile"]
    assert compile_check.status == "pass"
    assert [c["args"][0]["shape"] for c in compile_check.repro["cases"]] == [[2, 37], [2, 67], [2, 101]]
    report = verify.verify_op("fixture::one_shape", device="cpu", seed=5, dtypes=["float32"])
    assert report.ok, report.failures
    (compile_check,) = [r for r in report.results if r.check == "compile"]
    assert (compile_check.status, compile_check.message) == (
        "skip",
        "the op's rules admit one input shape only (x [4, 8])",
    )


def test_cases_reach_head_sizes_row_blocks_and_views_of_written_inputs():
    """Head sizes 64 and 128, more rows than a 128-row block, sliced views of the inputs an op
    writes (those it takes without a copy), and on a device the device's own sizes; sizes whose
    shapes an earlier case had are left out."""
    for library in ("rotary_embedding", "kv_cache_write", "attention"):
        opforge.load_library(opforge.example_library(library))
    rotary = opforge.find_op("examples::rotary_embedding")
    dtypes = dtype_cases(rotary, ["float16"])[0].dtypes
    cases = {c.label: c for c in generate_cases(rotary, dtypes, seed=6)}
    assert {cases[f"shape {lead}x{size}"].args[1].shape[2] for lead, size in ((7, 64), (6, 128))} == {64, 128}
    assert cases["shape 131x24"].args[2].shape[0] == 131  # cos_sin_cache rows: positions index past 128
    query = cases["leading slice query"].args[1]  # written in place, in the layout it is given
    assert query.is_contiguous() and query.storage_offset() == query[0].numel()
    kv = opforge.find_op("examples::kv_cache_write")
    labels = {c.label for c in generate_cases(kv, dtype_cases(kv, ["bfloat16"])[0].dtypes, seed=6)}
    assert {"leading slice key_cache", "leading slice value_cache", "sliced key"} <= labels
    assert "sliced key_cache" not in labels  # key_cache is written and dense: a strided view is refused
    on_cuda = {c.label for c in generate_cases(kv, dtype_cases(kv, ["bfloat16"])[0].dtypes, seed=6, device="cuda")}
    assert {"shape 1031x64", "shape 300x128", "shape 3x40000"} <= on_cuda and "shape 1031x64" not in labels
    assert len([c for c in on_cuda if c.startswith("random ")]) == 12 > len([c for c in labels if "random" in c])
    attention = opforge.find_op("examples::attention")
    sized = generate_cases(attention, dtype_cases(attention, ["float16"])[0].dtypes, seed=6)
    shapes = [
        repr([list(a.shape) if isinstance(a, torch.Tensor) else a for a in c.args])
        for c in sized
        if c.label.startswith(("shape ", "random "))
    ]
    assert len(shapes) == len(set(shapes))  # attention's last dim is head_dim: 33x256 and 33x257 are 33x255
    assert "shape 33x255" in {c.label for c in sized} and "shape 33x257" not in {c.label for c in sized}


def test_rules_that_bound_a_size_from_above_still_get_every_other_size(broken_ops):
    """x.size(1) <= 4: each case takes the largest small size its rule admits, so the cases keep
    their rows (1 to 131) and views instead of shrinking to the one 1x1 case."""
    op = opforge.find_op("fixture::four_columns_at_most")
    cases = {c.label: c for c in generate_cases(op, {"x": "float32"}, seed=5)}
    assert cases["shape 131x24"].args[0].shape == (131, 4) and cases["permuted x"].args[0].shape == (4, 4)
    assert len({c.args[0].shape for c in cases.values()}) >= 8 and "empty" in cases and "nan/inf" in cases
    assert verify.verify_op(op.name, device="cpu", seed=5, dtypes=["float32"]).ok


def test_catches_missing_stride(broken_ops):
    report = verify.verify_op("fixture::missing_stride", device="cpu", seed=5, dtypes=["float32"])
    failed = failed_values(report, "fixture::missing_stride")
    assert {"float32 permuted x", "float32 sliced x", "float32 expanded x"} <= set(failed)
    assert "float32 shape 3x37" not in failed and "float32 offset x" not in failed  # dense inputs pass
    assert failed["float32 sliced x"].repro["args"][0]["stride"] == [80, 2]


def test_catches_wrong_dtype_path(broken_ops):
    report = verify.verify_op("fixture::wrong_dtype_path", device="cpu", seed=5)
    assert {r.dtype for r in report.failures} == {"bfloat16"}


def test_catches_a_wrong_backward(broken_ops):
    report = verify.verify_op("fixture::wrong_gradient", device="cpu", seed=5)
    assert [(r.check, r.dtype, r.case) for r in report.failures] == [("gradcheck", "float64", "shape 3x37")]
    assert "Jacobian mismatch" in report.failures[0].message
    assert report.failures[0].repro["args"][0]["dtype"] == "float64"
    assert verify.verify_op("fixture::wrong_gradient_bwd", device="cpu", seed=5).ok  # its own values are right


def test_a_backward_without_float64_is_checked_in_float32(broken_ops):
    report = verify.verify_op("fixture::wrong_gradient_f32", device="cpu", seed=5)
    assert [(r.check, r.dtype) for r in report.failures] == [("gradcheck", "float32")]
    assert "Jacobian mismatch" in report.failures[0].message
    report = verify.verify_op("fixture::gradient_f32", device="cpu", seed=5)
    assert report.ok, report.failures
    assert [r.dtype for r in report.results if r.check == "gradcheck"] == ["float32"]


def test_an_op_whose_first_input_is_an_index_is_verified_in_each_of_its_dtypes():
    opforge.load_library(opforge.example_library("rotary_embedding"))
    report = verify.verify_op("examples::rotary_embedding", device="cpu", seed=2)
    assert report.ok, report.failures
    values = [r for r in report.results if r.check == "values"]
    assert {r.dtype for r in values} == {"float32", "float16", "bfloat16"}


def test_correct_fixture_passes(broken_ops):
    assert verify.verify_op("fixture::correct", device="cpu", seed=5).ok


def test_run_time_kernels_are_compiled_without_a_gpu(broken_ops):
    report = verify.verify_op("fixture::cuda_syntax_error", device="cpu", seed=5, dtypes=["float32", "bfloat16"])
    failed = [r for r in report.failures if r.check == "nvrtc"]
    assert [(r.dtype, r.repro["arch"]) for r in failed] == [
        ("float32", "sm_90"),
        ("float32", "sm_80"),
        ("bfloat16", "sm_90"),
        ("bfloat16", "sm_80"),
    ]
    assert "syntax_error.cu(8)" in failed[0].message and "twice_syntax_error<float>" in failed[0].message
    assert failed[0].repro == {"dtypes": {"x": "float32"}, "params": {}, "arch": "sm_90"}
    ok = verify.verify_op("fixture::cuda_correct", device="cpu", seed=5)
    assert {r.case for r in ok.results if r.check == "nvrtc"} == {"sm_90", "sm_80"} and ok.ok


def test_triton_kernels_are_compiled_for_every_case_without_a_gpu(triton_ops, triton_broken_ops):
    """Check "triton": every call the value cases would make on a device, compiled by Triton for
    sm_90 and sm_80; a kernel Triton refuses for float16 fails there (the first such call, with
    Triton's message, the op, the variant and the file), one whose file does not parse in every
    dtype, and the other dtypes pass."""
    report = verify.verify_op("tt::add", device="cpu", seed=5, dtypes=["float32"])
    compiled = [r for r in report.results if r.check == "triton"]
    assert [(r.case.split(", ")[0], r.status) for r in compiled] == [("sm_90", "pass"), ("sm_80", "pass")]
    assert report.ok and not [r for r in report.results if r.check == "nvrtc"]
    broken = verify.verify_op("ttbroken::no_half", device="cpu", seed=5)
    assert [(r.dtype, r.repro["arch"], r.status) for r in broken.results if r.check == "triton"] == [
        ("float32", "sm_90", "pass"),
        ("float32", "sm_80", "pass"),
        ("float16", "sm_90", "FAIL"),
        ("float16", "sm_80", "FAIL"),
    ]
    failed = broken.failures[0]
    case = failed.repro["case"]
    assert failed.message.startswith(
        f"{case}: OpforgeError: ttbroken::no_half: the Triton function no_half_kernel of triton_broken.py: Triton "
        "failed to compile the variant (x_ptr: *fp16 (divisible by 16), y_ptr: *fp16 (divisible by 16)"
    )
    assert "triton_broken.py:10: CompileTimeAssertionFailure: no_half_kernel takes no float16" in failed.message
    assert failed.repro == {
        "arch": "sm_90",
        "case": case,
        "dtypes": {"x": "float16"},
        "params": {},
        "shapes": failed.repro["shapes"],
    } and list(failed.repro["shapes"]) == ["x"]
    syntax = verify.verify_op("ttbroken::syntax", device="cpu", seed=5)
    assert [(r.dtype, r.status) for r in syntax.results if r.check == "triton"] == [
        ("float32", "FAIL"),
        ("float32", "FAIL"),
        ("float16", "FAIL"),
        ("float16", "FAIL"),
    ]
    assert "triton_syntax_error.py:11: SyntaxError: unmatched ')'" in syntax.failures[0].message


@requires_cuda
def test_triton_kernels_are_compared_with_the_reference_on_cuda(triton_ops, triton_broken_ops):
    """On CUDA the Triton kernels run and are compared with the CPU reference (values, opcheck,
    compile, gradcheck through tt::softmax's Triton backward op; the autotuned tt::scale too), and
    nothing is merely compiled; a kernel Triton refuses for float16 fails there with Triton's
    message, and only there."""
    for name in ("tt::add", "tt::softmax", "tt::softmax_backward", "tt::scale"):
        report = verify.verify_op(name, device="cuda", seed=5)
        assert report.ok, [(r.check, r.case, r.message) for r in report.failures]
        assert any(r.check == "values" and r.status == "pass" for r in report.results), name
        assert not [r for r in report.results if r.check in ("triton", "nvrtc")], name
    broken = verify.verify_op("ttbroken::no_half", device="cuda", seed=5)
    assert broken.failures and {r.dtype for r in broken.failures} == {"float16"}
    assert any("no_half_kernel takes no float16" in r.message for r in broken.failures)


@pytest.mark.slow
def test_every_choice_and_unranged_float_is_verified():
    report = example_report("examples::attention", "cpu")
    head_dims = {r.repro["args"][3] for r in report.results if r.check == "values" and r.repro}
    assert head_dims == {32, 64, 128}
    # q, k, v are contiguous_last_dim: layouts the kernel reads in place are among the cases
    assert {"padded rows q", "rows permuted q", "rows permuted v"} <= {r.case for r in report.results}
    assert report.ok, report.failures
    assert {r.case for r in report.results if r.check == "nvrtc"} == {
        f"head_dim={d}, causal={c}, {arch}" for d in (32, 64, 128) for c in (False, True) for arch in ("sm_90", "sm_80")
    }


def test_backward_cases_hold_the_forward_results():
    """attention_backward's o and lse are the forward's results on each case's q, k, v (in the
    case's own layout); its device kernel is compared with a float64 reference (lse, declared
    float32 only, stays float32), the CPU reference with the equivalent at the defaults."""
    import opforge

    opforge.load_library(opforge.example_library("attention"))
    op = opforge.find_op("examples::attention_backward")
    assert op.tolerances == {} and op.tolerance_vs_equivalent == 2.0
    dtypes = {a.name: "float32" if a.name == "lse" else "bfloat16" for a in op.tensors}
    cases = {c.label: c for c in generate_cases(op, dtypes, seed=4)}
    for label in ("shape 3x37", "rows permuted lse", "padded rows o"):
        given = dict(zip((a.name for a in op.args), cases[label].args, strict=True))
        o, lse = torch.ops.examples.attention(
            *(given[n] for n in ("q", "k", "v", "head_dim", "mask", "causal", "scale"))
        )
        assert torch.equal(given["o"], o) and torch.equal(given["lse"], lse), label
    assert not cases["rows permuted lse"].args[5].is_contiguous()  # the case's layout is kept
    (case,) = [c for c in dtype_cases(op, ["bfloat16"]) if c.dtypes["mask"] == "bfloat16"]
    assert floating_as(op, case, "float64", keep_fixed=True) == {**dict.fromkeys(dtypes, "float64"), "lse": "float32"}
    assert floating_as(op, case, "float64") is None  # all floating inputs float64: lse refuses it
    report = verify.verify_op("examples::attention_backward", device="cpu", seed=3, dtypes=["bfloat16"])
    values = [r for r in report.results if r.check == "values"]
    assert values and all(r.tolerance == verify.TOLERANCES["bfloat16"] for r in values)
    assert report.ok, report.failures


def test_the_float64_reference_of_a_case_follows_rules_that_follow_a_parameter():
    """A device case is compared with the reference in float64 wherever the op takes the
    float64 combination: paged_decode_attention's caches take the query's dtype, float64 too,
    only under kv_cache_dtype "auto" (an opforge::when rule), so its "auto" cases get a float64
    query and float64 caches, and its float8 cases a float64 query beside their float8 caches."""
    import opforge

    opforge.load_library(opforge.example_library("paged_decode_attention"))
    op = opforge.find_op("examples::paged_decode_attention")
    cases = {c.label: c for c in dtype_cases(op, device="cuda")}
    wide = {label: floating_as(op, c, "float64", keep_fixed=True) for label, c in cases.items()}
    auto = wide["float16 (kv_cache_dtype=auto)"]
    assert auto is not None and {k: auto[k] for k in ("query", "key_cache", "value_cache")} == dict.fromkeys(
        ("query", "key_cache", "value_cache"), "float64"
    )
    assert auto["k_scale"] == auto["v_scale"] == "float32" and auto["block_tables"] == "int32"
    fp8 = [label for label in wide if "fp8" in label]
    assert len(fp8) == 6
    for label in fp8:
        caches = cases[label].dtypes["key_cache"]
        assert caches.startswith("float8_")
        assert wide[label] is not None and wide[label]["query"] == "float64", label
        assert wide[label]["key_cache"] == wide[label]["value_cache"] == caches, label


def test_error_within_a_factor_of_the_equivalents():
    """FlashAttention's criterion, per output: one that misses its tolerance passes if its largest
    error against the float64 reference is at most the factor times the equivalent's; broken
    results it must refuse."""
    ref = (torch.linspace(-1, 1, 12, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    eq = ((ref[0] + 1e-2 * torch.tensor([1.0, -1.0] * 6)).float(), ref[1].float())
    calls = []

    def within(out, equivalent=eq):
        def run():
            calls.append(1)
            return equivalent

        return compare_outputs(out, ref, "float32", None, equivalent_bound(run, 2.0))

    close = (ref[0].float() - 1.5e-2, ref[1].float())
    assert within(close)[0] and within(close)[2] == pytest.approx(0.75)
    assert within((ref[0].float(), ref[1].float()))[0] and len(calls) == 2  # run only when needed
    ok, _, worst, why = within((ref[0].float() + 3e-2, ref[1].float()))
    assert not ok and worst == pytest.approx(1.5)
    assert why.startswith("output 0: 12 of 12 elements differ") and "; largest error 0.03, more than 2 x" in why
    # an output within its tolerance passes though the equivalent is exact there (the bound is per output)
    assert within((close[0], ref[1].float() + 1e-6))[0]
    # beyond its tolerance where the equivalent is exact: no bound
    ok, _, worst, why = within((close[0], ref[1].float() + 1e-3))
    assert not ok and worst == float("inf") and why.startswith("output 1:")
    nan = close[0].clone()
    nan[3] = float("nan")
    ok, _, _, why = within((nan, ref[1].float()))
    assert not ok and why == "output 0: 12 of 12 elements differ; first at [0]: -1.0149999856948853, expected -1.0"
    # an overflow or NaN of the equivalent's own widens no bound
    wide = eq[0].clone()
    wide[0], wide[1] = float("inf"), float("nan")
    assert within(close, (wide, eq[1]))[0]
    assert not within((close[0] + 5.0, close[1]), (wide, eq[1]))[0]
    # structure the bound never decides: a missing, empty, misshapen or exact output
    assert within((None, close[1]))[3] == "output 0: None, expected the other"
    assert within((torch.empty(0), close[1]))[3].startswith("output 0: shape [0], expected [12]")
    assert within((close[0][:4], close[1]))[3].startswith("output 0: shape [4], expected [12]")
    ints = compare_outputs(
        torch.tensor([1, 1]), torch.tensor([0, 1]), "int64", None, equivalent_bound(lambda: torch.tensor([0, 2]), 2.0)
    )
    assert not ints[0] and ints[3].startswith("1 of 2 elements differ")
    # the equivalent must give each output in its own dtype and shape
    ok, _, _, why = within(close, (eq[0].half(), eq[1]))
    assert not ok and why.endswith("the equivalent's result 0 is [12] torch.float16, expected [12] torch.float32")
    ok, _, _, why = within((close[0], ref[1].float() + 1e-3), eq[:1])
    assert not ok and why.endswith("the equivalent's result 1 is 'NoneType', expected [3] torch.float32")

    def broken():
        raise RuntimeError("expected m1 and m2 to have the same dtype")

    ok, _, _, why = compare_outputs(close, ref, "float32", None, equivalent_bound(broken, 2.0))
    assert not ok and why.endswith(
        "; the equivalent in the case's dtypes raised RuntimeError: expected m1 and m2 to have the same dtype"
    )


def test_attention_backward_is_held_to_its_equivalents_error_in_its_own_dtype():
    """attention_backward's .equivalent() runs in bfloat16 (verify evaluates it in the case's
    dtypes): a result three times as far from the float64 reference as the equivalent fails,
    naming the output; one as far passes."""
    opforge.load_library(opforge.example_library("attention"))
    op = opforge.find_op("examples::attention_backward")
    dtypes = {a.name: "float32" if a.name == "lse" else "bfloat16" for a in op.tensors}
    (case,) = [c for c in generate_cases(op, dtypes, seed=5) if c.label == "params #5"]  # scale 4
    wide = [a.double() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in case.args]
    ref = torch.ops.examples.attention_backward(*wide)
    eq = eval(op.equivalent, {"torch": torch, **dict(zip((a.name for a in op.args), case.args))})  # noqa: S307
    assert all(e.dtype == torch.bfloat16 for e in eq)
    far = tuple((r + 3 * (e.double() - r)).bfloat16() for e, r in zip(eq, ref))
    passed: list[int] = []
    ok, _, worst, why = compare_outputs(far, ref, "bfloat16", None, _equivalent_bound(op, case.args, "cpu", passed))
    assert not ok and why.startswith("output 0:") and "more than 2 x the equivalent's" in why and passed == []
    ok, _, worst, _ = compare_outputs(eq, ref, "bfloat16", None, _equivalent_bound(op, case.args, "cpu", passed))
    assert ok and worst == pytest.approx(0.5) and passed  # the equivalent itself: half the bound


@requires_cuda
def test_attention_backward_kernels_pass_verify_on_cuda():
    """The kernels round P and dS to 16 bits (FlashAttention-2): verify compares them with the
    float64 reference at the 16-bit defaults, and the cases that miss those within twice the
    error of attention_backward's equivalent in the same dtypes (its .tolerance_vs_equivalent)."""
    opforge.load_library(opforge.example_library("attention"))
    report = verify.verify_op("examples::attention_backward", device="cuda", seed=11)
    values = [r for r in report.results if r.check == "values"]
    assert {r.tolerance for r in values} == {verify.TOLERANCES["float16"], verify.TOLERANCES["bfloat16"]}
    assert report.ok, [(r.case, r.dtype, r.message) for r in report.failures]


@requires_cuda
def test_catches_broken_cuda_kernels(broken_ops):
    assert verify.verify_op("fixture::cuda_correct", device="cuda", seed=5).ok
    report = verify.verify_op("fixture::cuda_off_by_one", device="cuda", seed=5, dtypes=["float32"])
    failed = failed_values(report, "fixture::cuda_off_by_one")
    assert "1 of 111 elements differ; first at [2, 36]: nan, expected" in failed["float32 shape 3x37"].message
    assert "float32 empty" not in failed
    report = verify.verify_op("fixture::cuda_wrong_dtype_path", device="cuda", seed=5)
    assert report.failures and {r.dtype for r in report.failures} == {"bfloat16"}


@pytest.mark.slow
def test_cli_exit_code_and_json(broken_ops, tmp_path, opforge_main):
    lib = str(broken_ops.path)  # loaded in this process by the fixture
    out = tmp_path / "report.json"
    argv = [lib, "fixture::off_by_one", "--device", "cpu", "--seed", "9", "--dtype", "float32", "--json", str(out)]
    proc = opforge_main("verify", *argv)
    assert proc.returncode == 1, proc.stderr
    assert "opforge verify on cpu (seed 9)" in proc.stdout
    assert "FAIL fixture::off_by_one values float32 [shape 1x1]" in proc.stdout
    assert "checks failed" in proc.stdout.splitlines()[-1] and "fixture::off_by_one values float32" in proc.stdout
    data = json.loads(out.read_text())
    assert data["seed"] == 9 and data["ok"] is False and data["tolerances"]["float32"] == [1e-5, 1e-5]
    # A fresh Python: an op name alone does not load its library (this process has loaded it).
    ok = subprocess.run(
        [sys.executable, "-m", "opforge", "verify", "examples::softshrink"], capture_output=True, text=True
    )
    assert ok.returncode == 2 and "no loaded op" in ok.stderr


def test_the_report_ends_with_one_summary_line():
    def result(op, check, dtype, status):
        return verify.CaseResult(op, check, dtype, "shape 3x37", status)

    report = verify.Report(seed=1, device="cpu")
    report.results += [result("ns::a", "values", "float32", "pass")] * 3 + [
        result("ns::a", "compile", "float32", "skip")
    ]
    report.results += [result("ns::b", "values", "float16", "pass")]
    assert report.summary() == "2 ops, 3 checks (5 cases), all passed, 1 skipped"
    report.results += [result("ns::b", "values", "float16", "FAIL")] * 2 + [result("ns::a", "out", "float32", "FAIL")]
    assert report.summary() == (
        "2 ops, 4 checks (8 cases), 1 skipped: 2 checks failed (3 cases): ns::b values float16, ns::a out float32"
    )
    assert verify.Report(seed=1, device="cpu", results=[result("ns::a", "meta", "float32", "pass")]).summary() == (
        "1 op, 1 check (1 case), all passed"
    )
    from rich.console import Console

    console = Console(record=True, width=200)
    verify.print_report(report, console)
    assert console.export_text().rstrip().splitlines()[-1] == report.summary()
    # On the CPU, where kernels were compiled (check "nvrtc"), the line before says they did not run.
    report.results.append(result("ns::b", "nvrtc", "float16", "pass"))
    console = Console(record=True, width=400)
    verify.print_report(report, console)
    *_, said, summary = console.export_text().rstrip().splitlines()
    assert summary == report.summary()
    assert said == (
        "on the CPU, the device kernels of ns::b were compiled, not run: the values are the CPU reference against "
        "the op's .equivalent() torch expression (on a GPU, the kernels against the reference)"
    )


def test_model_in_the_cpp_runner(tmp_path):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 32)

        def forward(self, x):
            return torch.ops.examples.softshrink(
                torch.ops.examples.bias_gelu(x @ self.linear.weight.T, self.linear.bias), lambd=0.2
            )

    batch = torch.export.Dim("batch", min=1, max=64)
    reports = verify.verify_model(
        Model(),
        [torch.randn(4, 16)],
        dynamic_shapes=({0: batch},),
        check_inputs=[[torch.randn(4, 16)], [torch.randn(9, 16)]],
        package_dir=tmp_path,
    )
    assert [r.outputs[0].shape for r in reports] == [[4, 32], [9, 32]]
    assert all(r.ok for r in reports), [r.outputs for r in reports]
    assert (tmp_path / "model.pt2").exists()


def test_a_reference_beyond_float16_range_is_its_infinity():
    """torch computes 1e4 ** 2 in float16 as inf; verify's float64 reference must agree."""
    out = torch.tensor([float("inf"), 65024.0, -float("inf")], dtype=torch.float16)
    ok, _, _, why = verify.compare.compare(out, torch.tensor([1e8, 65025.0, -7e4], dtype=torch.float64), "float16")
    assert ok, why
    ok, _, worst, why = verify.compare.compare(out, torch.tensor([1e4, 65025.0, -7e4], dtype=torch.float64), "float16")
    assert not ok and worst == float("inf") and "first at [0]: inf, expected 10000.0" in why


SIGNATURES = {
    "cuda_int_n": ("twice_int_n<float>", "float const*, float*, int", "float const*, float*, int64_t",
                   "parameter 3 (launch value n): expected int64_t, found int"),
    "cuda_float_pointers": ("twice_float_pointers<__half>", "float const*, float*, long long",
                            "__half const*, __half*, int64_t",
                            "parameter 1 (input x): expected __half const*, found float const*\n"
                            "  parameter 2 (output y): expected __half*, found float*"),
    "cuda_scaled_without_a": ("twice_scaled_without_a<float>", "float const*, float*, long long",
                              "float const*, float*, int64_t, double",
                              "parameter 4 (parameter a): expected double, the kernel has no such parameter"),
    "cuda_const_output": ("twice_const_output<float>", "float const*, float const*, long long",
                          "float const*, float*, int64_t",
                          "parameter 2 (output y): expected float*, found float const*"),
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(SIGNATURES))
def test_a_kernel_whose_parameters_differ_is_refused_when_compiled(broken_ops, op, tmp_path):
    name, declared, passed, problems = SIGNATURES[op]
    dtype = torch.float16 if "__half" in name else torch.float32
    with pytest.raises(opforge.OpforgeError) as err:
        opforge.precompile(f"fixture::{op}", {"x": dtype}, arch="sm_90", cache_dir=tmp_path)
    assert str(err.value) == (
        f"fixture::{op}: the run-time kernel {name} (broken_kernels.cu) is declared ({declared}) but is passed "
        f"({passed}); see Note [Run-time kernels] in opforge/op_launch.h:\n  {problems}"
    )
    # verify's NVRTC check reports it too (and a cached binary is checked again: the second arch
    # compiles anew, the first finds the refused binary in the cache and refuses it again).
    report = verify.verify_op(f"fixture::{op}", device="cpu", seed=5, dtypes=[str(dtype).split(".")[1]])
    failed = [r for r in report.failures if r.check == "nvrtc"]
    assert {r.repro["arch"] for r in failed} == {"sm_90", "sm_80"}
    assert all(problems.splitlines()[0] in r.message for r in failed)


def test_cache_entries_are_keyed_by_what_the_kernel_is_passed(broken_ops, tmp_path):
    # One source and one kernel name: the same binary only while the arguments are the same.
    x = {"x": torch.float16}
    assert opforge.precompile("fixture::cache_like_x", x, arch="sm_90", cache_dir=tmp_path) is False
    assert opforge.precompile("fixture::cache_like_x_again", x, arch="sm_90", cache_dir=tmp_path) is True
    # A float32 output (an edited dtype rule) is another entry, not the __half* one.
    assert opforge.precompile("fixture::cache_float_output", x, arch="sm_90", cache_dir=tmp_path) is False
