"""Drive every example op's CUDA kernel through the shapes that stress indexing, for
compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tools/sanitize.py [group...]

(groups: ops attention mixed_dtypes serving backward classes; default all).

Sizes straddle the vector width and the block size, and inputs include storage offsets that
defeat 16-byte alignment (the adapter copies them into aligned memory unless the op declares
the input strided), zero-size tensors, and permuted, sliced, offset and expanded views of the
first input (read as they are by ops that declare it strided). Exits
non-zero if an output differs from the CPU reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import opforge  # noqa: E402
import serving  # noqa: E402
from conftest import CASES, INT8_LINEAR_TAIL_SHAPES, TOLERANCE, strided_views  # noqa: E402


def attention_cases() -> int:
    """examples::attention and its backward op (not in CASES: they take q, k, v, head_dim and an
    optional mask) over lengths that straddle the forward's 128-query and 32/64/128-key tiles (and
    pass its Hopper path's two-stage K/V ring more than once) and
    the backward's 64-key and 32-query ones, every head dim, with and without mask and causal,
    head-split (strided) views and a misaligned q; returns the number of mismatches."""
    opforge.load_library(opforge.example_library("attention"))
    failures = 0
    for dtype in (torch.float16, torch.bfloat16):
        for head_dim in (32, 64, 128):
            for sq, sk in ((1, 1), (129, 65), (64, 31), (200, 0), (130, 400)):  # 400: the K/V ring turns over
                for causal in (False, True):
                    for offset in (0, 1):
                        if offset:  # misaligned q (copied by the adapter), dense k and v
                            q = torch.randn(2, 2, sq, head_dim, dtype=dtype, device="cuda")
                            q = torch.empty(q.numel() + 1, dtype=dtype, device="cuda")[1:].view_as(q).copy_(q)
                            k, v = (torch.randn(2, 2, sk, head_dim, dtype=dtype, device="cuda") for _ in range(2))
                        else:  # head-split views of one q/k/v projection, read in place by the kernel
                            qkv = torch.randn(2, max(sq, sk), 3, 2, head_dim, dtype=dtype, device="cuda")
                            q, k, v = (t.transpose(1, 2)[:, :, :n] for t, n in zip(qkv.unbind(2), (sq, sk, sk)))
                        mask = torch.randn(2, sk, dtype=dtype, device="cuda") if offset or causal else None
                        args = (q, k, v, head_dim, mask)
                        out, lse = torch.ops.examples.attention(*args, causal=causal)
                        ref, ref_lse = torch.ops.examples.attention(
                            *[a.cpu() if isinstance(a, torch.Tensor) else a for a in args], causal=causal
                        )
                        if not torch.allclose(out.cpu().double(), ref.double(), atol=2.5e-2, rtol=2.5e-2) or not (
                            torch.allclose(lse.cpu(), ref_lse, atol=2e-3, rtol=1e-5)
                        ):
                            print(
                                f"MISMATCH attention {dtype} head_dim={head_dim} sq={sq} sk={sk} causal={causal} "
                                f"offset={offset}"
                            )
                            failures += 1
                        # its backward op (examples::attention_backward) on the same views
                        grad_o = torch.randn_like(out)
                        bwd = (q, k, v, grad_o, out, lse, head_dim, mask, causal)
                        grads = torch.ops.examples.attention_backward(*bwd)
                        refs = torch.ops.examples.attention_backward(
                            *[a.cpu() if isinstance(a, torch.Tensor) else a for a in bwd]
                        )
                        for name, g, r in zip(("grad_q", "grad_k", "grad_v"), grads, refs):
                            error = (g.cpu().double() - r.double()).abs()
                            if g.numel() and error.max() > 3e-2 * (1 + r.double().abs().max()):
                                print(
                                    f"MISMATCH attention_backward {name} {dtype} head_dim={head_dim} sq={sq} "
                                    f"sk={sk} causal={causal} offset={offset}"
                                )
                                failures += 1
    return failures


def mixed_dtype_cases() -> int:
    """examples::rms_norm with a float32 weight beside 16-bit and float64 inputs (the {T_weight}
    instantiations), over row lengths on either side of its register path and a misaligned
    weight (copied by the adapter); returns the number of mismatches."""
    failures = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        for rows, cols in ((1, 8), (7, 96), (3, 4097), (5, 8192), (0, 64), (33, 255)):
            for offset in (0, 1):
                x = torch.randn(rows, cols, dtype=dtype, device="cuda")
                w = torch.empty(cols + offset, device="cuda")[offset:].normal_()
                out = torch.ops.examples.rms_norm(x, w)
                ref = torch.ops.examples.rms_norm(x.cpu(), w.cpu())
                tol = TOLERANCE[dtype]
                if not torch.allclose(out.cpu().double(), ref.double(), atol=tol, rtol=tol):
                    print(f"MISMATCH rms_norm {dtype} x [{rows}, {cols}] with a float32 weight, offset={offset}")
                    failures += 1
    return failures


def serving_cases() -> int:
    """The serving ops that write their inputs, and silu_and_mul (tests/python/serving.py), over
    sizes that straddle their vectors and blocks, views of a fused qkv projection, partial
    rotary in both layouts, with and without a key, and padding slots; returns the number of
    mismatches."""
    serving.load()
    cases = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for rows, cols in ((1, 8), (7, 96), (3, 4097), (5, 8192), (0, 64), (4, 0)):
            cases.append(("fused_add_rms_norm", serving.fused_add_rms_norm(rows, cols, dtype, "cuda"), dtype))
        for tokens, heads, head_dim, rot in ((1, 1, 64, 64), (33, 8, 64, 32), (0, 2, 64, 64)):
            for neox in (True, False):
                for key in (True, False):
                    args = serving.rotary(tokens, heads, head_dim, rot, dtype, "cuda", neox=neox, key=key)
                    cases.append(("rotary_embedding", args, dtype))
        for tokens, heads, head_dim in ((1, 1, 8), (13, 4, 64), (300, 8, 128)):
            cases.append(("kv_cache_write", serving.kv_cache(tokens, heads, head_dim, 64, 16, dtype, "cuda"), dtype))
        for rows, d in ((1, 1), (3, 37), (5, 4096), (0, 8)):
            cases.append(("silu_and_mul", serving.silu_and_mul(rows, d, dtype, "cuda"), dtype))
    failures = 0
    for name, args, dtype in cases:
        why = serving.compare_with_reference(name, args, dtype)
        if why:
            print(f"MISMATCH {name} {dtype} {[list(a.shape) for a in args if isinstance(a, torch.Tensor)]}: {why}")
            failures += 1
    return failures


def backward_cases() -> int:
    """The backward ops of bias_gelu, rms_norm, add_layer_norm and fused_add_rms_norm called
    directly (both kernel paths: rows in registers, and the loops for rows not a whole number of
    vectors or wider than the registers hold; more rows than resident blocks; no rows), against
    their CPU references."""
    for lib in ("bias_gelu", "rms_norm", "add_layer_norm", "fused_add_rms_norm"):
        opforge.load_library(opforge.example_library(lib))
    ex = torch.ops.examples
    failures = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for rows, cols in ((0, 64), (1, 8), (5, 50), (3, 20000), (700, 64), (33, 4096)):

            def t(*shape, dt=dtype):
                return torch.randn(*shape, dtype=dt, device="cuda")

            g, x, r, w = t(rows, cols), t(rows, cols), t(rows, cols), t(cols)
            calls = [
                ("rms_norm_backward", (g, x, w, 1e-6)),
                ("add_layer_norm_backward", (g, x, r, w, 1e-5)),
                ("fused_add_rms_norm_backward", (g, r, x, w, 1e-6)),
            ]
            if dtype != torch.float64:
                calls.append(("bias_gelu_backward", (g, x, w)))
            if dtype in (torch.float16, torch.bfloat16):
                calls.append(("rms_norm_backward", (g, x, w.float(), 1e-6)))
            for name, args in calls:
                out = getattr(ex, name)(*args)
                ref = getattr(ex, name)(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
                for k, (o, e) in enumerate(zip(out, ref)):
                    tol = TOLERANCE[e.dtype] * (1 if o.dim() == 2 else max(1.0, rows**0.5))
                    if not torch.allclose(o.cpu().double(), e.double(), atol=tol, rtol=TOLERANCE[e.dtype]):
                        print(f"MISMATCH {name} {dtype} [{rows}, {cols}] output {k}")
                        failures += 1
    return failures


def class_cases() -> int:
    """The custom classes' ops: int8_linear_pack and int8_linear (through Int8Linear, built on
    the GPU, against the CPU reference of an object built on the CPU) over rows on both sides of
    the pass kernel's 8- and 16-row variants and the per-warp rings' 64-row limit (larger:
    the cuBLAS path), output channels in odd strips and in more than 8 strips a multiprocessor
    (three passes of the pass kernel; rows <= 16 there), input channels past a warp's ring of
    weight stages (4672 = 73 chunks of 64), with and without bias, and no input channels (y = bias);
    weights with tails (conftest's INT8_LINEAR_TAIL_SHAPES; the many strips with both);
    IdentityConvClass.forward on a permuted view."""
    for lib in ("int8_linear", "identity_conv"):
        opforge.load_library(opforge.example_library(lib))
    classes = torch.classes.examples
    failures = 0
    many = 8 * (17 * torch.cuda.get_device_properties(0).multi_processor_count + 3)
    for n, k, bias in (
        (8, 64, True),
        (72, 192, False),
        (136, 320, True),
        (72, 4672, True),
        (16, 0, True),
        (many, 320, True),
        *INT8_LINEAR_TAIL_SHAPES,
        (many + 5, 360, True),
    ):
        w = torch.randn(n, k)
        b = torch.randn(n) if bias else None
        cpu, gpu = classes.Int8Linear(w, b), classes.Int8Linear(w.cuda(), None if b is None else b.cuda())
        if not (torch.equal(gpu.qweight.cpu(), cpu.qweight) and torch.equal(gpu.scales.cpu(), cpu.scales)):
            print(f"MISMATCH int8_linear_pack [{n}, {k}]")
            failures += 1
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for rows in (0, 1, 4, 5, 8, 9, 15, 17, 64, 65, 300):
                if n >= many and rows > 16:  # the pass kernel's three passes; the rest is above
                    continue
                if k > 1024 and rows > 64:  # the long rows are for the small-M kernel's ring; cuBLAS
                    continue  # picks split-K GEMMs there, whose own shared memory racecheck flags
                x = torch.randn(rows, k, dtype=dtype)
                out, ref = gpu.forward(x.cuda()), cpu.forward(x)
                tol = TOLERANCE[dtype] * k**0.5  # float32 sums of k products, in any order
                if not torch.allclose(out.cpu().double(), ref.double(), atol=tol, rtol=tol):
                    print(f"MISMATCH int8_linear {dtype} [{rows}, {k}] x [{n}, {k}]")
                    failures += 1
    conv = classes.IdentityConvClass(5)
    x = torch.randn(2, 7, 5, device="cuda").transpose(1, 2)
    if not torch.equal(conv.forward(x), x):
        print("MISMATCH IdentityConvClass.forward on a transposed view")
        failures += 1
    return failures


def op_cases() -> int:
    """Every op of tests/python/conftest.py's CASES over batches 0, 1, 3 and 257, misaligned and
    strided views of the first input; returns the number of mismatches."""
    failures = 0
    for name, case in CASES.items():
        for dtype in case.dtypes:
            for batch in (0, 1, 3, 257):
                args, kwargs = case.make(batch, dtype, "cuda")
                layouts = [
                    (
                        f"offset={offset}",
                        [
                            torch.empty(a.numel() + offset, dtype=a.dtype, device="cuda")[offset:].view_as(a).copy_(a)
                            for a in args
                        ],
                    )
                    for offset in (0, 1)
                ]
                layouts += [(label, [view, *args[1:]]) for label, view in strided_views(args[0])]
                for label, inputs in layouts:
                    out = case.op(*inputs, **kwargs)
                    ref = case.op(*[a.cpu() for a in inputs], **kwargs)
                    tol = TOLERANCE[dtype]
                    if not torch.allclose(out.cpu().double(), ref.double(), atol=tol, rtol=tol, equal_nan=True):
                        print(f"MISMATCH {name} {dtype} batch={batch} {label}")
                        failures += 1
    return failures


GROUPS = {
    "ops": op_cases,
    "attention": attention_cases,
    "mixed_dtypes": mixed_dtype_cases,
    "serving": serving_cases,
    "backward": backward_cases,
    "classes": class_cases,
}


def main(argv: list[str]) -> int:
    """Runs the groups named in ``argv`` (default: all of GROUPS)."""
    unknown = [g for g in argv if g not in GROUPS]
    if unknown:
        print(f"sanitize.py: unknown group {', '.join(unknown)}; groups: {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    for case in CASES.values():  # the groups call these ops too
        opforge.load_library(case.library_path)
    failures = sum(GROUPS[g]() for g in argv or GROUPS)
    torch.cuda.synchronize()
    print(f"sanitize: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
