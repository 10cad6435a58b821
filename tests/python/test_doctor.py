"""opforge.doctor on the CPU: graph breaks with their module path and source line, custom ops
missing a Meta/fake kernel or a backward (opforge ops from their description, torch.library
custom ops from their registrations), a model torch.compile cannot trace reported and not raised.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch

import opforge


@torch.library.custom_op("doctor_test::host_scale", mutates_args=())
def host_scale(x: torch.Tensor) -> torch.Tensor:
    """Computed on the host with NumPy, as research code often is: no fake kernel, no backward."""
    return torch.from_numpy(x.detach().cpu().numpy() * 2.0)


class Breaks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        if h.sum().item() > 1e9:  # a data-dependent branch: dynamo breaks the graph here
            h = h * 2
        return torch.ops.examples.softshrink(h, 0.1)


class Host(torch.nn.Module):
    def forward(self, x):
        return host_scale(x) + 1


class Model(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.block = inner
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.block(x))


def line_of(cls, text: str) -> int:
    lines, first = inspect.getsourcelines(cls.forward)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_graph_break_names_its_module_and_line():
    opforge.load_library(opforge.example_library("softshrink"))
    report = opforge.doctor(Model(Breaks()), (torch.randn(4, 8),))
    breaks = [f for f in report.findings if f.kind == "graph_break"]
    assert len(breaks) == 1, report.findings
    assert breaks[0].module == "block"
    assert breaks[0].source == f"{__file__}:{line_of(Breaks, '.item()')}"
    assert "item()" in breaks[0].message
    # examples::softshrink has a CUDA kernel, a fake kernel and a backward op: nothing to report
    assert [f for f in report.findings if f.op is not None] == []


def test_a_host_op_without_fake_kernel_or_backward_and_a_model_compile_cannot_trace(capsys):
    report = opforge.doctor(Model(Host()), (torch.randn(4, 8),))
    kinds = {(f.kind, f.op) for f in report.findings}
    assert ("missing_fake_kernel", "doctor_test::host_scale") in kinds
    assert ("missing_backward", "doctor_test::host_scale") in kinds
    assert ("missing_cuda_kernel", "doctor_test::host_scale") not in kinds  # its one impl serves any device
    (fake,) = [f for f in report.findings if f.kind == "missing_fake_kernel"]
    assert fake.module == "block" and fake.source == f"{__file__}:{line_of(Host, 'host_scale(x)')}"
    (error,) = [f for f in report.findings if f.kind == "compile_error"]
    assert error.message.startswith("torch.compile cannot trace the model")
    assert [f.cost_ms for f in report.findings] == sorted((f.cost_ms for f in report.findings), reverse=True)
    assert json.loads(json.dumps(report.to_json()))["findings"][0]["kind"] == report.findings[0].kind
    report.print_table()
    assert "missing_fake_kernel" in capsys.readouterr().out


def test_an_opforge_op_without_a_backward_op_is_named(rule_ops):
    assert opforge.find_op("fixture::cycle_rows").backward is None

    class Cycle(torch.nn.Module):
        def forward(self, x):
            return torch.ops.fixture.cycle_rows(x, 1)

    report = opforge.doctor(Cycle(), (torch.randn(3, 4),))
    assert {(f.kind, f.op, f.module) for f in report.findings if f.op} == {
        ("missing_backward", "fixture::cycle_rows", ""),
        ("missing_cuda_kernel", "fixture::cycle_rows", ""),  # the fixture has a CPU reference only
    }


class Print(torch.nn.Module):
    def forward(self, x):
        print("inside a nested module")  # a graph break dynamo counts without a reason here
        return x + 1


def test_a_break_in_a_nested_module_is_counted_and_bad_arguments_are_refused():
    model = Model(torch.nn.Sequential(Print(), torch.nn.Linear(8, 8)))
    report = opforge.doctor(model, torch.randn(4, 8))  # one tensor: the only argument
    assert [f.kind for f in report.findings].count("graph_break") >= 1
    with pytest.raises(TypeError, match="inputs must be a tensor or a tuple"):
        opforge.doctor(model, {"x": torch.randn(4, 8)})
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        opforge.doctor(lambda x: x, (torch.randn(2),))


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # Python state the graph reads: each call fails a guard
        return x * self.calls


def test_a_recompile_names_the_guard_and_its_line():
    report = opforge.doctor(Counter(), (torch.randn(3),))
    recompiles = [f for f in report.findings if f.kind == "recompile"]
    assert recompiles, report.findings
    assert "self.calls" in recompiles[0].message or "calls" in recompiles[0].message
    assert recompiles[0].source == f"{__file__}:{line_of(Counter, 'self.calls += 1')}"
    assert recompiles[0].module == ""


def test_the_command_line_writes_the_findings_as_json(tmp_path, capsys):
    from opforge.__main__ import main

    spec = tmp_path / "make.py"
    spec.write_text(
        "import torch\n"
        "class Counter(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.calls = 0\n"
        "    def forward(self, x):\n"
        "        self.calls += 1\n"
        "        return x * self.calls\n"
        "def make():\n"
        "    return Counter(), (torch.randn(3),)\n"
    )
    out = tmp_path / "report.json"
    assert main(["doctor", f"{spec}:make", "--json", str(out)]) == 0
    findings = json.loads(out.read_text())["findings"]
    assert any(f["kind"] == "recompile" and f["source"] == f"{spec}:7" for f in findings), findings
    assert main(["doctor", f"{spec}:nothing"]) == 2
    assert f"{spec} has no function nothing" in capsys.readouterr().err
    assert main(["doctor", "no_colon"]) == 2
    assert "expected file.py:function or module:function" in capsys.readouterr().err
