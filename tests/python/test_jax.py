"""opforge ops from JAX (opforge.jax): every example op gives the result it gives through PyTorch
(on the CPU: its reference), with the same input errors; jit, vmap (one call, per-element fallback,
nested, empty batch), grad through backward ops (in-place ones too), a missing backward, and the
jax.export round trip in a fresh process.

The tests mean the CPU unless they say CUDA: JAX's default device is the GPU where jax has CUDA,
so every test here runs with the CPU as its default device (the cpu_by_default fixture), fresh
processes get JAX_PLATFORMS=cpu, and a CUDA test places its arrays on the GPU itself. Random
data comes from the test's seed (run_options.py): jax.random.key(seed), verify's cases."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import opforge  # noqa: E402
import opforge.jax as ojax  # noqa: E402
from opforge import _core  # noqa: E402
from opforge.verify import cases as vcases  # noqa: E402
from opforge.verify.compare import compare  # noqa: E402

jax.config.update("jax_enable_x64", True)  # int64 and float64 arrays, as torch has them

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = sorted(p.name for p in (ROOT / "examples" / "ops").iterdir() if p.is_dir())
#: Every op of every example library, read from the core (no framework) for parametrization.
OPS = [(lib, op.name) for lib in LIBRARIES for op in _core.load_library(opforge.example_library(lib)).ops]
#: The generated cases each op runs (verify's cases by label, before any " without <optional>").
LABELS = {"shape 3x37", "shape 33x257", "params #1", "no leading dims", "empty"}


def _jax_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


requires_jax_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and _jax_gpu()), reason="needs a CUDA GPU that torch and jax both see; none here"
)
JAX_DEVICES = ["cpu", pytest.param("cuda", marks=requires_jax_cuda)]


#: The environment of a fresh process that means the CPU, where jax has CUDA too.
CPU_ONLY = {**os.environ, "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module", autouse=True)
def libraries():
    """Every example library, loaded into JAX (and, by conftest, into torch)."""
    return {lib: ojax.load_library(opforge.example_library(lib)) for lib in LIBRARIES}


@pytest.fixture(autouse=True)
def cpu_by_default():
    """Arrays made and computations run without a device of their own are on the CPU (JAX's
    default device is the GPU where jax has CUDA); arrays placed on the GPU stay there."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def key(seed) -> jax.Array:
    """The test's JAX random key, from its seed."""
    return jax.random.key(seed)


def to_jax(t: torch.Tensor) -> jax.Array:
    """A torch tensor as a JAX array on the same device (DLPack; made dense first)."""
    return jax.dlpack.from_dlpack(t.contiguous())


def to_torch(a) -> torch.Tensor | None:
    return None if a is None else torch.from_dlpack(a)


def jax_op(name: str) -> ojax.JaxOp:
    ns, op = name.split("::")
    return getattr(getattr(ojax.ops, ns), op)


def torch_results(op, args: list) -> list:
    """The op through torch: its outputs (None where absent), then its written inputs after the call."""
    ns, name = op.name.split("::")
    out = getattr(getattr(torch.ops, ns), name)(*args)
    outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
    return outs + [args[a.index] for a in op.mutated if args[a.index] is not None]


@pytest.mark.parametrize("device", JAX_DEVICES)
@pytest.mark.parametrize(("library", "name"), OPS, ids=[name for _, name in OPS])
def test_every_example_op_gives_the_same_result_through_jax_as_through_torch(library, name, device, seed):
    op = next(o for o in opforge.load_library(opforge.example_library(library)).ops if o.name == name)
    ran = 0
    for k, dtypes in enumerate(vcases.dtype_cases(op, device=device)):  # those its kernel on the device takes
        for case in vcases.generate_cases(
            op, dtypes.dtypes, seed + k, only=lambda label: label.split(" without")[0] in LABELS, pinned=dtypes.params
        ):
            args = [a.to(device).contiguous() if isinstance(a, torch.Tensor) else a for a in case.args]
            jax_args = [to_jax(a) if isinstance(a, torch.Tensor) else a for a in args]
            got = jax_op(name)(*jax_args)
            got = list(got) if isinstance(got, tuple) else [got]
            expected = torch_results(op, [a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            where = f"{case.label} ({dtypes.label}, case seed {case.seed})"
            assert len(got) == len(expected), where
            for g, e in zip(got, expected, strict=True):
                if e is None:
                    assert g is None, where
                    continue
                g = to_torch(g)
                assert g.dtype == e.dtype and g.shape == e.shape, where
                if device == "cpu" and g.dtype.itemsize == 1 and g.dtype.is_floating_point:  # float8: no torch.equal
                    assert torch.equal(g.view(torch.uint8), e.view(torch.uint8)), where
                elif device == "cpu":  # the same reference, in the same process: the same bits
                    assert torch.equal(g.nan_to_num(), e.nan_to_num()), where
                # On CUDA the same kernel; a reduction may sum in another order. (The kernels against
                # the CPU reference are opforge verify's: tests/python/test_verify.py, the GPU machine.)
                ok, err, _, why = compare(g, e, dtypes.tolerance)
                assert ok, f"{where}: {why or err}"
            ran += 1
    assert ran > 0


def test_arrays_on_the_cpu_are_checked_as_cpu_arrays_where_the_default_backend_is_a_gpu(monkeypatch):
    """Where JAX's default backend is a GPU, an op called on arrays committed to the CPU runs there
    (the CPU reference, which takes float32), so the core checks them as CPU arrays; arrays being
    traced are checked for the default device, the default backend's where none is set (the
    attention kernel on CUDA takes float16 and bfloat16 only)."""
    opforge.load_library(opforge.example_library("attention"))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    cpu = jax.devices("cpu")[0]
    q, k, v = (jax.device_put(jnp.full((1, 2, 8, 64), 0.1 * i, jnp.float32), cpu) for i in (1, 2, 3))
    expected = torch.ops.examples.attention(*(to_torch(a) for a in (q, k, v)), 64, None, causal=True, scale=0.125)
    attention = functools.partial(ojax.ops.examples.attention, head_dim=64, causal=True, scale=0.125)
    with jax.default_device(None):
        got = attention(q, k, v)
        with pytest.raises(ValueError, match=r"q: expected dtype one of \{float16, bfloat16\} on cuda"):
            jax.jit(attention)(q, k, v)
    assert all(torch.equal(to_torch(g), e) for g, e in zip(got, expected, strict=True))
    traced_on_cpu = jax.jit(attention)(q, k, v)  # under the module's default device, the CPU
    assert all(torch.equal(to_torch(g), e) for g, e in zip(traced_on_cpu, expected, strict=True))


def test_a_result_below_the_smallest_normal_is_the_same_bits_through_jax_and_torch():
    """The CPU reference computes in IEEE arithmetic whatever mode its caller runs in: gelu'(v)
    for v near -13 is below float32's smallest normal, and is that number through torch, through
    torch with flush_denormal set, and through JAX (whose CPU runtime flushes subnormals)."""
    x = torch.tensor([[-13.5, -13.2, -12.9, -1.0]])
    bias, grad_y = torch.zeros(4), torch.ones(1, 4)
    grad_x, grad_bias = torch.ops.examples.bias_gelu_backward(grad_y, x, bias)
    tiny = torch.finfo(torch.float32).tiny
    assert 0 < -grad_x[0, 0] < tiny  # gelu'(-13.5): subnormal, as the reference computes it
    assert torch.set_flush_denormal(True)
    try:
        flushed = torch.ops.examples.bias_gelu_backward(grad_y, x, bias)
    finally:
        torch.set_flush_denormal(False)
    through_jax = ojax.ops.examples.bias_gelu_backward(to_jax(grad_y), to_jax(x), to_jax(bias))
    for got in (flushed, [to_torch(a) for a in through_jax]):
        assert torch.equal(got[0], grad_x) and torch.equal(got[1], grad_bias)


def test_bad_arguments_raise_the_pytorch_message_at_trace_time():
    x, bias = torch.randn(2, 3, 8, dtype=torch.bfloat16), torch.randn(4)
    with pytest.raises(ValueError) as from_torch:
        torch.ops.examples.bias_gelu(x, bias)
    with pytest.raises(ValueError) as from_jax:
        jax.jit(ojax.ops.examples.bias_gelu)(to_jax(x), to_jax(bias))
    assert str(from_jax.value) == str(from_torch.value)
    assert str(from_jax.value).splitlines()[1:] == [
        "  bias: expected dtype bfloat16 (the dtype of x), got float32",
        "  bias: expected shape [x.size(-1)] = [8], got [4]",
    ]


def test_parameters_are_checked_and_static():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"softshrink\(.*\n  lambd: expected a value >= 0(\.0)?, got -1"):
        ojax.ops.examples.softshrink(x, lambd=-1.0)
    with pytest.raises(ValueError, match=r"\n  lambd: expected a value of type float, got str 'big'"):
        ojax.ops.examples.softshrink(x, lambd="big")  # the core's message for a JSON value
    with pytest.raises(TypeError, match="examples::softshrink: parameter lambd is static"):
        jax.jit(ojax.ops.examples.softshrink)(x, jnp.float32(0.5))
    with pytest.raises(TypeError, match=r"examples::softshrink\(Tensor x, float lambd=0.5\) -> Tensor: .*unexpected"):
        ojax.ops.examples.softshrink(x, width=3)


def test_jit_compiles_once_per_shape_and_matches_eager(key):
    f = jax.jit(lambda x, b: ojax.ops.examples.bias_gelu(x, b) * 2)
    kx, kb = jax.random.split(key)
    x = jax.random.normal(kx, (4, 16), jnp.float32)
    b = jax.random.normal(kb, (16,), jnp.float32)
    ref = 2 * jax.nn.gelu(x + b, approximate=False)
    assert jnp.allclose(f(x, b), ref, atol=1e-6)
    assert jnp.array_equal(f(x[:2], b), f(x, b)[:2])
    assert f._cache_size() == 2


def test_vmap_batches_rowwise_ops_in_one_call_and_falls_back_per_element(key):
    rms = ojax.ops.examples.rms_norm
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (5, 3, 64))
    w = jax.random.uniform(kw, (5, 64)) + 0.5
    per_row = jnp.stack([rms(x[i], w[0]) for i in range(5)])
    one_call = jax.vmap(rms, in_axes=(0, None))(x, w[0])  # only x batched: a leading dim of one call
    assert jnp.array_equal(one_call, per_row)
    jaxpr = str(jax.make_jaxpr(jax.vmap(rms, in_axes=(0, None)))(x, w[0]))
    assert jaxpr.count("ffi_call") == 1 and "scan" not in jaxpr
    fallback = jax.vmap(rms)(x, w)  # a batched weight: one call per element
    assert "scan" in str(jax.make_jaxpr(jax.vmap(rms))(x, w))
    assert jnp.array_equal(fallback, jnp.stack([rms(x[i], w[i]) for i in range(5)]))
    moved = jax.vmap(rms, in_axes=(1, None), out_axes=1)(x, w[0])  # batch dim not in front
    assert jnp.array_equal(moved, jnp.stack([rms(x[:, j], w[0]) for j in range(3)], axis=1))


def test_nested_vmap_and_an_empty_batch(key):
    shrink = ojax.ops.examples.softshrink
    x = jax.random.normal(key, (3, 4, 7))
    assert jnp.array_equal(jax.vmap(jax.vmap(shrink))(x), shrink(x))
    rms = ojax.ops.examples.rms_norm
    w = jnp.ones((5, 8))
    assert jax.vmap(rms)(jnp.ones((0, 2, 8)), jnp.ones((0, 8))).shape == (0, 2, 8)  # per element, no element
    assert jax.vmap(rms, in_axes=(0, None))(jnp.ones((0, 2, 8)), w[0]).shape == (0, 2, 8)


def rms_norm(x, w, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


def layer_norm(h, w, b, eps=1e-5):
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + eps) * w + b


@pytest.mark.parametrize(
    ("name", "make", "reference"),
    [
        (
            "softshrink",
            lambda k: (jax.random.normal(k[0], (6, 33)),),
            lambda x: jnp.sign(x) * jnp.maximum(abs(x) - 0.5, 0),
        ),
        (
            "bias_gelu",
            lambda k: (jax.random.normal(k[0], (6, 33), jnp.float32), jax.random.normal(k[1], (33,), jnp.float32)),
            lambda x, b: jax.nn.gelu(x + b, approximate=False),  # float32 only
        ),
        (
            "rms_norm",
            lambda k: (jax.random.normal(k[0], (6, 33)), jax.random.uniform(k[1], (33,)) + 0.5),
            rms_norm,
        ),
        (
            "add_layer_norm",
            lambda k: (
                jax.random.normal(k[0], (6, 33)),
                jax.random.normal(k[1], (6, 33)),
                jax.random.uniform(k[2], (33,)) + 0.5,
                jax.random.normal(k[3], (33,)),
            ),
            lambda x, r, w, b: layer_norm(x + r, w, b),
        ),
    ],
)
def test_grad_runs_the_backward_op(name, make, reference, key):
    keys = jax.random.split(key, 5)
    args = make(keys[:4])
    cot = jax.random.normal(keys[4], (6, 33))
    argnums = tuple(range(len(args)))
    op = getattr(ojax.ops.examples, name)
    got = jax.grad(lambda *a: jnp.sum(op(*a) * cot), argnums)(*args)
    want = jax.grad(lambda *a: jnp.sum(reference(*a) * cot), argnums)(*args)
    tol = 1e-10 if args[0].dtype == jnp.float64 else 2e-5
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype and jnp.allclose(g, w, atol=tol, rtol=tol)
    assert jax.jit(jax.grad(lambda *a: jnp.sum(op(*a) * cot)))(*args).shape == args[0].shape


def test_grad_of_attention_runs_its_backward_op(key):
    """examples::attention in float64 (its CPU reference's): jax.grad of q, k and v through
    examples::attention_backward against the same attention written in jax.numpy."""
    kq, kk, kv, kc = jax.random.split(key, 4)
    q = jax.random.normal(kq, (1, 2, 5, 32), jnp.float64)
    k, v = (jax.random.normal(key, (1, 2, 7, 32), jnp.float64) for key in (kk, kv))
    cot = jax.random.normal(kc, q.shape, jnp.float64)

    def reference(q, k, v):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.3
        causal = jnp.arange(7)[None, :] > jnp.arange(5)[:, None]
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(jnp.where(causal, -jnp.inf, scores), axis=-1), v)

    def op(q, k, v):
        return ojax.ops.examples.attention(q, k, v, head_dim=32, causal=True, scale=0.3)

    got = jax.grad(lambda *a: jnp.sum(op(*a)[0] * cot), (0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(reference(*a) * cot), (0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):  # the saved lse is float32: probabilities to ~1e-7
        assert g.shape == w.shape and g.dtype == w.dtype and jnp.allclose(g, w, atol=1e-6, rtol=1e-6)
    # lse is not differentiable (attention_backward takes no grad_lse): its cotangent is stopped,
    # so a loss through o and lse gets o's gradient alone
    both = jax.grad(lambda *a: jnp.sum(op(*a)[0] * cot) + jnp.sum(op(*a)[1]), (0, 1, 2))(q, k, v)
    for g, w in zip(both, got, strict=True):
        assert jnp.array_equal(g, w)


def test_grad_of_an_op_that_writes_its_inputs(key):
    """fused_add_rms_norm returns the new x and residual; its backward op sees them as x_out and
    residual_out, and gives the gradients of the values before."""
    k = jax.random.split(key, 5)
    x, r = jax.random.normal(k[0], (4, 40)), jax.random.normal(k[1], (4, 40))
    w = jax.random.uniform(k[2], (40,)) + 0.5
    cx, cr = jax.random.normal(k[3], (4, 40)), jax.random.normal(k[4], (4, 40))

    def fused(x, r, w):
        x_out, r_out = ojax.ops.examples.fused_add_rms_norm(x, r, w)
        return jnp.sum(x_out * cx) + jnp.sum(r_out * cr)

    def plain(x, r, w):
        return jnp.sum(rms_norm(x + r, w) * cx) + jnp.sum((x + r) * cr)

    for g, want in zip(jax.grad(fused, (0, 1, 2))(x, r, w), jax.grad(plain, (0, 1, 2))(x, r, w), strict=True):
        assert jnp.allclose(g, want, atol=1e-10, rtol=1e-10)
    x_out, r_out = ojax.ops.examples.fused_add_rms_norm(x, r, w)
    assert jnp.array_equal(r_out, x + r) and jnp.allclose(x_out, rms_norm(x + r, w), atol=1e-12)


def test_a_gradient_through_an_op_without_backward_raises_and_forward_use_is_free():
    x = jnp.ones((2, 3, 4))
    with pytest.raises(NotImplementedError, match="derivative for examples::identity_conv is not implemented"):
        jax.grad(lambda x: ojax.ops.examples.identity_conv(x).sum())(x)
    w = jnp.float64(2.0)
    assert jax.grad(lambda w: jnp.sum(ojax.ops.examples.identity_conv(x) * w))(w) == x.size


def test_optional_inputs_and_outputs_follow_the_description(key):
    q8 = ojax.ops.examples.int8_linear_pack
    kw, kx = jax.random.split(key)
    w = jax.random.normal(kw, (16, 64))
    qweight, scales, bias = q8(w, None)
    assert bias is None and qweight.dtype == jnp.int8 and scales.shape == (16,)
    x = jax.random.normal(kx, (3, 64)).astype(jnp.float32)
    y = ojax.ops.examples.int8_linear(x, qweight, scales, None)
    assert y.shape == (3, 16) and y.dtype == jnp.float32


def test_data_dependent_sizes_are_refused_by_name(rule_ops):
    lib = ojax.load_library(rule_ops.path)
    op = next(o for o in lib.ops if any(out.size_from for out in o.outputs))
    with pytest.raises(NotImplementedError, match=f"opforge.jax: {op.name}: the sizes of its outputs"):
        jax_op(op.name)(*[jnp.ones((4,)) for _ in op.tensors])


def test_export_round_trip_in_a_fresh_process(tmp_path, key):
    def f(x, b):
        return ojax.ops.examples.rms_norm(ojax.ops.examples.bias_gelu(x, b), b, eps=1e-5)

    kx, kb = jax.random.split(key)
    x = jax.random.normal(kx, (4, 32), jnp.float32)
    b = jax.random.uniform(kb, (32,), jnp.float32) + 0.5
    exported = jax.export.export(jax.jit(f), platforms=["cpu"], disabled_checks=ojax.disabled_checks())(x, b)
    (tmp_path / "f.bin").write_bytes(exported.serialize())
    jnp.save(tmp_path / "x.npy", x)
    jnp.save(tmp_path / "b.npy", b)
    jnp.save(tmp_path / "y.npy", f(x, b))
    script = textwrap.dedent(
        """
        import sys, jax, jax.numpy as jnp, numpy as np, opforge, opforge.jax
        from pathlib import Path
        jax.config.update("jax_enable_x64", True)
        d = Path(sys.argv[1])
        if sys.argv[2] == "load":
            for lib in ("bias_gelu", "rms_norm"):
                opforge.jax.load_library(opforge.example_library(lib))
        call = jax.export.deserialize(bytearray((d / "f.bin").read_bytes())).call
        y = call(jnp.asarray(np.load(d / "x.npy")), jnp.asarray(np.load(d / "b.npy")))
        assert np.array_equal(np.asarray(y), np.load(d / "y.npy"))
        print("torch" in sys.modules)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), "load"], capture_output=True, text=True, env=CPU_ONLY
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "False"  # opforge.jax imports no torch
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), "no"], capture_output=True, text=True, env=CPU_ONLY
    )
    assert run.returncode != 0 and "examples.bias_gelu" in run.stderr


def test_export_needs_the_disabled_checks():
    with pytest.raises(ValueError, match="examples.softshrink"):
        jax.export.export(jax.jit(ojax.ops.examples.softshrink))(jnp.ones(3))


@pytest.mark.parametrize(
    ("results", "attrs", "message"),
    [
        ([(3,)], {"opforge_op": "examples::softshrink", "lambd": "big"}, "lambd: expected a value of type float"),
        ([(3,)], {"opforge_op": "examples::nowhere"}, "examples::nowhere is not loaded in this process"),
        (
            [(4,)],
            {"opforge_op": "examples::softshrink"},
            r"the result buffer of y is not the float32 \[3\] its rule gives",
        ),
        ([(3,), (3,)], {"opforge_op": "examples::softshrink"}, "2 results for 1 outputs and written inputs"),
        ([(3,)], {}, "the call has no opforge_op attribute"),
    ],
)
def test_a_call_frame_built_by_hand_is_checked_again(results, attrs, message):
    """The handler checks what it is given (Note [The JAX call frame]): a frame that opforge.jax
    would not build never reaches a kernel."""
    shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in results]
    call = jax.ffi.ffi_call("examples.softshrink", shapes if len(shapes) > 1 else shapes[0], vmap_method="sequential")
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(call(jnp.ones(3, jnp.float32), **attrs))


def test_an_older_jax_is_refused_on_import():
    script = "import jax; jax.__version__ = '0.4.30'\nimport opforge.jax\n"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == (
        "ImportError: opforge.jax needs jax >= 0.5.0 (jax.ffi, jax.export); this is jax 0.4.30"
    )


def test_a_parameter_left_at_none_takes_its_default(key):
    pos = jnp.array([0, 2, 1])
    kq, kc = jax.random.split(key)
    q = jax.random.normal(kq, (3, 2, 8), jnp.float32)
    cache = jax.random.normal(kc, (4, 8), jnp.float32)
    rope = ojax.ops.examples.rotary_embedding
    assert jnp.array_equal(rope(pos, q, cache, None, None), rope(pos, q, cache, None, True))  # is_neox=True
    assert not jnp.array_equal(rope(pos, q, cache, None, None), rope(pos, q, cache, None, False))
    x = jnp.linspace(-1.0, 1.0, 5)
    assert jnp.array_equal(ojax.ops.examples.softshrink(x, None), ojax.ops.examples.softshrink(x, 0.5))


def test_parameter_values_that_compare_equal_are_not_confused():
    """A float parameter given 1 (an int) is the float 1.0; given True it is refused, whatever
    was called before (the caches key values by type)."""
    x = jnp.linspace(-2.0, 2.0, 9)
    shrink = ojax.ops.examples.softshrink
    assert jnp.array_equal(shrink(x, 1), shrink(x, 1.0))
    with pytest.raises(ValueError, match=r"\n  lambd: expected a value of type float, got true"):
        shrink(x, True)
    assert jnp.array_equal(shrink(x, jnp.float32(0.25)), shrink(x, 0.25))  # a concrete scalar array


@pytest.mark.parametrize(
    ("value", "given"),
    [(1j, "complex 1j"), (b"x", "bytes b'x'"), ({}, "dict {}"), ([0.5], "list [0.5]"), (2**64, f"int {2**64}")],
)
def test_a_parameter_of_an_unusable_type_is_named(value, given):
    with pytest.raises(ValueError) as err:
        ojax.ops.examples.softshrink(jnp.ones(3), value)
    assert str(err.value) == (
        "examples::softshrink(Tensor x, float lambd=0.5) -> Tensor: invalid arguments\n"
        f"  lambd: expected a value of type float, got {given}"
    )


def test_an_op_not_loaded_says_what_to_load():
    with pytest.raises(AttributeError, match=r"no loaded op library declares an op examples.nowhere; load it first"):
        ojax.ops.examples.nowhere  # noqa: B018
    with pytest.raises(AttributeError, match=r"no loaded op library declares an op namespace 'nons'; load it first"):
        ojax.ops.nons  # noqa: B018


def test_results_inside_shard_map_vary_like_their_inputs():
    """Four host devices in a fresh process (the CPU's): a result of a sharded input is not taken
    for replicated (JAX refuses out_specs=P() for it), and a gradient through shard_map type-checks."""
    script = textwrap.dedent(
        """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, jax.numpy as jnp, numpy as np, opforge, opforge.jax
        from jax.sharding import Mesh, PartitionSpec as P
        opforge.jax.load_library(opforge.example_library("softshrink"))
        shrink = opforge.jax.ops.examples.softshrink
        mesh = Mesh(np.array(jax.devices()), ("d",))
        x = jnp.arange(8.0).reshape(4, 2) - 3.0
        try:
            jax.jit(jax.shard_map(shrink, mesh=mesh, in_specs=P("d"), out_specs=P()))(x)
            print("replicated")
        except ValueError as e:
            print("refused" if "out_specs" in str(e) else e)
        g = jax.grad(lambda x: jax.shard_map(shrink, mesh=mesh, in_specs=P("d"), out_specs=P("d"))(x).sum())(x)
        print(g.ravel().tolist())
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=CPU_ONLY)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[:2] == ["refused", "[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]"]


@requires_jax_cuda
def test_a_run_time_kernel_edited_then_reloaded_changes_what_jax_computes(tmp_path, key):
    """NVRTC on first use, one cache with PyTorch, and opforge.jax.reload() after an edit of the
    kernel source (as tests/python/test_runtime_kernels.py does through torch)."""
    from test_runtime_kernels import KERNEL, build_scale_op

    lib = build_scale_op(tmp_path, "live_jax", KERNEL.replace("MULTIPLIER", "1"))
    ojax.load_library(lib.path)
    live = ojax.ops.rtc_test.live_jax
    x = jax.device_put(jax.random.normal(key, (1000,), jnp.float32), jax.devices("gpu")[0])
    assert jnp.allclose(live(x, 3), x * 3)
    (tmp_path / "scale.cu").write_text(KERNEL.replace("MULTIPLIER", "2"))
    assert jnp.allclose(live(x, 3), x * 3)  # compiled kernels stay until reload
    ojax.reload()
    assert jnp.allclose(live(x, 3), x * 6)
    assert jnp.allclose(live(x, 5), x * 10)  # another instantiation, on demand


def test_symbolic_dims_are_refused_by_name():
    (batch,) = jax.export.symbolic_shape("b")
    spec = jax.ShapeDtypeStruct((batch, 4), jnp.float32)
    with pytest.raises(NotImplementedError, match=r"opforge.jax: examples::softshrink: x has the symbolic shape"):
        jax.export.export(jax.jit(ojax.ops.examples.softshrink), disabled_checks=ojax.disabled_checks())(spec)


def test_grad_for_an_input_the_backward_op_does_not_produce_raises_when_traced():
    """attention_backward gives no grad_mask: jax.grad with respect to the additive mask raises
    torch's words at trace time (it returned zeros), while grad with respect to q alone, with the
    mask given, runs."""
    kq, kk, kv, km = jax.random.split(jax.random.key(7), 4)
    q = jax.random.normal(kq, (1, 2, 5, 32), jnp.float64)
    k, v = (jax.random.normal(key, (1, 2, 7, 32), jnp.float64) for key in (kk, kv))
    mask = jax.random.normal(km, (1, 7), jnp.float64)

    def loss(q, mask):
        return jnp.sum(ojax.ops.examples.attention(q, k, v, head_dim=32, mask=mask, scale=0.3)[0])

    with pytest.raises(NotImplementedError) as err:
        jax.grad(loss, 1)(q, mask)
    assert str(err.value) == (
        "the derivative of examples::attention for its input 'mask' is not implemented: its backward op "
        "examples::attention_backward has no grad_mask output"
    )
    with pytest.raises(NotImplementedError):
        jax.jit(jax.grad(loss, (0, 1))).lower(q, mask)  # at trace time: nothing runs
    assert jax.grad(loss, 0)(q, mask).shape == q.shape
    opforge.load_library(opforge.example_library("attention"))
    torch_q, torch_mask = (torch.from_numpy(np.array(t)).requires_grad_() for t in (q, mask))
    torch_k, torch_v = (torch.from_numpy(np.array(t)) for t in (k, v))
    with pytest.raises(NotImplementedError) as from_torch:
        torch.ops.examples.attention(torch_q, torch_k, torch_v, 32, torch_mask, scale=0.3)[0].sum().backward()
    assert str(from_torch.value).splitlines()[0] == str(err.value)


@pytest.fixture
def tt(triton_ops):
    """The ops of fixtures/triton_ops.cpp (Triton kernels) through JAX: opforge.jax.ops.tt."""
    ojax.load_library(triton_ops.path)
    return ojax.ops.tt


@pytest.mark.parametrize("device", JAX_DEVICES)
def test_ops_with_triton_kernels_under_jit_grad_and_vmap(tt, device, key):
    """tt::add and tt::softmax, whose kernels are Triton functions launched from C++ on the stream
    XLA gives (on the CPU: their references), under jax.jit, jax.grad through tt::softmax_backward
    (a Triton kernel too) and jax.vmap, against the same math in jax.numpy."""
    on = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    kx, ky, kc = jax.random.split(key, 3)
    x, y = (jax.device_put(jax.random.normal(k, (6, 33), jnp.float32), on) for k in (kx, ky))
    cot = jax.device_put(jax.random.normal(kc, (6, 33), jnp.float32), on)
    tol = {"atol": 1e-6, "rtol": 1e-5}

    def f(x, y):
        return tt.softmax(tt.add(x, y))

    def reference(x, y):
        return jax.nn.softmax(x + y, axis=-1)

    got = jax.jit(f)(x, y)
    assert got.devices() == {on} and jnp.allclose(got, reference(x, y), **tol)
    grads = jax.grad(lambda x: jnp.sum(tt.softmax(x) * cot))(x)
    assert jnp.allclose(grads, jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=-1) * cot))(x), **tol)
    assert "tt.softmax_backward" in str(jax.make_jaxpr(jax.grad(lambda x: jnp.sum(tt.softmax(x) * cot)))(x))
    batched = x.reshape(2, 3, 33)
    assert jnp.allclose(jax.vmap(tt.softmax)(batched), jax.nn.softmax(batched, axis=-1), **tol)
    assert jnp.allclose(jax.jit(jax.vmap(f))(batched, y.reshape(2, 3, 33)), reference(x, y).reshape(2, 3, 33), **tol)
