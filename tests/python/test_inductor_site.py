"""Inductor's settings in every Python of a test run (inductor_site/): one answer per machine to
each probe of its CPU vector extensions, and its compiles through ccache with the same generated
code from run to run."""

from __future__ import annotations

import os
import shutil
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


def test_the_run_s_pythons_compile_through_ccache_with_one_string_hash():
    import torch._inductor.config as config

    cxx = os.environ.get("OPFORGE_TEST_INDUCTOR_CXX")
    if not cxx:
        pytest.skip("ccache is not installed: Inductor compiles with its own compiler")
    assert os.path.realpath(cxx) == shutil.which("ccache")
    assert (config.cpp.cxx[-1], config.aot_inductor.precompile_headers) == (cxx, False)  # this worker
    settings = "import torch._inductor.config as c; print(c.cpp.cxx[-1], c.aot_inductor.precompile_headers)"
    fresh = subprocess.run([sys.executable, "-c", settings], capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split() == [cxx, "False"]  # a Python a test starts
    # Inductor's generated code follows set iteration: every Python of the run hashes alike.
    hashed = subprocess.run([sys.executable, "-c", "print(hash('opforge'))"], capture_output=True, text=True)
    assert int(hashed.stdout) == hash("opforge"), "PYTHONHASHSEED is not fixed for the run's Pythons"
