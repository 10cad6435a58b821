"""Comparing outputs with a reference: tolerances by dtype, NaN and infinity rules; float8 bit for bit."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

#: (atol, rtol) against a float64 reference, by dtype. tf32 is listed for ops whose kernels use
#: TF32 tensor-core math on float32 inputs.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-5),
    "tf32": (5e-4, 5e-4),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}

#: The float8 dtypes (Note [Float8 dtypes] in ``opforge/dtype.h``): a result of one of them is
#: compared bit for bit (any NaN equals any NaN), unless the op declares a tolerance for it.
FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _float8_compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float, float, str]:
    """:func:`compare`'s result for a float8 ``out`` against ``ref`` (taken to ``out``'s dtype by
    torch's rounding if it has another): equal bytes, or NaN on both sides."""
    o = out.detach().cpu().contiguous()
    r = ref.detach().cpu().to(o.dtype).contiguous()
    o_nan, r_nan = o.float().isnan(), r.float().isnan()
    bad = (o.view(torch.uint8) != r.view(torch.uint8)) & ~(o_nan & r_nan)
    diff = (o.double() - r.double()).abs().masked_fill(o_nan | r_nan, 0.0).nan_to_num(nan=0.0, posinf=math.inf)
    max_err = diff.max().item()
    if not bad.any():
        return True, max_err, 0.0, ""
    first = tuple(int(v) for v in bad.nonzero()[0].tolist())
    got, want = o.view(torch.uint8)[first].item(), r.view(torch.uint8)[first].item()
    return (
        False,
        max_err,
        math.inf,
        (
            f"{int(bad.sum())} of {o.numel()} elements differ; first at {list(first)}: "
            f"0x{got:02x} ({o[first].item()!r}), expected 0x{want:02x} ({r[first].item()!r}) "
            f"in {_dtype_name(o.dtype)}, compared bit for bit"
        ),
    )


def _differences(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(o, r, |o - r|, NaN mismatch, comparable) of ``out`` against ``ref`` of the same shape,
    in float64 on the CPU: ``r`` takes a value beyond the range of ``out``'s dtype as the
    infinity it rounds to; |o - r| is 0 where an element is not comparable (NaN on either
    side, or the same infinity on both)."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if out.dtype.is_floating_point and r.dtype.is_floating_point:
        rounded = r.to(out.dtype).double()
        r = torch.where(rounded.isinf() & ~r.isinf(), rounded, r)
    nan_mismatch = o.isnan() != r.isnan()
    comparable = ~o.isnan() & ~r.isnan() & ~(o.isinf() & r.isinf() & (o == r))
    return o, r, torch.where(comparable, (o - r).abs(), torch.zeros_like(o)), nan_mismatch, comparable


def equivalent_bound(equivalent: Callable[[], object], factor: float, passed: list[int] | None = None) -> Callable:
    """FlashAttention's criterion (tests/test_flash_attn.py, ``(dq - dq_ref).abs().max() <= 2 *
    (dq_pt - dq_ref).abs().max()``) for an op that declares ``factor``
    (``Op.tolerance_vs_equivalent``), as the ``beyond`` of :func:`compare_outputs`: a floating
    output that misses its tolerance passes if it has NaN where the reference has it and its
    largest error is at most ``factor`` times that of the same output of the op's torch
    expression run in the case's own dtypes. ``equivalent()`` computes that expression's results
    (a tensor or a tuple of them), once, when first needed. The equivalent's output must have
    the output's shape and dtype (one computed in a lower precision would widen the bound); its
    error is taken where it is comparable and finite (a NaN or an overflow of its own widens no
    bound), and an error where the equivalent's is 0 fails. The outputs it passes are appended
    to ``passed``, where given."""
    results: list = []

    def beyond(k: int, o: torch.Tensor, r: torch.Tensor) -> tuple[bool, float, str]:
        if not o.dtype.is_floating_point or _dtype_name(o.dtype) in FLOAT8:
            return False, math.inf, ""  # exact outputs stay exact
        if not results:
            try:
                e = equivalent()
            except Exception as error:  # noqa: BLE001 -- reported as the case's failure
                e = error
            results.append(e)
        e = results[0]
        if isinstance(e, Exception):
            return False, math.inf, f"the equivalent in the case's dtypes raised {type(e).__name__}: {e}"
        eqs = e if isinstance(e, (tuple, list)) else (e,)
        e = eqs[k] if k < len(eqs) else None
        if not isinstance(e, torch.Tensor) or e.shape != r.shape or e.dtype != o.dtype:
            given = f"{list(e.shape)} {e.dtype}" if isinstance(e, torch.Tensor) else repr(type(e).__name__)
            return False, math.inf, f"the equivalent's result {k} is {given}, expected {list(r.shape)} {o.dtype}"
        _, _, diff, nan_mismatch, _ = _differences(o, r)
        if nan_mismatch.any():
            return False, math.inf, ""  # compare's message names the first such element
        theirs = _differences(e, r)[2]
        theirs = theirs[theirs.isfinite()]
        err, bound = diff.max().item(), factor * (theirs.max().item() if theirs.numel() else 0.0)
        ratio = err / bound if bound > 0 else (0.0 if err == 0 else math.inf)
        if ratio > 1:
            return (
                False,
                ratio,
                (
                    f"largest error {err:.3g}, more than {factor:g} x the equivalent's in the same dtypes "
                    f"({bound / factor:.3g})"
                ),
            )
        if passed is not None:
            passed.append(k)
        return True, ratio, ""

    return beyond


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: str,
    tolerance: tuple[float, float] | None = None,
    float8_tolerances: dict[str, tuple[float, float]] | None = None,
) -> tuple[bool, float, float, str]:
    """(ok, max abs error, worst error / tolerance, why) of ``out`` against ``ref`` with the
    tolerances of ``dtype`` (exact for dtypes not in :data:`TOLERANCES`), or ``tolerance``
    (atol, rtol) where given (an op's own, ``.tolerance()``), and never finer than those of
    ``out``'s own dtype (a float32 output of a float64 case); NaN must match NaN,
    infinities must match exactly. A reference value beyond the range of ``out``'s dtype is taken
    as the infinity it rounds to (a float16 result of 1e8 is inf, as torch computes it). An
    ``out`` of a float8 dtype (:data:`FLOAT8`) is compared bit for bit (NaN equal to NaN) unless
    ``float8_tolerances`` (the op's own, by dtype name) gives its dtype (atol, rtol)."""
    own = _dtype_name(out.dtype)
    if own in FLOAT8 and own not in (float8_tolerances or {}):
        if out.shape != ref.shape:
            return False, math.inf, math.inf, f"shape {list(out.shape)}, expected {list(ref.shape)}"
        return _float8_compare(out, ref) if out.numel() else (True, 0.0, 0.0, "")
    if own in FLOAT8:
        tolerance = float8_tolerances[own]
    atol, rtol = tolerance or (TOLERANCES[dtype] if dtype in TOLERANCES else (0.0, 0.0))
    # an output is held to no less than its own dtype's
    if own in TOLERANCES:
        atol, rtol = max(atol, TOLERANCES[own][0]), max(rtol, TOLERANCES[own][1])
    if out.shape != ref.shape:
        return False, math.inf, math.inf, f"shape {list(out.shape)}, expected {list(ref.shape)}"
    if out.numel() == 0:
        return True, 0.0, 0.0, ""
    o, r, diff, nan_mismatch, comparable = _differences(out, ref)
    ratio = diff / (atol + rtol * r.abs().nan_to_num(posinf=0.0)) if atol or rtol else diff
    bad = nan_mismatch | (comparable & (diff > atol + rtol * r.abs()))
    max_err, worst = diff.max().item(), ratio.nan_to_num(nan=math.inf, posinf=math.inf).max().item()
    if not bad.any():
        return True, max_err, worst, ""
    first = tuple(int(v) for v in bad.nonzero()[0].tolist())
    return (
        False,
        max_err,
        worst,
        (
            f"{int(bad.sum())} of {o.numel()} elements differ; first at {list(first)}: "
            f"{o[first].item()!r}, expected {r[first].item()!r}"
        ),
    )


def compare_outputs(
    out,
    ref,
    dtype: str,
    tolerance: tuple[float, float] | None = None,
    beyond: Callable | None = None,
    float8_tolerances: dict[str, tuple[float, float]] | None = None,
) -> tuple[bool, float, float, str]:
    """:func:`compare` over every output of an op (a tensor or a tuple of them; None, for an output
    that exists only with an optional input, matches None only); the first mismatch names its
    output index when there are several. ``beyond(k, out_k, ref_k) -> (ok, ratio, why)``, where
    given (:func:`equivalent_bound`), decides output k when it misses its tolerance with the
    reference's shape; the worst ratio then counts its ratio. ``float8_tolerances`` as for
    :func:`compare`."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        return False, math.inf, math.inf, f"{len(outs)} outputs, expected {len(refs)}"
    max_err = worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs)):
        if o is None or r is None:  # an output that exists only with an optional input
            if (o is None) != (r is None):
                where = f"output {k}: " if len(outs) > 1 else ""
                return False, math.inf, math.inf, where + ("None" if o is None else "a tensor") + ", expected the other"
            continue
        ok, err, ratio, why = compare(o, r, dtype, tolerance, float8_tolerances)
        if not ok and beyond is not None and o.shape == r.shape:
            ok, ratio, more = beyond(k, o, r)
            why = f"{why}; {more}" if more else why
        max_err, worst = max(max_err, err), max(worst, ratio)
        if not ok:
            return False, max_err, worst, (f"output {k}: " if len(outs) > 1 else "") + why
    return True, max_err, worst, ""
