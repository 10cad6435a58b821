"""opforge.doctor: graph breaks with their module path and source line, custom ops missing a
Meta/fake kernel or a backward (opforge ops from their description, torch.library custom ops
from their registrations), a model torch.compile cannot trace reported and not raised; the
profiled step's timeline (source lines, trace, picture) and what it finds (copies,
synchronisations, GPU idle gaps; on a GPU, CPU fallbacks); the worked example end to end.
"""

from __future__ import annotations

import importlib
import inspect
import json

import numpy as np
import pytest
import torch

import opforge
from conftest import DEVICES, requires_cuda
from opforge._timeline import HostOp, Timeline, profile_step, timeline_findings


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
    assert json.loads(json.dumps(report.to_dict()))["findings"][0]["kind"] == report.findings[0].kind
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


@pytest.mark.parametrize("device", DEVICES)
def test_ops_whose_kernels_are_triton_are_complete_and_a_missing_backward_is_named(triton_ops, device):
    """An op with a Triton kernel has a CUDA kernel and a fake kernel (its description says so);
    tt::softmax's backward op is Triton too, tt::add has none. On CUDA the Triton kernels run
    (launched from C++), and nothing falls back to the CPU."""

    class Model(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.tt.softmax(torch.ops.tt.add(x, y))

    report = opforge.doctor(Model(), (torch.randn(3, 8, device=device), torch.randn(3, 8, device=device)))
    assert {(f.kind, f.op, f.module) for f in report.findings if f.op and f.op.startswith("tt::")} == {
        ("missing_backward", "tt::add", ""),
    }
    assert not [f for f in report.findings if f.kind == "cpu_fallback"], report.findings


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


class NumpyAct(torch.nn.Module):
    """An activation through host memory, as research code writes it."""

    def forward(self, x):
        y = x.detach().cpu().numpy()
        y = np.tanh(y) * 2.0
        return torch.from_numpy(y).to(x.device)


class Syncs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.act = NumpyAct()

    def forward(self, x):
        h = self.act(self.lin(x))
        scale = h.abs().max().item()  # the host waits for the GPU
        return torch.special.erf(h.cpu() / scale).to(x.device)  # computed on the CPU


def test_the_timeline_names_each_operator_s_line_and_is_written_as_trace_and_picture(tmp_path):
    model = Syncs()
    report = opforge.doctor(model, torch.randn(16, 64), trace=tmp_path / "t.json", plot=tmp_path / "t.png")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in events)
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sources = {op.name: op.source for op in report.timeline.host}
    assert sources["aten::linear"] == f"{__file__}:{line_of(Syncs, 'self.act(self.lin(x))')}"
    assert sources["aten::item"] == f"{__file__}:{line_of(Syncs, '.item()')}"
    assert not report.timeline.cuda  # a model on the CPU: the GPU is not profiled, even where there is one
    if not torch.cuda.is_available():  # no GPU at all: no copies, gaps or fallbacks to report
        assert not {"copy", "sync", "gpu_idle", "cpu_fallback"} & {f.kind for f in report.findings}


@pytest.mark.parametrize("folder", ["opforge", "torch"])
def test_the_user_s_files_in_a_folder_named_opforge_or_torch_keep_their_lines(tmp_path, monkeypatch, folder):
    """A clone is a folder named opforge (what git clone makes), and a user's project may sit in
    one named torch: their files are the user's, whatever the folder is called. Only the frames of
    torch's and opforge's packages, where this process imported them from, are library code."""
    where = tmp_path / folder / "models"
    where.mkdir(parents=True)
    module = f"user_model_in_{folder}"
    (where / f"{module}.py").write_text(
        "import torch\n\n\nclass Double(torch.nn.Module):\n    def forward(self, x):\n        return torch.mul(x, 2)\n"
    )
    monkeypatch.syspath_prepend(str(where))
    model = importlib.import_module(module).Double()
    (mul,) = [op for op in profile_step(model, (torch.randn(4, 8),), cuda=False).host if op.name == "aten::mul"]
    assert mul.source == f"{where / module}.py:6"


def synthetic(ops, device) -> Timeline:
    """A timeline of host ops (name, start, end, copies, sync_us) and GPU activity, in microseconds."""
    host = [
        HostOp(n, s, e, f"model.py:{i + 1}", [[4, 8]], copies=c, sync_us=w) for i, (n, s, e, c, w) in enumerate(ops)
    ]
    return Timeline(0.0, 1000.0, host, device, cuda=True)


def test_gaps_copies_and_synchronisations_from_a_timeline():
    tl = synthetic(
        [
            ("aten::to", 100, 150, ["DtoH"], 30.0),  # x.cpu(): a copy that waits for the GPU
            ("aten::to", 600, 640, ["HtoD"], 0.0),  # .to("cuda") after NumPy ran from 150 to 600
            ("aten::item", 700, 720, ["DtoH"], 15.0),  # .item(): a synchronisation, not a copy
            ("aten::sort", 760, 990, [], 0.0),  # a host op that covers the last gap
        ],
        [("k1", 0.0, 100.0), ("Memcpy DtoH (Device -> Pageable)", 120, 130), ("k2", 640, 700), ("k3", 720, 750)],
    )
    found = timeline_findings(tl, min_gap_us=100.0)
    kinds = [(f.kind, f.source) for f in found]
    assert ("copy", "model.py:1") in kinds and ("copy", "model.py:2") in kinds
    assert ("sync", "model.py:3") in kinds and ("copy", "model.py:3") not in kinds
    (copy,) = [f for f in found if f.kind == "copy" and f.source == "model.py:1"]
    assert copy.message == "aten::to copied [4, 8] GPU to host, 0.030 ms of it waiting for the GPU"
    gaps = [f for f in found if f.kind == "gpu_idle"]
    assert [g.span_us for g in gaps] == [(130, 640), (750, 1000)]
    assert gaps[0].cost_ms == pytest.approx(0.51)
    assert "the host ran Python outside torch operators for 0.450 ms, between aten::to at model.py:1" in gaps[0].message
    assert gaps[0].source == "model.py:1" and not gaps[0].at_edge
    assert "the host ran aten::sort for 0.230 ms of it" in gaps[1].message and gaps[1].source == "model.py:4"
    assert timeline_findings(tl, min_gap_us=600.0) == [f for f in found if f.kind != "gpu_idle"]


def test_python_at_the_step_s_start_is_a_gap_at_the_edge_not_a_layer_to_rewrite():
    tl = synthetic([("aten::linear", 300, 320, [], 0.0)], [("k1", 320, 1000)])
    (gap,) = timeline_findings(tl, min_gap_us=100.0)
    assert gap.span_us == (0.0, 320) and gap.at_edge
    assert "between the step's start or end and aten::linear at model.py:1" in gap.message


def test_a_gap_at_the_step_s_edge_is_drawn_but_is_no_finding():
    from types import SimpleNamespace

    from opforge._doctor import DoctorReport, _timeline_findings

    tl = synthetic([("aten::linear", 300, 320, [], 0.0)], [("k1", 320, 1000)])
    report = DoctorReport(1.0, timeline=tl, timeline_findings=timeline_findings(tl, min_gap_us=100.0))
    assert [f.at_edge for f in report.timeline_findings] == [True]  # shaded on the plot
    assert _timeline_findings(torch.nn.Identity(), report, SimpleNamespace(sites={})) == []


def demo_module():
    """examples/models/doctor_demo.py as a module (its main() not run)."""
    import importlib.util

    from readme_blocks import ROOT

    spec = importlib.util.spec_from_file_location("doctor_demo", ROOT / "examples" / "models" / "doctor_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demo_states_the_ratio_the_way_it_goes():
    comparison = demo_module().comparison
    assert comparison(279.0, 1.0) == "eager step: before 279.00 ms, after 1.00 ms: the fixed model is 279.0 x faster"
    assert comparison(1.0, 1.25) == "eager step: before 1.00 ms, after 1.25 ms: the fixed model is 1.2 x slower"
    assert comparison(1.0, 1.02) == "eager step: before 1.00 ms, after 1.02 ms: the fixed model is about as fast"
    assert comparison(1.02, 1.0) == "eager step: before 1.02 ms, after 1.00 ms: the fixed model is about as fast"


@requires_cuda
def test_on_the_gpu_copies_syncs_gaps_and_a_cpu_fallback_are_found(tmp_path):
    model = Syncs().cuda()
    report = opforge.doctor(model, torch.randn(2048, 64, device="cuda"), plot=tmp_path / "t.png")
    by_kind = {}
    for f in report.findings:
        by_kind.setdefault(f.kind, []).append(f)
    act = f"{__file__}:{line_of(NumpyAct, '.cpu().numpy()')}"
    assert any(f.source == act and f.module == "act" and "GPU to host" in f.message for f in by_kind["copy"])
    back = f"{__file__}:{line_of(NumpyAct, '.to(x.device)')}"
    assert any(f.source == back and "host to GPU" in f.message for f in by_kind["copy"])
    assert any(f.source == f"{__file__}:{line_of(Syncs, '.item()')}" for f in by_kind["sync"]), report.findings
    assert any(f.source == act for f in by_kind["gpu_idle"]), by_kind.get("gpu_idle")
    erf = f"{__file__}:{line_of(Syncs, 'special.erf')}"
    fallback = [f for f in by_kind["cpu_fallback"] if f.source == erf and f.op == "aten::erf"]
    assert fallback and fallback[0].module == "" and fallback[0].suggestion is None  # the model, not a layer
    suggested = [f.suggestion for f in by_kind["copy"] if f.source == act]
    assert suggested == ["opforge new my_ops::act --dtypes float32 --shape 2048,64"]


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(NumpyAct() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@requires_cuda
def test_a_layer_repeated_in_a_list_is_one_finding_with_each_module_path():
    report = opforge.doctor(Blocks().cuda(), torch.randn(256, 64, device="cuda"))
    act = f"{__file__}:{line_of(NumpyAct, '.cpu().numpy()')}"
    (copy,) = [f for f in report.findings if f.kind == "copy" and f.source == act]
    assert copy.module == "layers.*" and "(3 times," in copy.message
    assert copy.suggestion == "opforge new my_ops::numpy_act --dtypes float32 --shape 256,64"


@pytest.mark.slow
def test_the_demo_finds_the_host_activation_and_the_break_and_the_fix_clears_them(tmp_path):
    """The README's command as written (on a machine without a GPU, on the CPU at fewer tokens)."""
    import shlex
    import subprocess
    import sys

    from readme_blocks import ROOT, command

    argv = shlex.split(command("python examples/models/doctor_demo.py"))[1:]
    if not torch.cuda.is_available():
        argv += ["--device", "cpu", "--tokens", "64"]
    run = subprocess.run(
        [sys.executable, *argv, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["problems"] == []
    assert (tmp_path / "timelines.png").exists() and (tmp_path / "before_trace.json").exists()
    # One step time per model: the tables' medians are the ones compared and written.
    import re

    tables = re.findall(r"eager step ([\d.]+) ms \(median of 3\)", run.stdout)
    assert tables == [f"{results['step_ms'][k]:.2f}" for k in ("before", "after")]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("eager step: before")]
    assert line == demo_module().comparison(results["step_ms"]["before"], results["step_ms"]["after"])
    assert all(f["source"] is not None for f in results["findings"]["after"])
    if torch.cuda.is_available():
        assert results["device"] == "cuda" and results["speedup"] > 1.0


class Checked(torch.nn.Module):
    def __init__(self, check: bool):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.check = check

    def forward(self, x):
        h = self.lin(x)
        if self.check:
            print("checking", h.mean().item())  # only the instance that checks breaks the graph
        return torch.relu(h)


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Checked(False) for _ in range(3))
        self.final = Checked(True)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.final(x)


class PrintInLoop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
            print(x.shape)  # a break inside a loop: dynamo runs the whole forward eagerly
        return x


class Identity(torch.nn.Module):
    def forward(self, x, scale=1.0):
        return x


def test_breaks_name_the_instance_that_ran_them_and_a_skipped_forward_says_why(tmp_path, capsys):
    from opforge.__main__ import main

    report = opforge.doctor(Outer(), torch.randn(2, 8))
    (brk,) = [f for f in report.findings if f.kind == "graph_break"]
    assert brk.module == "final" and brk.source == f"{__file__}:{line_of(Checked, '.item()')}"
    assert "item()" in brk.message and ":" in brk.message  # dynamo's first line and its explanation
    (eager,) = [f for f in opforge.doctor(PrintInLoop(), torch.randn(2, 8)).findings if f.kind == "graph_break"]
    assert eager.message.startswith("torch.compile runs this forward eagerly: ") and "print" in eager.message
    assert opforge.doctor(Identity(), (torch.randn(2, 8), 2.0)).findings == []  # nothing to compile
    assert opforge.doctor(torch.compile(Outer()), torch.randn(2, 8)).findings[0].module == "final"
    for kwargs, message in [
        ({"trace": tmp_path / "missing" / "t.json"}, f"the folder {tmp_path / 'missing'} does not exist"),
        ({"trace": tmp_path}, f"trace {tmp_path} is a folder; give a file name"),
        ({"plot": tmp_path / "t.svg"}, "the plot must be a .png file"),
    ]:
        with pytest.raises(ValueError, match=message):
            opforge.doctor(Identity(), torch.randn(2), **kwargs)
    spec = tmp_path / "make.py"
    spec.write_text("import torch\ndef make():\n    return torch.nn.Identity(), (torch.randn(3),)\n")
    assert main(["doctor", f"{spec}:make", "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert f"opforge doctor: cannot write the json report {tmp_path / 'no' / 'r.json'}" in capsys.readouterr().err
