"""Test runs only: Inductor's settings in every Python of a run (the pytest workers and every
Python a test starts), each a fact of the machine or a cache, none changing what is computed.

1. Probe answers. Inductor decides which vector instructions its CPU kernels may use by
   compiling a small library per extension (AVX-512 bfloat16, VNNI, AMX, ...) and loading each in
   a fresh ``import torch`` (``torch._inductor.cpu_vec_isa.VecISA.check_build``), in every process
   that compiles for the CPU: about ten seconds of CPU time per process. The tests' conftest points
   ``OPFORGE_TEST_ISA_PROBES`` at this machine's file of answers (named by the CPU's flags, the
   compiler and torch's version); the first process to ask runs each probe and records its answer
   (under a file lock, so the others wait for it), and every later process, of this run or a later
   one, reads it.
2. Compiles through ccache. AOTInductor has no cache of its own (``compile_fx`` turns the FX
   graph cache off in AOT mode), so each package compiles its C++ wrapper and kernels again
   (about 8 s of g++ per package on a 2-core machine, ~30 packages a run). With
   ``OPFORGE_TEST_INDUCTOR_CXX`` set (conftest: a ``g++`` that runs ccache, where ccache is
   installed) Inductor's compiler is that one and AOTInductor's precompiled headers are off
   (``config.aot_inductor.precompile_headers``: ccache does not cache a compile that uses a
   precompiled header without sloppiness settings that would also hide header changes). ccache
   finds a compile again by the preprocessed source, flags and compiler, so only a package whose
   generated code is unchanged is taken from it; the generated code is the same from run to run
   once Python's string hashing is fixed (``PYTHONHASHSEED``, set by conftest), as Inductor's
   order of buffers and kernels follows set iteration, and once each int array of the wrapper is
   declared where it is used (:func:`declare_each_int_array`).

This file imports nothing heavy and patches each module only once something imports it, and
then runs the ``sitecustomize`` this folder shadows, if there is one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_FOLDER = os.path.dirname(os.path.abspath(__file__))


def answer_probes(module) -> None:
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


def compile_through_ccache(module) -> None:
    """Makes ``$OPFORGE_TEST_INDUCTOR_CXX`` Inductor's C++ compiler and turns AOTInductor's
    precompiled headers off (``module``: torch._inductor.config); no-op without it."""
    cxx = os.environ.get("OPFORGE_TEST_INDUCTOR_CXX")
    if not cxx:
        return
    module.cpp.cxx = (None, cxx)
    module.aot_inductor.precompile_headers = False


def declare_each_int_array(module) -> None:
    """Makes ``module.CppWrapperCpu.codegen_int_array_var`` (``module``:
    torch._inductor.codegen.cpp_wrapper_cpu) declare a new array at each call, without the
    memo it keeps by ``id()`` of the ``writeline`` bound method it is passed: such ids are
    reused as the temporary method objects are freed, so whether an earlier declaration is
    reused varies with the process's allocations, and so does the generated wrapper (and with it
    ccache's key). Each declaration is made where it is used, so the code computes the same;
    no-op without ``$OPFORGE_TEST_INDUCTOR_CXX``."""
    wrapper = getattr(module, "CppWrapperCpu", None)
    if not os.environ.get("OPFORGE_TEST_INDUCTOR_CXX") or wrapper is None:
        return

    def codegen_int_array_var(self, int_array, writeline, known_statically=False, graph=None):
        return self._codegen_int_array_var_impl(int_array, writeline, known_statically)

    wrapper.codegen_int_array_var = codegen_int_array_var


#: What is patched once imported: module name -> patch.
PATCHES = {
    "torch._inductor.cpu_vec_isa": answer_probes,
    "torch._inductor.config": compile_through_ccache,
    "torch._inductor.codegen.cpp_wrapper_cpu": declare_each_int_array,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`PATCHES` as usual and patches each once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Patches each module of :data:`PATCHES` now if it is imported, else when it is."""
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
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
