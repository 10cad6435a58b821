"""Drive every example op's CUDA kernel through the shapes that stress indexing, for
compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tools/sanitize.py

Sizes straddle the vector width and the block size, and inputs include storage offsets that
defeat 16-byte alignment (the scalar path), zero-size tensors, and permuted, sliced, offset and
expanded views of the first input (read as they are by ops that declare it strided). Exits
non-zero if an output differs from the CPU reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from conftest import CASES, TOLERANCE, strided_views  # noqa: E402

import opforge  # noqa: E402


def main() -> int:
    for name in CASES:
        opforge.load_library(opforge.example_library(name))
    failures = 0
    for name, case in CASES.items():
        for dtype in case.dtypes:
            for batch in (0, 1, 3, 257):
                args, kwargs = case.make(batch, dtype, "cuda")
                layouts = [(f"offset={offset}", [torch.empty(a.numel() + offset, dtype=a.dtype, device="cuda")[offset:]
                                                 .view_as(a).copy_(a) for a in args]) for offset in (0, 1)]
                layouts += [(label, [view, *args[1:]]) for label, view in strided_views(args[0])]
                for label, inputs in layouts:
                    out = case.op(*inputs, **kwargs)
                    ref = case.op(*[a.cpu() for a in inputs], **kwargs)
                    tol = TOLERANCE[dtype]
                    if not torch.allclose(out.cpu().double(), ref.double(), atol=tol, rtol=tol, equal_nan=True):
                        print(f"MISMATCH {name} {dtype} batch={batch} {label}")
                        failures += 1
    torch.cuda.synchronize()
    print(f"sanitize: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
