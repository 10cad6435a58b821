"""The test run's one answer per probe of Inductor's CPU vector extensions (isa_probes/)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

COUNT = "import torch._inductor.cpu_vec_isa as m; print(len(m.valid_vec_isa_list()))"


def test_a_python_a_test_starts_takes_the_probe_answers_from_the_run_s_file(tmp_path):
    # Without TORCHINDUCTOR_VEC_ISA_OK (conftest sets it), every extension is probed.
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_VEC_ISA_OK"}
    env["OPFORGE_TEST_ISA_PROBES"] = str(tmp_path / "probes.txt")
    first = subprocess.run([sys.executable, "-c", COUNT], capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    lines = (tmp_path / "probes.txt").read_text(encoding="utf-8").splitlines()
    if not lines and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"Inductor probes no vector extension on {platform.machine()}")
    assert lines, "no probe answer recorded: isa_probes/sitecustomize.py did not patch Inductor's probe"
    assert all(line.rsplit("\t", 1)[1] in ("0", "1") for line in lines), lines
    # The same probes answered "no": a fresh Python then finds no vector extension at all, so it
    # took every answer from the file and ran no probe of its own.
    (tmp_path / "probes.txt").write_text("".join(line.rsplit("\t", 1)[0] + "\t0\n" for line in lines))
    second = subprocess.run([sys.executable, "-c", COUNT], capture_output=True, text=True, timeout=600, env=env)
    assert second.returncode == 0, second.stderr
    assert int(first.stdout) > 0 and second.stdout.split() == ["0"], (first.stdout, second.stdout)
