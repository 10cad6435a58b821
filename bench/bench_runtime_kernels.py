"""Run-time kernels: edit-to-result time, and bandwidth against the ahead-of-time build.

1. Bandwidth: ``examples::softshrink`` (NVRTC, run-time) against the same kernel source built
   ahead of time by nvcc (``bench/softshrink_aot``) and a device-to-device copy, 1 GiB inputs.
2. Edit -> next correct result: edit the kernel source of a small op, ``opforge.reload()``,
   call, synchronise and check the result: cold (source never compiled before) and cached
   (source already in the on-disk cache); against the same edit rebuilt by
   ``torch.utils.cpp_extension.load_inline``, in the same run.

    python3 bench/bench_runtime_kernels.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import opforge

ROOT = Path(__file__).resolve().parents[1]

OP = """
#include <opforge/op.h>
static void ref(opforge::Tensor x, opforge::MutableTensor y) {
  for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = x.data<float>()[i];
}
OPFORGE_OP(bench, edited)
    .input("x", opforge::kFloat32)
    .output("y", opforge::like("x"))
    .reference(ref)
    .cuda_source("edited.cu", "edited")
    .launch(opforge::elementwise("y"));
"""

KERNEL = """#include <opforge/kernel.cuh>
__global__ void edited(const float* x, float* y, int64_t n) {
  const int64_t i = opforge::kernel::global_index();
  if (i < n) y[i] = x[i] * SCALE;
}
"""

INLINE_CUDA = """
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>
__global__ void edited(const float* x, float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * SCALE;
}
torch::Tensor run(torch::Tensor x) {
  auto y = torch::empty_like(x);
  const int64_t n = x.numel();
  edited<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""


def bandwidth_rows() -> list[dict]:
    aot = opforge.build_library(
        "softshrink_aot",
        [ROOT / "bench/softshrink_aot/softshrink_aot.cpp", ROOT / "bench/softshrink_aot/softshrink_aot.cu"],
    )
    opforge.load_library(aot)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2**30 // torch.finfo(dtype).bits * 8, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()
        torch.testing.assert_close(torch.ops.examples.softshrink(x, 0.5), F.softshrink(x, 0.5))
        torch.testing.assert_close(torch.ops.bench.softshrink_aot(x, 0.5), F.softshrink(x, 0.5))
        copy = do_bench(lambda: y.copy_(x), warmup=50, rep=400, return_mode="median")
        aot_ms = do_bench(lambda: torch.ops.bench.softshrink_aot(x, 0.5), warmup=50, rep=400, return_mode="median")
        rtc_ms = do_bench(lambda: torch.ops.examples.softshrink(x, 0.5), warmup=50, rep=400, return_mode="median")
        for impl, ms in [
            ("device-to-device copy", copy),
            ("softshrink, nvcc ahead of time", aot_ms),
            ("softshrink, NVRTC at run time", rtc_ms),
        ]:
            rows.append(
                {
                    "case": f"softshrink {str(dtype)[6:]} 1 GiB",
                    "impl": impl,
                    "ms": ms,
                    "GB/s": nbytes / ms / 1e6,
                    "vs_copy": copy / ms,
                    "vs_aot": aot_ms / ms,
                }
            )
        del x, y
    return rows


def edit_rows(work: Path) -> list[dict]:
    (work / "edited.cpp").write_text(OP)
    kernel = work / "edited.cu"
    kernel.write_text(KERNEL.replace("SCALE", "1.0f"))
    opforge.load_library(
        opforge.build_library("edited_ops", [work / "edited.cpp"], kernels=[kernel], build_dir=work / "build")
    )
    x = torch.randn(1 << 20, device="cuda")
    torch.ops.bench.edited(x)

    def edit_and_run(scale: float) -> float:
        t0 = time.perf_counter()
        kernel.write_text(KERNEL.replace("SCALE", f"{scale}f"))
        opforge.reload()
        y = torch.ops.bench.edited(x)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        torch.testing.assert_close(y, x * scale)
        return elapsed

    cold = [edit_and_run(2.0 + i) for i in range(5)]  # new sources: NVRTC compiles
    cached = [edit_and_run(2.0 + i) for i in range(5)]  # the same sources again: cache hits
    from torch.utils.cpp_extension import load_inline

    def inline_build(scale: float) -> float:
        t0 = time.perf_counter()
        module = load_inline(
            "edited_inline",
            cpp_sources="torch::Tensor run(torch::Tensor x);",
            cuda_sources=INLINE_CUDA.replace("SCALE", f"{scale}f"),
            functions=["run"],
            build_directory=str(work / "inline"),
            extra_cuda_cflags=["-gencode=arch=compute_90,code=sm_90"],
        )
        y = module.run(x)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        torch.testing.assert_close(y, x * scale)
        return elapsed

    (work / "inline").mkdir()
    inline_build(1.0)  # first build of the extension (not counted)
    inline = inline_build(3.0)  # the edit
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return [
        {"path": "opforge run-time kernel, cold (NVRTC compile)", "s": med(cold), "vs_load_inline": inline / med(cold)},
        {"path": "opforge run-time kernel, cached", "s": med(cached), "vs_load_inline": inline / med(cached)},
        {"path": "torch.utils.cpp_extension.load_inline rebuild", "s": inline, "vs_load_inline": 1.0},
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    opforge.load_library(opforge.example_library("softshrink"))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("OPFORGE_CACHE_DIR", str(Path(tmp) / "cache"))
        bw = bandwidth_rows()
        edits = edit_rows(Path(tmp))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {os.cpu_count()} CPUs")
    for r in bw:
        print(
            f"  {r['case']:<24} {r['impl']:<32} {r['ms']:7.3f} ms {r['GB/s']:7.0f} GB/s "
            f"{r['vs_copy']:.3f} x copy {r['vs_aot']:.3f} x nvcc"
        )
    print("edit -> next correct result")
    for r in edits:
        print(f"  {r['path']:<48} {r['s'] * 1e3:9.1f} ms  {r['vs_load_inline']:8.1f} x faster than load_inline")
    if args.json:
        Path(args.json).write_text(json.dumps({"bandwidth": bw, "edit": edits}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
