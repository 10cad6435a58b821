"""The caches the tests keep outside the clone between runs (conftest.py): each emptied when a run
starts once past its size, and JAX's compilation cache given to every Python of the run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import JAX_CACHE, empty_past


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
