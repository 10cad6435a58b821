"""One answer per machine to each probe of Inductor's CPU vector extensions (isa_probes/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COUNT = "import torch._inductor.cpu_vec_isa as m; print(len(m.valid_vec_isa_list()))"


def test_a_python_a_test_starts_takes_the_probe_answers_from_the_machine_s_file(tmp_path):
    import torch._inductor.cpu_vec_isa as isa

    found = isa.valid_vec_isa_list()  # in this process: answered from, or recorded in, the file
    probed = [i for i in found if type(i).__name__ in ("VecAMX", "VecAVX512VNNI")]  # what only a probe finds
    if not probed:
        pytest.skip("this CPU has no vector extension that Inductor finds by a probe (AMX, AVX-512 VNNI)")
    lines = Path(os.environ["OPFORGE_TEST_ISA_PROBES"]).read_text(encoding="utf-8").splitlines()
    assert lines and all(line.rsplit("\t", 1)[1] in ("0", "1") for line in lines), lines
    # The same probes answered "no": a fresh Python finds fewer vector extensions, so it took the
    # answers from the file instead of probing.
    refused = tmp_path / "refused.txt"
    refused.write_text("".join(line.rsplit("\t", 1)[0] + "\t0\n" for line in lines), encoding="utf-8")
    env = {**os.environ, "OPFORGE_TEST_ISA_PROBES": str(refused)}
    fresh = subprocess.run([sys.executable, "-c", COUNT], capture_output=True, text=True, timeout=600, env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert int(fresh.stdout) == len(found) - len(probed), (fresh.stdout, found)
