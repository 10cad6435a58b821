"""Description rules real kernels need, end to end in eager, torch.compile, torch.export and an
AOTInductor package run by the C++ runner: mixed dtypes (``same_dtype("x") | kFloat32``: the
rms_norm example's float32 weight under 16-bit activations), any number of leading dims, size
parameters that are ``SymInt`` in the schema, and an optional input that shapes an optional
output. Fixtures: fixtures/rule_ops.cpp; verify's dtype combinations and float32 gradcheck in
test_verify.py."""

from __future__ import annotations

import json
import re

import pytest
import torch

import opforge
from conftest import DEVICES, requires_cuda
from opforge import aoti, verify


@pytest.fixture(scope="module", autouse=True)
def _rule_ops(rule_ops):
    return rule_ops


def _rms_norm(x, w, eps=1e-6):
    return torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), w.double(), eps)


# ---- mixed dtypes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_takes_a_float32_weight_under_16_bit_inputs(device, dtype):
    x, w = torch.randn(4, 3, 64, dtype=dtype, device=device), torch.randn(64, device=device)
    y = torch.ops.examples.rms_norm(x, w)
    assert y.dtype == dtype and y.shape == x.shape
    # The weight is applied in float32, not rounded to x's dtype first.
    torch.testing.assert_close(y.double(), _rms_norm(x, w).to(dtype).double(), atol=2e-2, rtol=2e-2)
    compiled = torch.compile(lambda a, b: torch.ops.examples.rms_norm(a, b) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), y * 2)


def test_a_dtype_outside_the_alternatives_names_both():
    message = (
        "examples::rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor: invalid arguments\n"
        "  weight: expected dtype bfloat16 (the dtype of x) or float32, got float16"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        torch.ops.examples.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.float16))
    assert opforge.find_op("examples::rms_norm").arg("weight").dtype_alternatives == ("float32",)


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(64))  # float32, as checkpoints keep norm weights

    def forward(self, x):
        return torch.ops.examples.rms_norm(x, self.weight)


def _norm_dims():
    return {0: torch.export.Dim("batch", min=1, max=1024), 1: torch.export.Dim("seq", min=1, max=1024)}


@requires_cuda
def test_mixed_dtypes_and_leading_dims_through_export_and_the_runner_on_cuda(tmp_path):
    model = Norm().cuda().eval()
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16, device="cuda")  # two leading dims, both dynamic
    program = torch.export.export(model, (x,), dynamic_shapes=(_norm_dims(),))
    package = aoti.package(program, tmp_path / "pkg", archs=["sm_90"])
    for rows, seq in ((1, 7), (9, 2)):
        x = torch.randn(rows, seq, 64, dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            expected = model(x).cpu()
        result = aoti.run(package, [x], device="cuda")
        torch.testing.assert_close(result.outputs[0], expected)


def test_mixed_dtypes_and_leading_dims_through_export_and_the_runner(rules_package):
    norm = rules_package.model.norm
    for rows, seq in ((1, 7), (9, 2)):
        x = torch.randn(rows, seq, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            expected = norm(x)
        torch.testing.assert_close(rules_package.run(norm_x=x)[0], expected)


# ---- leading dims ---------------------------------------------------------------------------------


def test_any_number_of_leading_dims():
    w = torch.randn(16)
    for shape in ((16,), (2, 16), (2, 3, 4, 16), (0, 16)):
        x = torch.randn(*shape)
        torch.testing.assert_close(torch.ops.examples.rms_norm(x, w), _rms_norm(x, w).float())
    assert opforge.find_op("examples::rms_norm").arg("x").leading_dims
    with pytest.raises(ValueError, match=re.escape("x: expected rank >= 1, got rank 0 (shape [])")):
        torch.ops.examples.rms_norm(torch.randn(()), torch.randn(1))


def test_verify_covers_no_and_several_leading_dims():
    report = verify.verify_op("examples::rms_norm", device="cpu", seed=3, dtypes=["float32"])
    assert report.ok, report.failures
    ranks = {r.case: len(r.repro["args"][0]["shape"]) for r in report.results if r.check == "values" and r.repro}
    assert ranks["no leading dims"] == 1 and ranks["3 leading dims"] == 4


# ---- size parameters ------------------------------------------------------------------------------


def test_a_size_parameter_is_symint_and_compiles_once():
    assert "SymInt n" in opforge.find_op("fixture::cycle_rows").schema
    frames = torch._dynamo.testing.CompileCounter()
    fn = torch.compile(lambda x: torch.ops.fixture.cycle_rows(x, x.shape[0] + 1), backend=frames, dynamic=True)
    for rows in (2, 3, 5, 8, 13, 21):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(fn(x), torch.cat([x, x[:1]]))
    assert frames.frame_count == 1  # an `int n` recompiled for every size


def test_a_size_parameter_is_checked_when_the_call_runs():
    fn = torch.compile(lambda x, n: torch.ops.fixture.cycle_rows(x, n), fullgraph=True, dynamic=True)
    torch.testing.assert_close(fn(torch.ones(2, 3), 3), torch.ones(3, 3))
    with pytest.raises(Exception, match=re.escape("n: expected a value >= 0, got -1")):
        fn(torch.ones(2, 3), -1)


class CycleRows(torch.nn.Module):
    def forward(self, x):
        return torch.ops.fixture.cycle_rows(x, x.shape[0] * 2)


def test_a_size_parameter_through_export_and_the_runner(rules_package):
    for rows in (1, 6):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(rules_package.run(cycle_x=x)[1], torch.cat([x, x]))


# ---- an optional input shaping an optional output -------------------------------------------------


def test_an_optional_output_exists_with_its_input():
    op = opforge.find_op("fixture::scale_pair")
    assert op.schema.endswith("-> (Tensor, Tensor?)") and op.out_schema is None
    assert op.outputs[1].present_with == "key"
    x, key = torch.randn(3, 4), torch.randn(5)
    y, key_out = torch.ops.fixture.scale_pair(x, key)
    torch.testing.assert_close((y, key_out), (2 * x, 2 * key))
    y, key_out = torch.ops.fixture.scale_pair(x)
    assert key_out is None
    torch.testing.assert_close(y, 2 * x)


def test_stubs_type_an_optional_output_as_maybe_none(rule_ops, tmp_path):
    from opforge.stubs import write_stubs

    stub = next(p for p in write_stubs(rule_ops, tmp_path) if p.suffix == ".pyi").read_text()
    scale_pair = stub.split("class _scale_pair:")[1].split("\nclass ")[0]
    assert "-> tuple[Tensor, Tensor | None]:" in scale_pair, scale_pair


def test_an_optional_output_under_compile():
    def fn(x, key):
        y, k = torch.ops.fixture.scale_pair(x, key, alpha=3.0)
        z, none = torch.ops.fixture.scale_pair(x)
        return y + z, k * 2, none is None

    x, key = torch.randn(3, 4), torch.randn(2, 2)
    out = torch.compile(fn, fullgraph=True, dynamic=True)(x, key)
    torch.testing.assert_close(out[:2], (5 * x, 6 * key))
    assert out[2] is True


class ScalePair(torch.nn.Module):
    def forward(self, x, key):
        y, k = torch.ops.fixture.scale_pair(x, key)
        z, _ = torch.ops.fixture.scale_pair(x)  # its key_out is None inside the graph
        return y + z, k


def test_an_optional_output_through_export_and_the_runner(rules_package):
    x, key = torch.randn(5, 4), torch.randn(2)
    outputs = rules_package.run(pair_x=x, pair_key=key)
    torch.testing.assert_close(outputs[2], 4 * x)
    torch.testing.assert_close(outputs[3], 2 * key)


def test_verify_passes_an_op_with_an_optional_output():
    report = verify.verify_op("fixture::scale_pair", device="cpu", seed=7)
    assert report.ok, report.failures
    assert any(r.case.endswith("without key") for r in report.results)


# ---- data-dependent sizes -------------------------------------------------------------------------

_X = [1.0, -2.0, 3.0, -4.0, 5.0, 0.25, 7.0]


@pytest.mark.parametrize("device", DEVICES)
def test_a_data_dependent_size_is_what_the_kernel_wrote(device):
    x = torch.tensor(_X, device=device)
    count, kept = torch.ops.fixture.compact(x, 0.5)
    assert count.item() == 4 and kept.shape == (4,) and kept.is_contiguous()
    torch.testing.assert_close(kept.cpu(), torch.tensor([1.0, 3.0, 5.0, 7.0]))
    count, kept = torch.ops.fixture.compact(x, 100.0)
    assert count.item() == 0 and kept.shape == (0,)
    assert opforge.find_op("fixture::compact").outputs[1].size_from == "count"


def test_a_kernel_that_reports_more_than_the_bound_is_refused():
    message = (
        "fixture::compact_overflow: the kernel wrote 4 into 'count', the size of 'kept', which must be in "
        "[0, x.size(0) = 3]"
    )
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.ops.fixture.compact_overflow(torch.ones(3))


@pytest.mark.parametrize("device", DEVICES)
def test_a_data_dependent_size_under_compile(device):
    def fn(x):
        count, kept = torch.ops.fixture.compact(x, 0.5)
        return kept * 2 + 1, count

    compiled = torch.compile(fn, fullgraph=True)
    for values in (_X, [-1.0, 2.0], [-1.0]):
        x = torch.tensor(values, device=device)
        torch.testing.assert_close(compiled(x), fn(x))


class Compaction(torch.nn.Module):
    """Keeps x's elements above 0.5, then adds bias with bias_gelu, whose bias must have the kept
    length: a rule over an unbacked size."""

    def forward(self, x, bias):
        _, kept = torch.ops.fixture.compact(x, 0.5)
        return torch.ops.examples.bias_gelu(kept, bias)


def _compaction_dims():
    return {0: torch.export.Dim("n", min=2, max=1024)}, {0: torch.export.Dim("k", min=2, max=1024)}


@pytest.fixture(scope="module")
def compaction_program():
    return torch.export.export(Compaction(), (torch.tensor(_X), torch.randn(4)), dynamic_shapes=_compaction_dims())


def _gelu_of(kept, bias):
    return torch.nn.functional.gelu(kept + bias)


def test_a_data_dependent_size_through_export(compaction_program):
    x, bias = torch.tensor(_X), torch.randn(4)
    torch.testing.assert_close(compaction_program.module()(x, bias), _gelu_of(torch.tensor([1.0, 3.0, 5.0, 7.0]), bias))
    # A bias of another length: the op's own check, naming it and the argument, not Eq(u0, s1).
    message = "examples::bias_gelu(Tensor x, Tensor bias) -> Tensor: invalid arguments\n  bias: expected shape"
    with pytest.raises(ValueError, match=re.escape(message)):
        compaction_program.module()(x, torch.randn(3))


def test_a_data_dependent_size_through_the_runner(rules_package):
    x, bias = torch.tensor(_X + [9.0]), torch.randn(5)
    outputs = rules_package.run(compact_x=x, compact_bias=bias)
    torch.testing.assert_close(outputs[4], _gelu_of(torch.tensor([1.0, 3.0, 5.0, 7.0, 9.0]), bias))
    with pytest.raises(
        opforge.OpforgeError, match=re.escape("bias: expected shape [x.size(-1)] = [5], got [3]")
    ) as err:
        rules_package.run(compact_x=x, compact_bias=torch.randn(3))
    # AOTInductor's proxy executor only logs the op's exception; the runner fails the run itself
    assert "opforge-runner: an op failed while running" in str(err.value)


# ---- autocast policies ----------------------------------------------------------------------------


class LinearGelu(torch.nn.Module):
    """A Linear (bfloat16 under autocast) into bias_gelu with its float32 bias (autocast kPromote)."""

    def __init__(self, device="cpu"):
        super().__init__()
        self.linear = torch.nn.Linear(8, 16, device=device)
        self.bias = torch.nn.Parameter(torch.randn(16, device=device))

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return torch.ops.examples.bias_gelu(self.linear(x), self.bias)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_promotes_a_16_bit_activation_and_its_float32_bias(device):
    model, x = LinearGelu(device).requires_grad_(False), torch.randn(4, 8, device=device)
    assert opforge.find_op("examples::bias_gelu").autocast == "promote"
    with torch.autocast(device, dtype=torch.bfloat16):
        h = model.linear(x)
    assert h.dtype == torch.bfloat16
    y = model(x)
    assert y.dtype == torch.float32  # promoted: bf16 activation with the float32 bias
    torch.testing.assert_close(y, torch.nn.functional.gelu(h.float() + model.bias), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), y)


def test_autocast_in_an_exported_model_and_the_runner(rules_package):
    model, x = rules_package.model.amp, torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(rules_package.program.module()(**rules_package.inputs(amp_x=x))[5], expected)
    out = rules_package.run(amp_x=x)[5]
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# ---- one AOTInductor package for the rules above --------------------------------------------------


class RuleModels(torch.nn.Module):
    """The models above side by side, so that their checks through the C++ runner share one
    AOTInductor package (each package takes seconds of C++ compiling): outputs Norm, CycleRows,
    ScalePair (two), Compaction and LinearGelu in that order."""

    def __init__(self):
        super().__init__()
        self.norm, self.cycle, self.pair = Norm().eval(), CycleRows(), ScalePair()
        self.compaction, self.amp = Compaction(), LinearGelu().requires_grad_(False)

    def forward(self, norm_x, cycle_x, pair_x, pair_key, compact_x, compact_bias, amp_x):
        return (
            self.norm(norm_x),
            self.cycle(cycle_x),
            *self.pair(pair_x, pair_key),
            self.compaction(compact_x, compact_bias),
            self.amp(amp_x),
        )


class RulesPackage:
    """RuleModels exported with each model's dynamic dims and packaged once; :meth:`run` runs it
    in the C++ runner with the given inputs and every other input at its default."""

    def __init__(self, folder):
        self.model = RuleModels()
        defaults = self.inputs()
        compact_x_dims, compact_bias_dims = _compaction_dims()
        dims = {
            "norm_x": _norm_dims(),
            "cycle_x": {0: torch.export.Dim("cycle_rows", min=1, max=256)},
            "pair_x": {0: torch.export.Dim("pair_rows", min=1, max=64)},
            "pair_key": {0: torch.export.Dim("pair_n")},
            "compact_x": compact_x_dims,
            "compact_bias": compact_bias_dims,
            "amp_x": {0: torch.export.Dim("amp_batch", min=1, max=64)},
        }
        self.program = torch.export.export(self.model, (), defaults, dynamic_shapes=dims)
        self.package = aoti.package(self.program, folder)

    @staticmethod
    def inputs(**given):
        defaults = {
            "norm_x": torch.randn(3, 5, 64, dtype=torch.bfloat16),
            "cycle_x": torch.randn(3, 4),
            "pair_x": torch.randn(3, 4),
            "pair_key": torch.randn(6),
            "compact_x": torch.tensor(_X),
            "compact_bias": torch.randn(4),
            "amp_x": torch.randn(4, 8),
        }
        return defaults | given

    def run(self, **given):
        return aoti.run(self.package, list(self.inputs(**given).values()), device="cpu").outputs


@pytest.fixture(scope="module")
def rules_package(tmp_path_factory):
    return RulesPackage(tmp_path_factory.mktemp("rules") / "pkg")


def test_autocast_float32_and_lower_precision_policies():
    x, r = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16)
    w, b = torch.randn(16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.ops.examples.add_layer_norm(x, r, w, b)  # kFloat32, as torch's layer_norm
        z = torch.ops.fixture.scale_lp(torch.ones(4))  # kLowerPrecision: float32 in, bfloat16 out
    assert y.dtype == torch.float32 and z.dtype == torch.bfloat16
    ref = torch.nn.functional.layer_norm(x.float() + r.float(), (16,), w.float(), b.float())
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z, torch.full((4,), 3.0, dtype=torch.bfloat16))
    assert torch.ops.fixture.scale_lp(torch.ones(4)).dtype == torch.float32  # outside autocast: as called


def test_a_policy_the_dtype_rules_cannot_take_is_refused_at_load(tmp_path):
    src = tmp_path / "bad_autocast.cpp"
    src.write_text(
        "#include <opforge/op.h>\n"
        "static void copy(opforge::Tensor x, opforge::MutableTensor y) {}\n"
        'OPFORGE_OP(badcast, half_only).input("x", opforge::half_precision).output("y", opforge::like("x"))\n'
        "    .autocast(opforge::Autocast::kFloat32).reference(copy);\n"
    )
    path = opforge.build_library("bad_autocast", [src], build_dir=tmp_path / "build")
    with pytest.raises(ValueError, match=re.escape("badcast::half_only: autocast(kFloat32) casts every floating")):
        opforge.load_library(path)


def test_names_the_out_overload_cannot_take_are_refused_at_load(tmp_path):
    # The out= overload takes the outputs as keyword arguments beside the op's arguments, and
    # torch.fx calls a "self" argument "input": torch.compile of the overload would fail on either.
    src = tmp_path / "out_names.cpp"
    src.write_text(
        "#include <opforge/op.h>\n"
        "static void copy(opforge::Tensor x, opforge::MutableTensor y) {}\n"
        'OPFORGE_OP(outnames, self_in).input("self", opforge::kFloat32).output("input", opforge::like("self"))\n'
        "    .reference(copy);\n"
        'OPFORGE_OP(outnames, self_out).input("x", opforge::kFloat32).output("self", opforge::like("x"))\n'
        "    .reference(copy);\n"
    )
    path = opforge.build_library("out_names", [src], build_dir=tmp_path / "build")
    with pytest.raises(ValueError) as err:
        opforge.load_library(path)
    assert str(err.value).splitlines()[1:] == [
        f'{src}:3: outnames::self_in: input \'self\': "self" beside an output named "input", an argument of the '
        'out= overload: torch\'s Python signatures call a "self" argument "input", so the two collide under '
        "torch.compile; rename one",
        f"{src}:5: outnames::self_out: output 'self': \"self\" is a keyword argument of the out= overload, which "
        'torch.compile cannot pass (torch\'s operator methods take their own "self"); rename it',
    ]
    assert not hasattr(torch.ops.outnames, "self_in")  # nothing was registered


# ---- verify: dtype combinations and --dtype with integer inputs -----------------------------------


def test_verify_tests_every_dtype_combination():
    report = verify.verify_op("examples::rms_norm", device="cpu", seed=1)
    assert report.ok, report.failures
    assert {r.dtype for r in report.results if r.check == "values"} == {
        "float32",
        "float64",
        "float64 (weight=float32)",
        "float16",
        "float16 (weight=float32)",
        "bfloat16",
        "bfloat16 (weight=float32)",
    }
    # A case is compared at the tolerance of its least precise dtype.
    tolerances = {r.dtype: r.tolerance for r in report.results if r.check == "values"}
    assert tolerances["bfloat16 (weight=float32)"] == verify.TOLERANCES["bfloat16"]
    assert tolerances["float64 (weight=float32)"] == verify.TOLERANCES["float32"]


def test_verify_dtype_option_with_an_integer_first_input(tmp_path, opforge_main):
    out = tmp_path / "report.json"
    proc = opforge_main("verify", "rotary_embedding", "--device", "cpu", "--dtype", "float16", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {r["dtype"] for r in json.loads(out.read_text())["results"]} == {"float16"}
    opforge.load_library(opforge.example_library("rotary_embedding"))
    with pytest.raises(ValueError, match=re.escape("query takes float32, float16, bfloat16")):
        verify.verify_op("examples::rotary_embedding", device="cpu", dtypes=["int64"])
