"""Bad input gets an error that names the op, the argument, what was expected and what was given."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import requires_cuda

SOFTSHRINK = "examples::softshrink(Tensor x, float lambd=0.5) -> Tensor: invalid arguments\n"
BIAS_GELU = "examples::bias_gelu(Tensor x, Tensor bias) -> Tensor: invalid arguments\n"


def raises(exc, message):
    return pytest.raises(exc, match="^" + re.escape(message) + "$")


def test_wrong_dtype():
    with raises(ValueError, SOFTSHRINK + "  x: expected dtype one of {float32, float64, float16, bfloat16}, got int64"):
        torch.ops.examples.softshrink(torch.arange(4))


def test_dtype_outside_a_narrower_set():
    # bias must match x; x itself is wrong, so only x is reported.
    x = torch.randn(2, 4, dtype=torch.float64)
    with raises(ValueError, BIAS_GELU + "  x: expected dtype one of {float32, float16, bfloat16}, got float64"):
        torch.ops.examples.bias_gelu(x, torch.zeros(4, dtype=torch.int32))


def test_mismatched_dtypes_and_shape_reported_together():
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    with raises(
        ValueError,
        BIAS_GELU + "  bias: expected dtype bfloat16 (the dtype of x), got float32\n"
        "  bias: expected shape [x.size(-1)] = [8], got [4]",
    ):
        torch.ops.examples.bias_gelu(x, torch.randn(4))


def test_wrong_rank():
    with raises(
        ValueError,
        BIAS_GELU + "  x: expected rank >= 1, got rank 0 (shape [])\n"
        "  bias: expected rank 1, got rank 2 (shape [1, 1])",
    ):
        torch.ops.examples.bias_gelu(torch.tensor(1.0), torch.ones(1, 1))


def test_a_bad_rank_does_not_hide_another_arguments_dtype():
    # x's rank is wrong but its dtype is fine: bias is still checked against that dtype (its
    # shape rule, which reads x's last dim, is skipped: it would only repeat x's problem).
    with raises(
        ValueError,
        BIAS_GELU + "  x: expected rank >= 1, got rank 0 (shape [])\n"
        "  bias: expected dtype float32 (the dtype of x), got float16",
    ):
        torch.ops.examples.bias_gelu(torch.tensor(1.0), torch.ones(3, dtype=torch.float16))


def test_dtypes_opforge_does_not_know_get_torch_names():
    x, bias = torch.randn(2, 4, dtype=torch.complex64), torch.randn(4, dtype=torch.complex64)
    with raises(ValueError, BIAS_GELU + "  x: expected dtype one of {float32, float16, bfloat16}, got complex64"):
        torch.ops.examples.bias_gelu(x, bias)  # bias follows x's dtype: only x is reported
    with raises(ValueError, BIAS_GELU + "  bias: expected dtype float32 (the dtype of x), got complex64"):
        torch.ops.examples.bias_gelu(x.real.contiguous(), bias)


def test_parameter_out_of_range():
    with raises(ValueError, SOFTSHRINK + "  lambd: expected a value >= 0, got -0.25"):
        torch.ops.examples.softshrink(torch.randn(3), lambd=-0.25)


def test_parameter_nan_is_out_of_range():
    with raises(ValueError, SOFTSHRINK + "  lambd: expected a value >= 0, got nan"):
        torch.ops.examples.softshrink(torch.randn(3), lambd=float("nan"))


def test_parameter_of_the_wrong_type():
    # The dispatcher checks types against the derived schema before any opforge code runs.
    with pytest.raises(
        RuntimeError,
        match=r"Expected a value of type 'float' for argument 'lambd' but instead found "
        r"type 'str'",
    ):
        torch.ops.examples.softshrink(torch.randn(3), lambd="big")


def test_missing_argument():
    with pytest.raises(RuntimeError, match=r"missing value for argument 'bias'"):
        torch.ops.examples.bias_gelu(torch.randn(3))


@requires_cuda
def test_tensors_on_different_devices():
    x = torch.randn(2, 8, device="cuda")
    with raises(ValueError, BIAS_GELU + "  bias: expected device cuda:0 (the device of x), got cpu"):
        torch.ops.examples.bias_gelu(x, torch.randn(8))


def test_errors_are_raised_under_fake_tensors_too():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        x = torch.empty(2, 3, 8)
        with raises(ValueError, BIAS_GELU + "  bias: expected shape [x.size(-1)] = [8], got [5]"):
            torch.ops.examples.bias_gelu(x, torch.empty(5))
