"""Launch the bandwidth-bound example kernels once each, at their benchmarks' sizes, for Nsight
Compute to profile (`tools/device_check.sh ncu`): bias_gelu float32 and bfloat16 at 1 GiB (the
kernel's behaviour does not depend on the size past a few waves) and rms_norm bfloat16, float16
and float32 at [32768, 4096]. Prints nothing; the numbers are ncu's. (A same-size
device-to-device copy is a cudaMemcpy, not a kernel, so ncu has no copy to compare with; the
benchmarks give the ratio to copy bandwidth.)

    ncu --kernel-name regex:'bias_gelu|rms_norm' --metrics ... python3 tools/ncu_kernels.py
"""

from __future__ import annotations

import torch

import opforge


def main() -> None:
    for op in ("bias_gelu", "rms_norm"):
        opforge.load_library(opforge.example_library(op))
    for dtype in (torch.float32, torch.bfloat16):
        cols = 1536
        x = torch.randn(2**30 // dtype.itemsize // cols, cols, device="cuda", dtype=dtype)
        b = torch.randn(cols, device="cuda", dtype=dtype)
        torch.ops.examples.bias_gelu(x, b)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.randn(32768, 4096, device="cuda", dtype=dtype)
        w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
        torch.ops.examples.rms_norm(x, w, 1e-6)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
