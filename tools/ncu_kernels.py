"""Launch example kernels once each, at their benchmarks' sizes, for Nsight Compute to profile
(`tools/device_check.sh ncu`, with NCU_GROUP naming the group). Groups:

- ``elementwise`` (default): bias_gelu float32 and bfloat16 at 1 GiB (the kernel's behaviour does
  not depend on the size past a few waves) and rms_norm bfloat16, float16 and float32 at
  [32768, 4096].
- ``int8_linear``: Int8Linear.forward in float16 on the weights of bench_int8_linear.py at
  M = 1 and 16 (the pass kernel, which dequantises in registers).
- ``backward``: the backward ops of add_layer_norm and fused_add_rms_norm in bfloat16 and float16
  at [32768, 4096].
- ``attention``: examples::attention and examples::attention_backward in bfloat16 at [8, 16, 4096,
  D] (bench_attention.py's size), D = 128 and 64, not causal (kernels attention, prep, kv,
  finish_q; prep_sm90 and kv_sm90 instead of prep and kv on compute capability 9.0).

Prints nothing; the numbers are ncu's. (A same-size device-to-device copy is a cudaMemcpy, not a
kernel, so ncu has no copy to compare with; the benchmarks give the ratio to copy bandwidth.)

    ncu --kernel-name regex:'bias_gelu|rms_norm' --metrics ... python3 tools/ncu_kernels.py [group]
"""

from __future__ import annotations

import sys

import torch

import opforge


def elementwise() -> None:
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


def int8_linear() -> None:
    opforge.load_library(opforge.example_library("int8_linear"))
    for n, k in ((4096, 4096), (14336, 4096), (4096, 14336)):
        q8 = torch.classes.examples.Int8Linear(torch.randn(n, k, device="cuda") / k**0.5, None)
        for m in (1, 16):
            q8.forward(torch.randn(m, k, device="cuda", dtype=torch.float16))


def backward() -> None:
    for op in ("add_layer_norm", "fused_add_rms_norm"):
        opforge.load_library(opforge.example_library(op))
    for dtype in (torch.bfloat16, torch.float16):
        t = [torch.randn(32768, 4096, device="cuda", dtype=dtype) for _ in range(3)]
        w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
        torch.ops.examples.add_layer_norm_backward(t[0], t[1], t[2], w, 1e-5)
        torch.ops.examples.fused_add_rms_norm_backward(t[0], t[1], t[2], w, 1e-6)


def attention() -> None:
    opforge.load_library(opforge.example_library("attention"))
    for head_dim in (128, 64):
        q, k, v, grad_o = (torch.randn(8, 16, 4096, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = torch.ops.examples.attention(q, k, v, head_dim)
        torch.ops.examples.attention_backward(q, k, v, grad_o, o, lse, head_dim)


GROUPS = {"elementwise": elementwise, "int8_linear": int8_linear, "backward": backward, "attention": attention}


def main(argv: list[str]) -> int:
    group = argv[0] if argv else "elementwise"
    if group not in GROUPS:
        print(f"ncu_kernels: unknown group {group!r}; expected one of {sorted(GROUPS)}", file=sys.stderr)
        return 2
    GROUPS[group]()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
