"""examples::identity_conv on every layout it may be given: the output is always a dense,
row-major, bit-for-bit copy of the input (x.clone()), on every device and dtype."""

from __future__ import annotations

import pytest
import torch

from conftest import ALL_DTYPES, DEVICES, random_tensor, requires_cuda


def identity_conv(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.examples.identity_conv(x)


def assert_copy(out: torch.Tensor, x: torch.Tensor, label: str = ""):
    """``out`` is dense and row-major, with x's shape, dtype and device and x's bits."""
    assert (out.shape, out.dtype, out.device) == (x.shape, x.dtype, x.device), label
    assert out.is_contiguous(), label
    # Compare bytes, so NaN payloads, -0.0 and every integer count exactly.
    got, want = out.reshape(-1).view(torch.uint8), x.clone().contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(got.cpu(), want.cpu()), label


_rand = random_tensor  # a short name for the table below


#: name -> (dtype, device) -> an input tensor in that layout.
LAYOUTS = {
    "0-d": lambda dt, dev: _rand((), dt, dev),
    "0-d with storage offset": lambda dt, dev: _rand((7,), dt, dev)[5],
    "0-d expanded to 3x4": lambda dt, dev: _rand((), dt, dev).expand(3, 4),
    "empty 1-d": lambda dt, dev: _rand((0,), dt, dev),
    "empty 3-d permuted": lambda dt, dev: _rand((3, 0, 5), dt, dev).permute(2, 0, 1),
    "empty sliced": lambda dt, dev: _rand((4, 6), dt, dev)[:, 6:],
    "transposed": lambda dt, dev: _rand((37, 19), dt, dev).t(),
    "permuted 3-d": lambda dt, dev: _rand((4, 5, 33), dt, dev).permute(2, 0, 1),
    "channels-last 4-d": lambda dt, dev: _rand((2, 3, 5, 7), dt, dev).contiguous(memory_format=torch.channels_last),
    "sliced last dim": lambda dt, dev: _rand((5, 80), dt, dev)[:, ::2],
    "sliced both dims": lambda dt, dev: _rand((20, 30), dt, dev)[1::3, 2:27:2],
    "narrowed rows (dense, offset)": lambda dt, dev: _rand((9, 17), dt, dev)[2:7],
    "storage offset 1 (misaligned)": lambda dt, dev: _rand((1001,), dt, dev)[1:].view(10, 100),
    "expanded middle dim": lambda dt, dev: _rand((4, 1, 6), dt, dev).expand(4, 5, 6),
    "expanded leading dims": lambda dt, dev: _rand((9,), dt, dev).expand(3, 2, 9),
    "overlapping windows": lambda dt, dev: _rand((40,), dt, dev).as_strided((30, 8), (1, 1)),
    "size-1 dims with odd strides": lambda dt, dev: _rand((6, 10), dt, dev)[:, None, 3:4, None],
    "rank 8 permuted and sliced": lambda dt, dev: _rand((2, 3, 1, 4, 2, 3, 2, 10), dt, dev).permute(
        7, 3, 0, 5, 1, 2, 6, 4
    )[::3, 1:],
    "rank 16 reversed": lambda dt, dev: _rand((2,) * 15 + (3,), dt, dev).permute(*range(15, -1, -1)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_clone(layout, device):
    for dtype in ALL_DTYPES:
        x = LAYOUTS[layout](dtype, device)
        assert_copy(identity_conv(x), x, f"{layout} {dtype}")


@pytest.mark.parametrize("device", DEVICES)
def test_dense_sizes_around_vector_and_block_boundaries(device):
    """Dense inputs take the flat copy: whole 16-byte vectors, then the remainder one by one;
    offset by one element, the scalar path."""
    for dtype in (torch.float64, torch.float16, torch.uint8, torch.bool):
        for n in (1, 7, 8, 9, 15, 16, 17, 255, 256, 257, 4097):
            base = _rand((n + 1,), dtype, device)
            for label, x in (("aligned", base[:n]), ("offset", base[1:])):
                assert_copy(identity_conv(x), x, f"{dtype} n={n} {label}")


@pytest.mark.parametrize("device", DEVICES)
def test_special_float_values_copy_bit_for_bit(device):
    bits = torch.tensor(
        [0x7FC0_0001, 0xFFC0_1234 - (1 << 32), 0x7F80_0000, 0x8000_0000 - (1 << 32), 1], dtype=torch.int32
    )
    x = bits.view(torch.float32).to(device)  # NaNs with payloads, inf, -0.0, a subnormal
    out = identity_conv(x.expand(3, 5).t())
    assert torch.equal(out.view(torch.int32).cpu(), bits[:, None].expand(5, 3))


def test_rank_above_16_is_refused():
    x = torch.zeros((1,) * 17)
    with pytest.raises(ValueError, match=r"examples::identity_conv.*\n  x: expected"):
        identity_conv(x)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_on_views_matches_eager(device):
    """Under torch.compile the op still receives views (the input is declared strided); the
    Meta kernel gives the output's shape from the view's. (Inductor on a view: the side_by_side
    model in test_models.py.)"""

    def fn(x):
        return identity_conv(x.transpose(0, 1)[::2]) * 2

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=True)
    for rows in (6, 11):
        x = torch.randn(rows, 9, device=device)
        torch.testing.assert_close(compiled(x), fn(x))
        torch.testing.assert_close(compiled(x), x.transpose(0, 1)[::2] * 2)


@requires_cuda
def test_cuda_gather_past_32bit_indices():
    """A transposed uint8 tensor of 2^32 + 16 elements: the gather takes 64-bit indices and
    writes every element, the last included."""
    rows = (1 << 31) + 8
    base = torch.zeros(rows, 2, dtype=torch.uint8, device="cuda")
    base[:, 1] = 1
    base[-1] = torch.tensor([7, 9], dtype=torch.uint8)
    out = identity_conv(base.t())
    assert out.shape == (2, rows) and out.is_contiguous()
    assert out[0, :-1].eq(0).all() and out[1, :-1].eq(1).all()
    assert out[0, -1].item() == 7 and out[1, -1].item() == 9
