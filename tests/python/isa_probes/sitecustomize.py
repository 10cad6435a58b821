"""Test runs only: one answer per machine to each of Inductor's probes of CPU vector extensions.

Inductor decides which vector instructions its CPU kernels may use by compiling a small library
per extension (AVX-512 bfloat16, VNNI, AMX, ...) and loading each in a fresh ``import torch``
(``torch._inductor.cpu_vec_isa.VecISA.check_build``), in every process that compiles for the
CPU: about ten seconds of CPU time per process, paid by each pytest worker and each Python a test
starts. The tests' conftest points ``OPFORGE_TEST_ISA_PROBES`` at this machine's file of answers
(named by the CPU's flags, the compiler and torch's version) and puts this folder on
``PYTHONPATH``; then the first process to ask runs each probe and records its answer (under a
file lock, so the others wait for it), and every later process, of this run or a later one,
reads it. The answers are facts of the machine; nothing else changes.

This file is imported at the start of every Python of the run (``sitecustomize``): it imports
nothing heavy and patches the module only once something imports it, and then runs the
``sitecustomize`` this folder shadows, if there is one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_MODULE = "torch._inductor.cpu_vec_isa"
_FOLDER = os.path.dirname(os.path.abspath(__file__))


def patch(module) -> None:
    """Answers ``module.VecISA.check_build`` (``module``: torch._inductor.cpu_vec_isa) from the
    file ``$OPFORGE_TEST_ISA_PROBES``, one ``key<TAB>0|1`` line per probe; no-op without it."""
    path = os.environ.get("OPFORGE_TEST_ISA_PROBES")
    isa = getattr(module, "VecISA", None)
    if not path or isa is None or getattr(isa.check_build, "answered_from_file", False):
        return
    probe = isa.check_build

    def check_build(self, code: str) -> bool:
        key = f"{type(self).__name__} {getattr(self, '_arch_flags', '')} {hashlib.sha256(code.encode()).hexdigest()}"
        with open(path, "a+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            f.seek(0)
            answers = dict(line.rsplit("\t", 1) for line in f.read().splitlines() if "\t" in line)
            if key in answers:
                return answers[key] == "1"
            ok = bool(probe(self, code))
            f.write(f"{key}\t{int(ok)}\n")
            return ok

    check_build.answered_from_file = True
    isa.check_build = check_build


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds torch._inductor.cpu_vec_isa as usual and patches it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Patches the module now if it is imported, else when it is."""
    if _MODULE in sys.modules:
        patch(sys.modules[_MODULE])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _run_shadowed_sitecustomize() -> None:
    """Runs the next ``sitecustomize`` on sys.path after this folder's (an interpreter's own)."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _FOLDER]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if __name__ == "sitecustomize":
    install()
    _run_shadowed_sitecustomize()
