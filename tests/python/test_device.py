"""A device this machine does not have (``--device cuda`` without a GPU) is said in one line, before
any work, with exit status 2: opforge.missing_device, and every command line that takes --device
(the example models and ``opforge verify``/``opforge run``), run one after the other in one fresh
process that sees no GPU (``CUDA_VISIBLE_DEVICES=""``, so the tests run on a GPU machine as well),
each as ``python <command line>`` runs it (fixtures/commands_in_turn.py): one start of torch for
all of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opforge

ROOT = Path(__file__).resolve().parents[2]


def no_cuda() -> str:
    """What opforge.missing_device("cuda") says in a process where torch finds no GPU."""
    if torch.version.cuda is None:
        return f"no CUDA device: this torch ({torch.__version__}) is built without CUDA; --device cpu runs on the CPU"
    return (
        f"no CUDA device: torch {torch.__version__} finds no GPU (torch.cuda.is_available() is False); "
        "--device cpu runs on the CPU"
    )


def test_missing_device_says_what_is_missing(monkeypatch):
    assert opforge.missing_device("cpu") is None and opforge.missing_device(torch.device("meta")) is None
    problem = opforge.missing_device("nonsense")  # torch's own reason in the parentheses
    assert problem.startswith("not a device: 'nonsense' (Expected one of cpu, cuda") and "\n" not in problem
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert opforge.missing_device("cuda") == opforge.missing_device("cuda:0") == no_cuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert opforge.missing_device("cuda") is None and opforge.missing_device("cuda:0") is None
    assert opforge.missing_device("cuda:3") == "no CUDA device cuda:3: torch finds 1 GPU (cuda:0 to cuda:0)"
    monkeypatch.setattr(torch.version, "cuda", None)
    assert opforge.missing_device("cuda") == (
        f"no CUDA device: this torch ({torch.__version__}) is built without CUDA; --device cpu runs on the CPU"
    )


#: (command line after the interpreter, what it prints before its message)
COMMANDS = [
    (["examples/models/train_amp.py", "--device", "cuda"], "train_amp.py"),
    (["examples/models/doctor_demo.py", "--device", "cuda"], "doctor_demo.py"),
    (["examples/models/minilm_demo.py", "--device", "cuda"], "minilm_demo.py"),
    (["examples/models/tensor_parallel.py", "--device", "cuda"], "tensor_parallel.py"),
    (["examples/models/pipeline.py", "--device", "cuda"], "pipeline.py"),
    (["examples/models/side_by_side.py", "--device", "cuda"], "side_by_side.py"),
    (["examples/models/llama_layer.py", "--device", "cuda"], "llama_layer.py"),
    (["-m", "opforge", "verify", "softshrink", "--device", "cuda"], "opforge verify"),
    (["-m", "opforge", "run", "model.pt2", "--inputs", "x.pt", "--output", "y.pt", "--device=cuda"], "opforge run"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, dict[str, object]]:
    """{prog: {"code", "stdout", "stderr"}} of each of COMMANDS, run in one process without a GPU."""
    results = tmp_path_factory.mktemp("device") / "results.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OPFORGE_QUIET": "1"}
    runner = [sys.executable, str(ROOT / "tests" / "python" / "fixtures" / "commands_in_turn.py")]
    argv = [str(results), json.dumps([argv for argv, _ in COMMANDS])]
    proc = subprocess.run([*runner, *argv], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and results.exists(), proc.stdout + proc.stderr
    return {prog: result for (_, prog), result in zip(COMMANDS, json.loads(results.read_text()), strict=True)}


@pytest.mark.parametrize("prog", [prog for _, prog in COMMANDS])
def test_a_command_without_the_gpu_it_asks_for_says_so_in_one_line_and_exits_2(refusals, prog):
    result = refusals[prog]
    assert (result["code"], result["stderr"]) == (2, f"{prog}: {no_cuda()}\n")
    assert result["stdout"] == ""
