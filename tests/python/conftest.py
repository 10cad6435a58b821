"""Shared fixtures: the example op libraries, devices, per-op test cases, and (from run_options.py)
each test's random seed and the group of tests a run takes."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def tests_cache_folder() -> Path:
    """The tests' cache folder, kept between runs beside the environment: ``$OPFORGE_TEST_CACHE``,
    default ~/.cache/opforge."""
    cache = Path(os.environ.get("OPFORGE_TEST_CACHE", Path.home() / ".cache" / "opforge"))
    cache.mkdir(parents=True, exist_ok=True)
    return cache


# Python's bytecode of every module the run imports (opforge, the tests with pytest's rewritten
# asserts, the packages they use), kept between runs in the tests' cache folder instead of in
# __pycache__ folders beside the sources, and written even where PYTHONDONTWRITEBYTECODE is set
# (container images set it to keep __pycache__ out of their layers): without it each worker and
# each Python a test starts compiles every module of opforge and of the tests it imports afresh.
# Set here, before the workers start, for them and every Python they start; this process writes
# from here on. A prefix the caller set is kept.
PYCACHE = Path(os.environ.setdefault("PYTHONPYCACHEPREFIX", str(tests_cache_folder() / "pycache")))
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.pycache_prefix, sys.dont_write_bytecode = str(PYCACHE), False

# JAX (test_jax.py) shares the GPU with torch in one process: it allocates as it goes instead of
# taking most of the memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Inductor takes the CPU's vector instructions (AVX2, AVX-512) from the CPU's flags instead of
# compiling and loading a probe for each, in a fresh Python, in every process that compiles (this
# one and the processes tests start); its probes of extensions (bfloat16, VNNI, AMX) still run.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# AOTInductor compiles each package's C++ wrapper (the model's host code, not its kernels, which
# keep -O3) at -O1; at -O0 it takes about two thirds of the time, and the tests package ~30 models.
os.environ.setdefault("AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL", "O0")
# Python's string hashing fixed in the workers (started after this file is read) and every Python
# they start: Inductor's order of buffers and kernels follows set iteration, so its generated C++
# is then the same from run to run and ccache finds the compile again (inductor_site/).
os.environ.setdefault("PYTHONHASHSEED", "0")

# Under pytest-xdist, each worker's share of the CPU's cores for torch's intra-op threads, OpenMP
# in the processes tests start and Inductor's compile workers, so that N workers on C cores run
# about C threads, not N x C (15 workers on the GPU machine's 16 cores took 16 threads each).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    for _name in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        os.environ.setdefault(_name, _SHARE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import opforge  # noqa: E402
from opforge.__main__ import main  # noqa: E402
from opforge._adapter import runner_path  # noqa: E402

# Each test's random seed (--seed) and the group of tests a run takes (--group): run_options.py.
from run_options import (  # noqa: E402, F401
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_report_header,
    pytest_runtest_makereport,
    seed,
)

# pytester: test_run_options.py runs pytest on files of its own, in its process.
pytest_plugins = ["pytester"]

#: The folder of the sitecustomize that gives every Python of the run Inductor's settings for
#: tests (inductor_site/sitecustomize.py: probe answers, compiles through ccache), put on the
#: PYTHONPATH of the run's Pythons.
INDUCTOR_SITE = Path(__file__).resolve().parent / "inductor_site"


def isa_probe_file() -> Path:
    """This machine's file of probe answers, in the tests' cache folder (``$OPFORGE_TEST_CACHE``,
    default ~/.cache/opforge, beside the environment), named by what the answers depend on: the
    CPU's flags, the C++ compiler Inductor runs and torch's version (its probes' code). Another
    CPU, compiler or torch starts a file of its own."""
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    try:
        compiler = subprocess.run(
            [os.environ.get("CXX", "c++"), "--version"], capture_output=True, text=True, timeout=60
        ).stdout
    except OSError:
        compiler = ""
    key = hashlib.sha256("\n".join([flags, compiler, torch.__version__]).encode()).hexdigest()[:16]
    return tests_cache_folder() / f"isa-probes-{key}.txt"


# JAX's persistent compilation cache for the run's Pythons (set here, before the workers start):
# XLA's executables kept between runs in the tests' cache folder, as torch's Inductor cache is,
# each found again only under its key (the computation with its custom calls' targets and
# attributes, compile options, backend, jax's version). Every executable is kept, however quick its
# compile: test_jax.py compiles about a thousand small ones (a third of its time on the 2-core
# machine). JAX's own size cap (least recently used first) is left off: its bookkeeping on every
# write tripled the time of a run that fills the cache; pytest_configure empties it instead.
JAX_CACHE = Path(os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(tests_cache_folder() / "jax")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# torch's Inductor cache (what torch.compile and AOTInductor compile, found again by its code)
# for the run's Pythons (set here, before the workers start), kept between runs in the tests' cache
# folder, as the environment is: torch's default is in /tmp, which a fresh machine empties. A
# folder the caller set is kept, and never emptied.
INDUCTOR_CACHE = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tests_cache_folder() / "inductor")))

#: The size past which the tests' Inductor cache is emptied when a run starts.
INDUCTOR_CACHE_LIMIT = 3 << 30
#: The size past which the tests' shared kernel cache is emptied when a run starts.
KERNEL_CACHE_LIMIT = 1 << 30
#: The size past which the tests' JAX compilation cache is emptied when a run starts.
JAX_CACHE_LIMIT = 512 << 20
#: The size past which the tests' bytecode cache is emptied when a run starts (a clone at another
#: path, or another environment, adds a tree of its own).
PYCACHE_LIMIT = 1 << 30


def shared_kernel_cache() -> Path:
    """The run-time kernel binaries the tests compile, shared by every test of a run and kept
    between runs (``test-kernels`` in :func:`tests_cache_folder`). Sharing cannot change a
    result: an entry is found only under its full key (the kernel's source text and what compiles
    it: name, options, architecture, compiler version) and is checked against its checksum on
    load (Note [Run-time kernels] in include/opforge/op_launch.h), so an edited kernel compiles
    afresh."""
    return tests_cache_folder() / "test-kernels"


def pytest_configure(config):
    """Once per run, in the process that starts the workers: empties the shared kernel cache, the
    JAX compilation cache, and the Inductor and bytecode caches (where they are the tests' own)
    once each has grown past its limit (:data:`KERNEL_CACHE_LIMIT`, :data:`JAX_CACHE_LIMIT`,
    :data:`INDUCTOR_CACHE_LIMIT`, :data:`PYCACHE_LIMIT`; entries of kernels, computations and
    graphs since edited, and trees of clones since removed, stay behind)."""
    if hasattr(config, "workerinput"):
        return
    caches = [(shared_kernel_cache(), KERNEL_CACHE_LIMIT), (JAX_CACHE, JAX_CACHE_LIMIT)]
    for cache, name, limit in ((INDUCTOR_CACHE, "inductor", INDUCTOR_CACHE_LIMIT), (PYCACHE, "pycache", PYCACHE_LIMIT)):
        if cache == tests_cache_folder() / name:
            caches.append((cache, limit))
    for cache, limit in caches:
        if empty_past(cache, limit):  # the run compiles what it needs afresh: a slower run, said why
            print(f"tests: emptied {cache} (past {limit >> 20} MB)", flush=True)


def empty_past(folder: Path, limit: int) -> bool:
    """Removes ``folder`` once the files in it (in its subfolders too) hold more than ``limit``
    bytes; returns whether it did. A missing folder is left missing."""
    if not folder.is_dir() or sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) <= limit:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def ccache_compiler() -> Path | None:
    """A ``g++`` that runs ccache (a link to it named g++: ccache then compiles with the next g++
    on PATH), in :func:`tests_cache_folder`; None where ccache is not installed."""
    ccache = shutil.which("ccache")
    if ccache is None:
        return None
    link = tests_cache_folder() / "ccache-bin" / "g++"
    if not link.is_symlink() or os.readlink(link) != ccache:
        link.parent.mkdir(parents=True, exist_ok=True)
        temporary = link.with_name(f"g++.{os.getpid()}")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(ccache)
        temporary.replace(link)  # atomic: workers may make it at once
    return link


@pytest.fixture(scope="session", autouse=True)
def inductor_site():
    """Gives this process and every Python the run's tests start Inductor's settings for tests
    (inductor_site/sitecustomize.py): the probe answers of this machine (:func:`isa_probe_file`)
    and, where ccache is installed, compiles through it (:func:`ccache_compiler`)."""
    import inductor_site.sitecustomize as site

    os.environ["OPFORGE_TEST_ISA_PROBES"] = str(isa_probe_file())
    if (cxx := ccache_compiler()) is not None:
        os.environ["OPFORGE_TEST_INDUCTOR_CXX"] = str(cxx)
    path = os.environ.get("PYTHONPATH", "")
    if str(INDUCTOR_SITE) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(INDUCTOR_SITE), path]))
    site.install()


@pytest.fixture
def opforge_main(capsys, monkeypatch):
    """``opforge *args`` in this process (``main(argv)``): for a command that loads no op library
    this process has not loaded already (the checkout's examples, loaded in every test process, or
    a fixture's), or stops at a usage error before loading one, where a fresh Python would add only
    the seconds of its imports. Returns a CompletedProcess (``returncode``, ``stdout``,
    ``stderr``); with ``cache``, that is its cache folder (``$OPFORGE_CACHE_DIR``)."""

    def run(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
        monkeypatch.setenv("OPFORGE_QUIET", "1")
        if cache is not None:
            monkeypatch.setenv("OPFORGE_CACHE_DIR", str(cache))
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["opforge", *args], code, out.out, out.err)

    return run


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
requires_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]

#: Absolute and relative tolerance by dtype, against a float64 reference; integers and bool exactly.
TOLERANCE = {
    torch.float32: 2e-6,
    torch.float64: 1e-12,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    **{d: 0.0 for d in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)},
}
#: Every dtype opforge supports.
ALL_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


#: Int8Linear weights [N, K] with tails past its kernels' strips of 8 output channels and chunks of
#: 64 input channels, and whether the layer has a bias: the shapes of issue 41 (vocabularies, odd
#: hidden sizes), K % 8 != 0 (x's rows copied aligned for the tensor-core kernels), no whole strip
#: (N < 8), no whole chunk (K < 64), a K tail of one 8-element vector (test_int8_linear.py and
#: tools/sanitize.py).
INT8_LINEAR_TAIL_SHAPES = [
    (1000, 1000, True),
    (300, 4100, False),
    (129, 512, True),
    (16, 16, False),
    (13, 70, True),
    (72, 200, True),
    (5, 3, True),
    (1, 1, False),
]


@dataclass
class OpCase:
    """How to exercise one example op.

    make(batch, dtype, device) returns (args, kwargs) with ``batch`` as the leading dim of the
    first tensor; ``expected(*args, **kwargs)`` is the same function in plain torch, evaluated
    in float64. ``library``: the example library (``examples/ops/<library>/``) that declares the
    op, if not the op's own name.
    """

    name: str
    make: Callable
    expected: Callable
    dtypes: list = field(default_factory=lambda: [torch.float32, torch.float64, torch.float16, torch.bfloat16])
    library: str | None = None

    @property
    def library_path(self):
        return opforge.example_library(self.library or self.name)

    @property
    def op(self):
        ns, name = "examples", self.name
        return getattr(getattr(torch.ops, ns), name)


def random_tensor(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Random values of any dtype: normal for floats, [-100, 100) for signed and [0, 200) for
    unsigned integers, either value for bool."""
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    low = 0 if dtype == torch.uint8 else -100
    return torch.randint(low, low + 200, shape, dtype=dtype, device=device)


def strided_views(like: torch.Tensor):
    """(label, view) for non-dense tensors of ``like``'s shape, dtype and device: permuted,
    sliced, storage-offset (misaligned), expanded."""
    shape, dtype, device = like.shape, like.dtype, like.device
    yield "permuted", like.transpose(0, -1).contiguous().transpose(0, -1)
    yield "sliced", random_tensor((*shape[:-1], 2 * shape[-1]), dtype, device)[..., ::2]
    yield "offset", random_tensor((like.numel() + 3,), dtype, device)[3:].view(shape)
    yield "expanded", random_tensor((1, *shape[1:]), dtype, device).expand(shape)


def _softshrink_inputs(batch, dtype, device):
    return (torch.randn(batch, 37, dtype=dtype, device=device),), {"lambd": 0.3}


def _softshrink_backward_inputs(batch, dtype, device):
    x = torch.randn(batch, 37, dtype=dtype, device=device)
    x[:, :3] = torch.tensor([0.3, -0.3, float("nan")], dtype=dtype)  # lambd's neighbours in x's dtype; NaN gets 0
    return (torch.randn_like(x), x), {"lambd": 0.3}


def _softshrink_grad(grad_y, x, lambd=0.5):
    """torch's own softshrink gradient (autograd through F.softshrink), in float64 on the CPU
    (torch's CUDA kernel passes grad_y on where x is NaN, its CPU kernel gives 0)."""
    x = x.double().cpu().requires_grad_()
    return torch.autograd.grad(F.softshrink(x, lambd), x, grad_y.double().cpu())[0]


def _bias_gelu_inputs(batch, dtype, device):
    return (torch.randn(batch, 5, 48, dtype=dtype, device=device), torch.randn(48, dtype=dtype, device=device)), {}


def _rms_norm_inputs(batch, dtype, device):
    return (torch.randn(batch, 3, 64, dtype=dtype, device=device), torch.rand(64, dtype=dtype, device=device) + 0.5), {
        "eps": 1e-5
    }


def _add_layer_norm_inputs(batch, dtype, device):
    x = torch.randn(batch, 3, 96, dtype=dtype, device=device)
    return (
        x,
        torch.randn_like(x),
        torch.rand(96, dtype=dtype, device=device) + 0.5,
        torch.randn(96, dtype=dtype, device=device),
    ), {"eps": 1e-5}


def _identity_conv_inputs(batch, dtype, device):
    return (random_tensor((batch, 3, 37), dtype, device),), {}


CASES = {
    "softshrink": OpCase("softshrink", _softshrink_inputs, lambda x, lambd=0.5: F.softshrink(x.double(), lambd)),
    "softshrink_backward": OpCase(
        "softshrink_backward", _softshrink_backward_inputs, _softshrink_grad, library="softshrink"
    ),
    "bias_gelu": OpCase(
        "bias_gelu",
        _bias_gelu_inputs,
        lambda x, b: F.gelu(x.double() + b.double()),
        dtypes=[torch.float32, torch.float16, torch.bfloat16],
    ),
    "rms_norm": OpCase(
        "rms_norm", _rms_norm_inputs, lambda x, w, eps: F.rms_norm(x.double(), (x.shape[-1],), w.double(), eps)
    ),
    "add_layer_norm": OpCase(
        "add_layer_norm",
        _add_layer_norm_inputs,
        lambda x, r, w, b, eps: F.layer_norm(x.double() + r.double(), (x.shape[-1],), w.double(), b.double(), eps),
    ),
    "identity_conv": OpCase("identity_conv", _identity_conv_inputs, lambda x: x.clone(), dtypes=ALL_DTYPES),
}


@pytest.fixture(scope="session")
def float8_ops(tmp_path_factory):
    """fixtures/float8_ops.cpp (float8 conversions, an output of float8_e8m0fnu, a float8 input
    under autocast, the device Divider's quotient), built and loaded once per session for the
    files that use it."""
    fixtures = Path(__file__).resolve().parent / "fixtures"
    path = opforge.build_library(
        "float8_ops",
        [fixtures / "float8_ops.cpp"],
        kernels=[fixtures / "kernels" / "divider_kernels.cu"],
        build_dir=tmp_path_factory.mktemp("float8"),
    )
    return opforge.load_library(path)


@pytest.fixture(scope="session")
def rule_ops(tmp_path_factory):
    """fixtures/rule_ops.cpp (size parameters, optional and data-dependent outputs, autocast),
    built and loaded once per session for the files that use it."""
    fixtures = Path(__file__).resolve().parent / "fixtures"
    path = opforge.build_library(
        "rule_ops",
        [fixtures / "rule_ops.cpp"],
        kernels=[fixtures / "kernels" / "rule_kernels.cu"],
        build_dir=tmp_path_factory.mktemp("rules"),
    )
    return opforge.load_library(path)


@pytest.fixture(scope="session")
def triton_kernel_file(tmp_path_factory) -> Path:
    """A copy of fixtures/kernels/triton_add.py, which the kernel folder of :func:`triton_ops`
    links to: a test may edit it (and puts it back)."""
    pytest.importorskip("triton", reason="Triton is not installed in this Python")
    copy = tmp_path_factory.mktemp("triton-kernels") / "triton_add.py"
    shutil.copy(Path(__file__).resolve().parent / "fixtures" / "kernels" / "triton_add.py", copy)
    return copy


@pytest.fixture(scope="session")
def triton_ops(tmp_path_factory, triton_kernel_file):
    """fixtures/triton_ops.cpp (ops whose kernels are Triton functions: tt::add, tt::softmax and
    its backward op, an autotuned tt::scale), built and loaded once per session for the files
    that use it; skipped where Triton is not installed."""
    fixtures = Path(__file__).resolve().parent / "fixtures"
    path = opforge.build_library(
        "triton_ops",
        [fixtures / "triton_ops.cpp"],
        kernels=[triton_kernel_file],
        build_dir=tmp_path_factory.mktemp("triton-build"),
    )
    return opforge.load_library(path)


@pytest.fixture(scope="session")
def triton_broken_ops(tmp_path_factory):
    """fixtures/triton_broken_ops.cpp (a Triton kernel file with a syntax error, a kernel Triton
    refuses to compile for float16), built and loaded once per session; skipped where Triton is
    not installed."""
    pytest.importorskip("triton", reason="Triton is not installed in this Python")
    fixtures = Path(__file__).resolve().parent / "fixtures"
    syntax_error = tmp_path_factory.mktemp("triton-syntax") / "triton_syntax_error.py"
    shutil.copy(fixtures / "kernels" / "triton_syntax_error.py.txt", syntax_error)
    path = opforge.build_library(
        "triton_broken_ops",
        [fixtures / "triton_broken_ops.cpp"],
        kernels=[syntax_error, fixtures / "kernels" / "triton_broken.py"],
        build_dir=tmp_path_factory.mktemp("triton-broken"),
    )
    return opforge.load_library(path)


@pytest.fixture(scope="session", autouse=True)
def example_ops():
    """Loads every example op library once per test session."""
    return {name: opforge.load_library(case.library_path) for name, case in CASES.items()}


def _with_shared_kernels(folder: Path) -> str:
    """``folder`` as an opforge cache folder (``$OPFORGE_CACHE_DIR``) whose kernel cache is the
    tests' shared one (:func:`shared_kernel_cache`)."""
    (folder / "kernels").symlink_to(shared_kernel_cache(), target_is_directory=True)
    return str(folder)


@pytest.fixture(scope="session", autouse=True)
def _session_opforge_cache(tmp_path_factory):
    """The opforge cache folder of what runs outside a test's own (session and module fixtures,
    set up before a test's): never the user's, its kernel cache the shared one."""
    shared_kernel_cache().mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", _with_shared_kernels(tmp_path_factory.mktemp("opforge-cache")))
        yield


@pytest.fixture(autouse=True)
def _test_opforge_cache(_session_opforge_cache, tmp_path_factory, monkeypatch):
    """Each test gets an opforge cache folder of its own (``$OPFORGE_CACHE_DIR``: the libraries
    ``opforge build`` makes), whose kernel cache is the tests' shared one: a kernel compiled once
    serves every later test and run."""
    folder = tmp_path_factory.mktemp("opforge-cache")  # beside tmp_path, which stays empty
    monkeypatch.setenv("OPFORGE_CACHE_DIR", _with_shared_kernels(folder))


@pytest.fixture
def private_kernel_cache(tmp_path_factory, monkeypatch) -> Path:
    """For a test of compiling and caching run-time kernels: an empty kernel cache of the test's
    own in place of the shared one; returns its folder."""
    cache = tmp_path_factory.mktemp("private-opforge-cache")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(cache))
    return cache / "kernels"


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype):
    """``out`` (in ``dtype``) equals the float64 ``ref`` within the dtype's tolerance; NaN never passes
    unless the reference is NaN at the same place."""
    assert out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double().cpu(), ref.double().cpu(), atol=tol, rtol=tol, equal_nan=True)


def run_runner(package, inputs, output, *flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``opforge-runner package --inputs inputs --output output *flags``, its output captured."""
    cmd = [str(runner_path()), str(package), "--inputs", str(inputs), "--output", str(output), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
