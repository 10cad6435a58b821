"""``opforge new ns::name``: a new op folder that builds, loads and passes ``opforge verify`` as
written, for the author to turn into their op.

The folder (the layout ``opforge build <dir>`` and ``examples/ops/<op>/`` use)::

    <name>/<name>.cpp          the description, and a CPU reference to replace with the op's math
    <name>/kernels/<name>.cu   its CUDA kernel, compiled at run time (NVRTC) for the GPU in use;
                               with ``--triton``, kernels/<name>.py: a Triton kernel, compiled
                               by Triton on first use and launched from C++ by a grid function
                               (Note [Triton kernels] in opforge/op_launch.h)
    <name>/test_<name>.py      builds the folder and runs opforge verify on it (pytest); with a
                               shape (``--shape``, as opforge doctor suggests it), also compares
                               the device kernel with the reference at that shape

The op it describes is the identity, y = x, elementwise over any shape in the given dtypes: the
smallest op whose every part (dtype dispatch, launch rule, run-time kernel, verify against its
``.equivalent()`` expression) is real, so each edit can be checked by running the test again.
"""

from __future__ import annotations

import keyword
import math
import re
from pathlib import Path

from .description import TORCH_NAMESPACES

#: dtype names on the command line -> the opforge/dtype.h constant.
DTYPES = {
    "float32": "opforge::kFloat32",
    "float64": "opforge::kFloat64",
    "float16": "opforge::kFloat16",
    "bfloat16": "opforge::kBFloat16",
}

_OP_FILE_HEAD = """\
// {ns}::{name}, made by `opforge new`: the identity y = x as a starting point. Replace the
// reference's loop and the kernel's body with the op's math, its .doc() and .equivalent() with
// what it computes, and run `pytest {folder}/test_{name}.py` after each edit (pytest comes with
// `pip install 'opforge[test]'`).
#include <opforge/op.h>

// CPU reference, in double: the ground truth opforge verify compares every device kernel with.
static void {name}_cpu(opforge::Tensor x, opforge::MutableTensor y) {{
  opforge::visit_dtype<{dtypes}>(x.dtype(), [&]<class T>(opforge::type_tag<T>) {{
    const T* in = x.data<T>();
    T* out = y.data<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) out[i] = T(static_cast<double>(in[i]));
  }});
}}
"""

_OP_DECLARATION = """
OPFORGE_OP({ns}, {name})
    .doc("y = x (replace with what the op computes)")
    .input("x", {dtypes})
    .output("y", opforge::like("x"))
    .equivalent("x.clone()")  // the torch expression verify checks the reference against
    .reference({name}_cpu)
"""

_OP_FILE = (
    _OP_FILE_HEAD
    + _OP_DECLARATION
    + """\
    .cuda_source("{name}.cu", "{name}<{{T}}>")  // kernels/{name}.cu, compiled at run time
    .launch(opforge::elementwise("y").bytes_per_thread(16));
"""
)

_KERNEL = """\
// {ns}::{name}'s CUDA kernel, compiled at run time by opforge (NVRTC) for the GPU in use; an edit
// is picked up on the next run (or opforge.reload()). Launched by opforge::elementwise("y") with
// 16 bytes per thread: thread t handles elements [t * N, t * N + N), N = 16 / sizeof(T).
#include <opforge/kernel.cuh>

template <class T>
__global__ void {name}(const T* __restrict__ x, T* __restrict__ y, int64_t n) {{
  constexpr int N = 16 / sizeof(T);
  const int64_t first = opforge::kernel::global_index() * N;
  for (int64_t i = first; i < first + N && i < n; ++i) {{
    const auto v = opforge::kernel::to_acc(x[i]);  // float (double for double) arithmetic
    y[i] = opforge::kernel::from_acc<T>(v);
  }}
}}
"""

_TRITON_OP_FILE = (
    _OP_FILE_HEAD
    + """
// The launch of kernels/{name}.py (Note [Triton kernels] in opforge/op_launch.h): its x_ptr and
// y_ptr are the tensors x and y (by name); n_elements and BLOCK_SIZE are set here, and the grid is
// cdiv(y.numel(), BLOCK_SIZE) programs.
static opforge::TritonLaunch {name}_grid(opforge::Tensor, opforge::MutableTensor y) {{
  opforge::TritonLaunch launch;
  launch.grid[0] = y.numel();
  launch.grid_per[0] = "BLOCK_SIZE";
  launch.set("n_elements", y.numel()).constant("BLOCK_SIZE", 1024);
  return launch;
}}
"""
    + _OP_DECLARATION
    + """\
    .triton_source("{name}.py", "{name}_kernel")  // kernels/{name}.py, compiled by Triton at run time
    .launch_grid({name}_grid);
"""
)

_TRITON_KERNEL = """\
\"\"\"{ns}::{name}'s Triton kernel: opforge has Triton compile it for the GPU in use on first use and
launches it from C++ ({name}_grid in {name}.cpp gives the grid and the arguments); an edit is
picked up on the next run (or opforge.reload()). Program p handles elements [p * BLOCK_SIZE,
(p + 1) * BLOCK_SIZE).\"\"\"

import triton
import triton.language as tl


@triton.jit
def {name}_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # 64-bit: past 2^31 elements
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x, mask=mask)
"""

_TEST = """\
\"\"\"{ns}::{name}: build the op folder and verify every kernel against the CPU reference (on a
machine without a GPU, the reference against the description's .equivalent() expression).\"\"\"

from pathlib import Path

import pytest
import torch

import opforge
from opforge import verify

FOLDER = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def library():
    \"\"\"The folder built and loaded once for the tests below, in the build folder `opforge build`
    and `opforge verify` use for it: a run after an edit recompiles only what changed.\"\"\"
    return opforge.load_library(opforge.build_library("{name}", folder=FOLDER))


def test_{name}_passes_verify(library):
    report = verify.verify_op("{ns}::{name}", device="cuda" if torch.cuda.is_available() else "cpu", seed=0)
    verify.print_report(report)
    assert report.ok, [(r.check, r.case, r.message) for r in report.failures]
"""

_SHAPE_TEST = """\


def test_{name}_at_the_shape_of_the_model(library):
    \"\"\"The shape and dtype the model calls it with ({shape}, {dtype}): the device's result
    against the CPU reference.\"\"\"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn({shape}, dtype=torch.{dtype}, device=device)
    expected = torch.ops.{ns}.{name}(x.cpu())
    torch.testing.assert_close(torch.ops.{ns}.{name}(x).cpu(), expected)
"""


#: C++ keywords (C++20, [lex.key]) and the names the generated files use themselves.
_CPP_RESERVED = set(
    "alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class "
    "compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype "
    "default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline "
    "int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register "
    "reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template "
    "this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t "
    "while xor xor_eq T N opforge".split()
)


def _identifier(part: str, what: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part) or keyword.iskeyword(part):
        raise ValueError(f"{what} {part!r} must be a C++ and Python identifier (letters, digits, _)")
    if part in _CPP_RESERVED or "__" in part or re.match(r"_[A-Z]", part):
        raise ValueError(f"{what} {part!r} is reserved in C++ or used by the generated code; pick another")
    return part


def new_op(
    qualified: str, parent: Path, dtypes: list[str], shape: list[int] | None = None, *, triton: bool = False
) -> list[Path]:
    """Writes the op folder ``parent/<name>/`` for ``qualified`` ("ns::name") taking `dtypes`
    (names from :data:`DTYPES`); with `shape` (sizes, as ``opforge doctor`` found them), its test
    also runs the op at that shape in the first dtype; with `triton`, its device kernel is a
    Triton kernel (``kernels/<name>.py``) instead of CUDA C++. Returns the files written: the op
    file, the kernel, the test.

    Raises:
        ValueError: `qualified` is not "ns::name" of identifiers (C++ keywords, reserved names and
            torch's namespaces refused), a dtype is unknown or none is given, a size is negative,
            ``parent/<name>`` already exists (nothing is overwritten), or the folder cannot be
            written.
    """
    if qualified.count("::") != 1:
        raise ValueError(f"expected a qualified op name ns::name, got {qualified!r}")
    ns, name = qualified.split("::")
    _identifier(ns, "namespace")
    _identifier(name, "op name")
    if ns in TORCH_NAMESPACES:
        raise ValueError(f"namespace {ns!r} is torch's own; pick one for your ops")
    dtypes = list(dict.fromkeys(d.strip() for d in dtypes))  # "float32, float16" as "float32,float16"
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        raise ValueError(f"dtypes must be among {', '.join(DTYPES)}; got {', '.join(dtypes) or 'none'}")
    if shape is not None and any(d < 0 for d in shape):
        raise ValueError(f"sizes of --shape must be at least 0, got {shape}")
    if shape is not None and math.prod(shape) > 2**31:
        raise ValueError(
            f"--shape {shape} has {math.prod(shape)} elements; its test allocates it, so keep it at 2^31 or fewer"
        )
    folder = parent / name
    if folder.exists():
        raise ValueError(f"{folder} already exists; pick another name or folder")
    values = {"ns": ns, "name": name, "folder": folder, "dtypes": " | ".join(DTYPES[d] for d in dtypes)}
    files = {
        folder / f"{name}.cpp": _TRITON_OP_FILE if triton else _OP_FILE,
        folder / "kernels" / f"{name}.{'py' if triton else 'cu'}": _TRITON_KERNEL if triton else _KERNEL,
        folder / f"test_{name}.py": _TEST + (_SHAPE_TEST if shape is not None else ""),
    }
    values.update(shape=tuple(shape or ()), dtype=dtypes[0])
    try:
        (folder / "kernels").mkdir(parents=True)
        for path, template in files.items():
            path.write_text(template.format(**values))
    except OSError as e:
        raise ValueError(f"cannot write {folder}: {e.strerror or e}") from e
    return list(files)
