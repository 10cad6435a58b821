"""Drive every example op's CUDA kernel through the shapes that stress indexing, for
compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tools/sanitize.py

Sizes straddle the vector width and the block size, and inputs include storage offsets that
defeat 16-byte alignment (the scalar path) and zero-size tensors. Exits non-zero if an output
differs from the CPU reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from conftest import CASES, TOLERANCE  # noqa: E402

import opforge  # noqa: E402


def main() -> int:
    for name in CASES:
        opforge.load_library(opforge.example_library(name))
    failures = 0
    for name, case in CASES.items():
        for dtype in case.dtypes:
            for batch in (0, 1, 3, 257):
                args, kwargs = case.make(batch, dtype, "cuda")
                for offset in (0, 1):
                    shifted = [torch.empty(a.numel() + offset, dtype=a.dtype, device="cuda")[offset:].view_as(a).copy_(a)
                               for a in args]
                    out = case.op(*shifted, **kwargs)
                    ref = case.op(*[a.cpu() for a in shifted], **kwargs)
                    tol = TOLERANCE[dtype]
                    if not torch.allclose(out.cpu().double(), ref.double(), atol=tol, rtol=tol, equal_nan=True):
                        print(f"MISMATCH {name} {dtype} batch={batch} offset={offset}")
                        failures += 1
    torch.cuda.synchronize()
    print(f"sanitize: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
