"""The caches the tests keep outside the clone between runs (conftest.py): each emptied when a run
starts once past its size, JAX's compilation cache, Inductor's cache and the bytecode cache given to
every Python of the run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import INDUCTOR_CACHE, JAX_CACHE, PYCACHE, empty_past


def test_a_cache_past_its_limit_is_emptied_and_one_within_it_kept(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "a").write_bytes(b"x" * 600)
    (folder / "b").write_bytes(b"x" * 400)
    assert not empty_past(folder, 1000) and sorted(p.name for p in folder.iterdir()) == ["a", "b"]
    assert empty_past(folder, 999) and not folder.exists()
    assert not empty_past(folder, 0)  # a missing folder stays missing


def test_a_python_the_tests_start_compiles_jax_through_the_tests_cache():
    pytest.importorskip("jax", reason="JAX is not installed in this Python")
    for entry in JAX_CACHE.glob("jit_opforge_cache_probe-*"):
        entry.unlink()
    script = (
        "import jax, jax.numpy as jnp\n"
        "def opforge_cache_probe(x):\n    return x * 2 + 1\n"
        "print(jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)\n"
        "print(float(jax.jit(opforge_cache_probe)(jnp.float32(3))))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{JAX_CACHE} 0.0", "7.0"]
    assert [p.name.endswith("-cache") for p in JAX_CACHE.glob("jit_opforge_cache_probe-*")] == [True]


def test_a_cache_is_measured_with_its_subfolders(tmp_path):
    folder = tmp_path / "cache"
    (folder / "tree" / "deeper").mkdir(parents=True)
    (folder / "tree" / "deeper" / "a.pyc").write_bytes(b"x" * 600)
    assert not empty_past(folder, 600) and (folder / "tree" / "deeper" / "a.pyc").exists()
    assert empty_past(folder, 599) and not folder.exists()


def test_a_python_the_tests_start_writes_its_bytecode_to_the_tests_cache(tmp_path):
    """Even where the run was started with PYTHONDONTWRITEBYTECODE set (as container images set it)."""
    (tmp_path / "probe_module.py").write_text("VALUE = 7\n")
    script = "import sys; sys.path.insert(0, sys.argv[1]); import probe_module; print(probe_module.VALUE)"
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "7\n", proc.stderr
    assert not list(tmp_path.rglob("*.pyc"))  # nothing beside the sources
    assert Path(importlib.util.cache_from_source(str(tmp_path / "probe_module.py"))).is_file()
    assert importlib.util.cache_from_source(str(tmp_path / "probe_module.py")).startswith(str(PYCACHE))


def test_a_python_the_tests_start_keeps_inductor_s_cache_in_the_tests_cache():
    script = "from torch._inductor.runtime.cache_dir_utils import cache_dir; print(cache_dir())"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == f"{INDUCTOR_CACHE}\n", proc.stderr
