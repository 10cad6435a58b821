"""The torch adapter on every example op: values, opcheck, compile, export, Meta, strides, empties."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounterWithBackend

from conftest import CASES, DEVICES, assert_matches, requires_cuda, requires_two_gpus, strided_views

OPS = list(CASES)


def _dtype_cases():
    for name, case in CASES.items():
        for dtype in case.dtypes:
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, dtype", list(_dtype_cases()))
def test_matches_torch(name, dtype, device):
    case = CASES[name]
    args, kwargs = case.make(17, dtype, device)
    out = case.op(*args, **kwargs)
    assert out.device == args[0].device
    assert_matches(out, case.expected(*args, **kwargs), dtype)


def test_softshrink_matches_torch_with_special_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5, -0.5, 0.0, 0.7, -0.7])
    out = torch.ops.examples.softshrink(x, lambd=0.5)
    torch.testing.assert_close(out, F.softshrink(x, 0.5), equal_nan=True)


def test_default_parameter_comes_from_the_declaration():
    x = torch.randn(64)
    torch.testing.assert_close(torch.ops.examples.softshrink(x), F.softshrink(x, 0.5))
    assert (
        str(torch.ops.examples.softshrink.default._schema)
        == "examples::softshrink(Tensor x, float lambd=0.5) -> Tensor"
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, device):
    case = CASES[name]
    args, kwargs = case.make(3, torch.float32, device)
    torch.library.opcheck(case.op.default, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_meta_matches_real(name, device):
    case = CASES[name]
    args, kwargs = case.make(6, torch.float16, device)
    real = case.op(*args, **kwargs)
    meta = case.op(*[a.to("meta") for a in args], **kwargs)
    assert (meta.shape, meta.dtype, meta.stride()) == (real.shape, real.dtype, real.stride())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_compile_fullgraph_no_recompile_across_batch_sizes(name, device):
    case = CASES[name]
    torch._dynamo.reset()  # fn's code object is shared by every case: start under the recompile limit
    counter = CompileCounterWithBackend("inductor")

    def fn(*args, **kwargs):
        return case.op(args[0] * 2, *args[1:], **kwargs) + 1

    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    args, kwargs = case.make(2, torch.float32, device)
    torch.testing.assert_close(compiled(*args, **kwargs), fn(*args, **kwargs))
    # (A float parameter makes dynamo restart its first analysis once to specialise it -- the
    # same happens for any op whose schema takes a float -- so compare counts after the first call.)
    compiled_once = counter.frame_count
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in (5, 11):
            args, kwargs = case.make(batch, torch.float32, device)
            torch.testing.assert_close(compiled(*args, **kwargs), fn(*args, **kwargs))
    assert counter.frame_count == compiled_once


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_export_with_dynamic_batch(name, device):
    case = CASES[name]

    class Model(torch.nn.Module):
        def forward(self, *args):
            return case.op(*args)

    args, _ = case.make(4, torch.float32, device)
    batch = torch.export.Dim("batch", min=1, max=1024)
    # The batch dim is dynamic in every input that has it (same rank as the first).
    shapes = tuple({0: batch} if a.dim() == args[0].dim() else None for a in args)
    program = torch.export.export(Model(), args, dynamic_shapes=(shapes,))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets == [case.op.default]
    for b in (1, 9):
        new_args, _ = case.make(b, torch.float32, device)
        torch.testing.assert_close(program.module()(*new_args), Model()(*new_args))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_strided_inputs_match_contiguous(name, device):
    case = CASES[name]
    args, kwargs = case.make(4, torch.float16, device)
    for label, view in strided_views(args[0]):
        assert view.shape == args[0].shape
        out = case.op(view, *args[1:], **kwargs)
        assert out.is_contiguous(), label
        torch.testing.assert_close(out, case.op(view.contiguous(), *args[1:], **kwargs), msg=label)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_bias(device):
    x = torch.randn(3, 5, 16, device=device)
    bias = torch.randn(32, device=device)[::2]
    torch.testing.assert_close(
        torch.ops.examples.bias_gelu(x, bias), torch.ops.examples.bias_gelu(x, bias.contiguous())
    )


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs_give_shaped_outputs(device):
    for shape in [(0,), (0, 37), (3, 0)]:
        x = torch.randn(shape, device=device)
        out = torch.ops.examples.softshrink(x)
        assert out.shape == x.shape and out.device == x.device
    x = torch.randn(0, 5, 48, device=device)
    assert torch.ops.examples.bias_gelu(x, torch.randn(48, device=device)).shape == (0, 5, 48)
    x = torch.randn(2, 0, device=device)
    assert torch.ops.examples.bias_gelu(x, torch.randn(0, device=device)).shape == (2, 0)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 70),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    lambd=st.floats(0.0, 2.0),
)
def test_cpu_reference_property(rows, cols, dtype, lambd):
    x = torch.randn(rows, cols, dtype=dtype) * 3
    assert_matches(torch.ops.examples.softshrink(x, lambd), F.softshrink(x.double(), lambd), dtype)
    b = torch.randn(cols, dtype=dtype)
    assert_matches(torch.ops.examples.bias_gelu(x, b), F.gelu(x.double() + b.double()), dtype)


@requires_cuda
@pytest.mark.parametrize("name", OPS)
def test_cuda_graph_capture_on_side_stream_matches_eager(name):
    case = CASES[name]
    args, kwargs = case.make(64, torch.float16, "cuda")
    expected = case.op(*args, **kwargs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        case.op(*args, **kwargs)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = case.op(*args, **kwargs)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, expected)


@requires_cuda
@pytest.mark.parametrize("name", ["softshrink", "bias_gelu"])
def test_cuda_large_launch_uses_64bit_indexing(name):
    """More than 2^31 elements: indexing past int32 must still write every element."""
    case = CASES[name]
    n = (1 << 31) + 4096
    if name == "softshrink":
        x = torch.full((n,), 3.0, dtype=torch.float16, device="cuda")
        x[-1] = -2.0
        out = case.op(x, lambd=0.5)
        assert out[0].item() == 2.5 and out[-1].item() == -1.5 and out[-4096:-1].eq(2.5).all()
    else:
        x = torch.full((n // 64, 64), 0.25, dtype=torch.float16, device="cuda")
        bias = torch.full((64,), 0.75, dtype=torch.float16, device="cuda")
        out = case.op(x, bias)
        expected = F.gelu(torch.tensor(1.0)).half().cuda()
        assert out[-1].eq(expected).all() and out[0].eq(expected).all()


@requires_cuda
def test_cuda_outputs_come_from_torchs_caching_allocator():
    """An output is memory of torch's CUDA caching allocator, as at::empty's: counted by
    memory_allocated while it lives, returned when it dies."""
    x = torch.randn(1 << 20, device="cuda")  # 4 MiB: a multiple of the allocator's rounding
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = torch.ops.examples.softshrink(x, 0.5)
    assert y.device == x.device and y.is_contiguous()
    assert torch.cuda.memory_allocated() - before == y.numel() * y.element_size()
    del y
    assert torch.cuda.memory_allocated() == before


@requires_two_gpus
@pytest.mark.parametrize("name", OPS)
def test_inputs_on_a_non_current_gpu(name):
    """Inputs on cuda:1 while cuda:0 is current: the op runs on the inputs' device (device guard)."""
    case = CASES[name]
    args, kwargs = case.make(9, torch.float32, "cuda:1")
    with torch.cuda.device(0):
        out = case.op(*args, **kwargs)
    assert out.device == torch.device("cuda:1")
    assert_matches(out, case.expected(*[a.cpu() for a in args], **kwargs), torch.float32)


@requires_two_gpus
def test_tensors_on_two_gpus_are_refused():
    x = torch.randn(2, 8, device="cuda:0")
    with pytest.raises(ValueError, match=r"bias: expected device cuda:0 \(the device of x\), got cuda:1$"):
        torch.ops.examples.bias_gelu(x, torch.randn(8, device="cuda:1"))
