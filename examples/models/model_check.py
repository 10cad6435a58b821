"""What the example models share: the example ops written in plain torch (for reference
models), and the ``main()`` that checks a model end to end.

:func:`main` loads the example op libraries, builds the model and its plain-torch twin (the same
weights), exports the model with a dynamic batch dim, AOTInductor-compiles it with its op
libraries, runs the package in the C++ runner (``opforge-runner``) on the device for a few batch
sizes, and compares each output with the plain-torch twin run in eager on the CPU
(:func:`opforge.verify.verify_model`). It prints the error of every output, writes the same to
``results.json`` in the package folder, and returns 1 if any output mismatches.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import opforge
from opforge import verify

#: The example op libraries the models call (``examples/ops/<name>/``).
EXAMPLE_OPS = ("add_layer_norm", "bias_gelu", "rms_norm", "softshrink", "identity_conv")


def load_example_ops(names: Sequence[str] = EXAMPLE_OPS) -> None:
    """Loads the example op libraries ``names`` from the build folder (loading twice is harmless).

    Raises:
        FileNotFoundError: a library is not built (``make build``).
    """
    for name in names:
        opforge.load_library(opforge.example_library(name))


class TorchOps:
    """The example ops in plain torch, with the same positional signatures as
    ``torch.ops.examples.*`` (each op file's ``.equivalent()``)."""

    @staticmethod
    def add_layer_norm(x, residual, weight, bias, eps=1e-5):
        return F.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps)

    @staticmethod
    def bias_gelu(x, bias):
        return F.gelu(x + bias)

    @staticmethod
    def rms_norm(x, weight, eps=1e-6):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    @staticmethod
    def softshrink(x, lambd=0.5):
        return F.softshrink(x, lambd)

    @staticmethod
    def identity_conv(x):
        return x.clone()

    @staticmethod
    def attention(q, k, v, head_dim, mask=None, causal=False, scale=0.0):
        bias = torch.zeros(q.shape[2], k.shape[2], dtype=q.dtype, device=q.device)
        if causal:
            bias = bias.masked_fill(torch.ones_like(bias, dtype=torch.bool).triu(1), float("-inf"))
        if mask is not None:
            bias = bias + mask[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale or None)
        return o, torch.logsumexp(q @ k.mT * (scale or head_dim**-0.5) + bias, -1).float()

    # The ops that write their inputs do so here too (copy_ into the same tensors).

    @staticmethod
    def fused_add_rms_norm(x, residual, weight, eps=1e-6):
        residual.add_(x)
        x.copy_(F.rms_norm(residual, (x.shape[-1],), weight, eps))

    @staticmethod
    def rotary_embedding(positions, query, cos_sin_cache, key=None, is_neox=True):
        half = cos_sin_cache.shape[1] // 2
        cos, sin = cos_sin_cache[positions, None, :half], cos_sin_cache[positions, None, half:]
        for x in (query, key) if key is not None else (query,):
            if is_neox:
                a, b = x[..., :half], x[..., half : 2 * half]
            else:
                a, b = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
            a_new, b_new = a * cos - b * sin, b * cos + a * sin
            a.copy_(a_new)
            b.copy_(b_new)

    @staticmethod
    def kv_cache_write(key, value, key_cache, value_cache, slot_mapping):
        keep = slot_mapping >= 0
        key_cache.view(-1, *key.shape[1:])[slot_mapping[keep]] = key[keep].to(key_cache.dtype)
        value_cache.view(-1, *value.shape[1:])[slot_mapping[keep]] = value[keep].to(value_cache.dtype)

    @staticmethod
    def silu_and_mul(x):
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


def ops(plain: bool):
    """``TorchOps`` if ``plain``, else ``torch.ops.examples`` (the opforge ops)."""
    return TorchOps if plain else torch.ops.examples


@dataclass
class ModelSpec:
    """How :func:`main` builds and feeds one example model.

    Attributes:
        name: the model's name (the package folder's default name).
        make_model: ``make_model(plain=False)``: the model, in eval mode, with fixed weights;
            ``plain=True`` gives the same weights computing with :class:`TorchOps`.
        example_inputs: ``example_inputs(batch)``: the model's inputs, float32 CPU tensors.
        dynamic_shapes: ``torch.export`` dynamic shapes, the batch dim dynamic.
        batches: batch sizes run in the runner; the first is the one exported with.
        atol, min_cosine: what an output (or an input written in place) must meet
            (:func:`opforge.verify.verify_model`).
        ops: the example op libraries the model calls.
    """

    name: str
    make_model: Callable[..., torch.nn.Module]
    example_inputs: Callable[[int], list[torch.Tensor]]
    dynamic_shapes: object
    batches: Sequence[int] = (3, 1, 8)
    atol: float = 1e-4
    min_cosine: float = 0.9999
    ops: Sequence[str] = EXAMPLE_OPS


def print_results(spec: ModelSpec, reports: Sequence[verify.ModelReport]) -> bool:
    """Prints one line per output of each run (its batch, shape, max abs error, worst cosine,
    status) and a verdict; returns True if every output passed."""
    for batch, report in zip(spec.batches, reports):
        for out in report.outputs:
            print(
                f"{spec.name} on {report.device}, batch {batch}: {out.kind} {out.index} {out.shape}: "
                f"max abs error {out.max_abs_error:.2e}, cosine {out.cosine:.7f}: {out.status}"
            )
    ok = bool(reports) and all(r.ok for r in reports)
    print(
        f"{spec.name}: {'OK' if ok else 'FAILED'}: the package in opforge-runner against plain torch in eager "
        f"on the CPU, {len(reports)} batch sizes"
    )
    return ok


def main(spec: ModelSpec, argv: Sequence[str] | None = None) -> int:
    """Checks ``spec``'s model end to end (see the module docstring).

    Args:
        spec: the model.
        argv: command-line arguments (default: ``sys.argv[1:]``): ``--device`` (default cuda if
            available, else cpu) and ``--out`` (the package folder, default ``out/models/<name>``).

    Returns:
        0 if every output matches, 1 otherwise.
    """
    parser = argparse.ArgumentParser(description=f"Check the {spec.name} example model in the C++ runner.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("out/models") / spec.name, help="package folder")
    args = parser.parse_args(argv)
    if (problem := opforge.missing_device(args.device)) is not None:
        parser.exit(2, f"{parser.prog}: {problem}\n")
    load_example_ops(spec.ops)
    model = spec.make_model()
    reference = spec.make_model(plain=True)
    reports = verify.verify_model(
        model,
        spec.example_inputs(spec.batches[0]),
        device=args.device,
        dynamic_shapes=spec.dynamic_shapes,
        check_inputs=[spec.example_inputs(b) for b in spec.batches],
        reference=reference,
        package_dir=args.out,
        iters=3,
        atol=spec.atol,
        rtol=spec.atol,
        min_cosine=spec.min_cosine,
    )
    ok = print_results(spec, reports)
    results = {
        "model": spec.name,
        "device": args.device,
        "passed": ok,
        "runs": [{"batch": b, **asdict(r)} for b, r in zip(spec.batches, reports)],
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0 if ok else 1
