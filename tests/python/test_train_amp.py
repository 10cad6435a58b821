"""examples/models/train_amp.py: mixed-precision training with opforge ops against the same model
in torch's ops. On the CPU, short eager runs (autocast on the CPU in bfloat16 and, with a
GradScaler, float16); on CUDA the command the README gives, compiled runs included."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import torch

from conftest import requires_cuda
from readme_blocks import command

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "models"))
import train_amp  # noqa: E402


@pytest.mark.slow
def test_short_eager_runs_match_torch_and_write_the_plot(tmp_path, capsys):
    assert train_amp.main(["--device", "cpu", "--epochs", "2", "--no-compile", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    runs = {(r["model"], r["precision"], r["mode"]) for r in results["runs"]}
    assert runs == {(m, p, "eager") for m in ("opforge", "torch") for p in ("bfloat16", "float16")}
    for r in results["runs"]:
        assert r["losses"][-1] < r["losses"][0]  # it trains
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert out.count("ok  ") == 2
    assert out.splitlines()[0] == (  # said before the first run, whatever standard output is
        "4 training runs of 2 epochs on cpu (bfloat16 and float16; eager; opforge and torch ops), a line as each ends:"
    )


def test_gradients_reach_every_parameter_under_autocast():
    """Every parameter before, between and after the opforge ops gets a gradient in float32 (no
    op drops one), and the same one as the torch model's within 16-bit noise."""
    for lib in ("bias_gelu", "rms_norm", "softshrink"):
        train_amp.opforge.load_library(train_amp.opforge.example_library(lib))
    init = train_amp.DigitsMLP(train_amp.Ops(True)).state_dict()
    x, y = torch.rand(32, train_amp.FEATURES), torch.randint(0, train_amp.CLASSES, (32,))
    grads = {}
    for use_opforge in (True, False):
        model = train_amp.DigitsMLP(train_amp.Ops(use_opforge))
        model.load_state_dict(init)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        grads[use_opforge] = {n: p.grad for n, p in model.named_parameters()}
    for name, g in grads[True].items():
        assert g is not None and g.dtype == torch.float32 and g.abs().sum() > 0, name
        ref = grads[False][name]
        assert torch.nn.functional.cosine_similarity(g.flatten(), ref.flatten(), dim=0) > 0.99, name


def test_a_mismatch_fails_the_run(monkeypatch, tmp_path):
    monkeypatch.setattr(train_amp, "LOSS_TOLERANCE", -1.0)  # no run can be this close
    argv = ["--device", "cpu", "--epochs", "1", "--no-compile", "--precision", "bfloat16", "--out", str(tmp_path)]
    assert train_amp.main(argv) == 1


@requires_cuda
@pytest.mark.filterwarnings("ignore:.*TensorFloat32.*")
def test_cuda_training_with_compile_matches_torch(tmp_path):
    """The README's command as written (bfloat16 and float16 + GradScaler, eager and compiled)."""
    argv = shlex.split(command("python examples/models/train_amp.py"))[2:]
    assert argv == ["--device", "cuda"], argv
    assert train_amp.main([*argv, "--out", str(tmp_path)]) == 0
