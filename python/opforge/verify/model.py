"""Verifying a whole model end to end: export, AOTInductor package, the C++ runner on the device,
each output against the model run in eager on the CPU."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import aoti
from .._progress import status


@dataclass
class OutputResult:
    """One model output, or an input the model writes in place (``kind`` "input": its value after
    the run): the package's result against eager on the CPU."""

    index: int
    shape: list[int]
    max_abs_error: float
    cosine: float  # the smallest cosine similarity over rows (dim 0); the whole tensor's if 1-d
    status: str
    kind: str = "output"


@dataclass
class ModelReport:
    """A model verified end to end in the C++ runner."""

    device: str
    outputs: list[OutputResult]
    latency_ms: dict[str, float]
    package: str

    @property
    def ok(self) -> bool:
        return all(o.status == "pass" for o in self.outputs)


def _compare(
    index: int, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, min_cosine: float, kind: str
) -> OutputResult:
    """One tensor of the package's run against the reference's (see :func:`verify_model`)."""
    g, w = got.double(), want.double()
    err = (g - w).abs().max().item() if g.numel() and g.shape == w.shape else 0.0 if g.shape == w.shape else math.inf
    rows_g, rows_w = (g.flatten(1), w.flatten(1)) if g.dim() > 1 else (g[None], w[None])
    if g.numel() and g.shape == w.shape:
        cos = torch.nn.functional.cosine_similarity(rows_g, rows_w, dim=1).min().item()
    else:
        cos = 0.0 if g.numel() else 1.0
    ok = g.shape == w.shape and (torch.allclose(g, w, atol=atol, rtol=rtol) or (cos >= min_cosine and err <= 10 * atol))
    return OutputResult(index, list(got.shape), err, cos, "pass" if ok else "FAIL", kind)


def verify_model(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    device: str | None = None,
    dynamic_shapes=None,
    check_inputs: Sequence[Sequence[torch.Tensor]] | None = None,
    reference: torch.nn.Module | None = None,
    package_dir: str | Path | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    min_cosine: float = 0.9999,
    iters: int = 10,
    runtime: str = "aoti",
) -> list[ModelReport]:
    """Export ``model`` on ``device``, AOTInductor-compile it with its op libraries, run the package
    in the C++ runner, and compare each output with ``reference`` (default: ``model`` itself) run in
    eager on the CPU, where opforge ops run their CPU references; an input the reference writes in
    place (a KV cache) is compared too, after the run, with what the package left in it.

    With ``runtime="onnxruntime"`` the model is exported to ONNX instead (:func:`opforge.onnx.export`)
    and run by ONNX Runtime with the op libraries loaded into torch (the CUDA execution provider for
    ``device="cuda"``, which the installed onnxruntime must have); ``package`` is then the
    ``.onnx`` file, and only outputs are compared (ONNX has no inputs written in place).

    Args:
        model: the module (moved to ``device`` for export, then back to the CPU for reference).
        example_inputs: inputs used for export, on the CPU.
        device: ``"cuda"`` (default when a GPU is present) or ``"cpu"``.
        dynamic_shapes: passed to ``torch.export.export``.
        check_inputs: input sets to run and compare (default: the example inputs); other shapes
            exercise the dynamic dims.
        reference: the module to compare with, e.g. the same model without custom ops.
        package_dir: where the package is written (default: a temporary folder).
        atol, rtol, min_cosine: an output passes if allclose within atol/rtol, or, for outputs
            compared as directions (embeddings), if the cosine of the flattened tensors is at least
            ``min_cosine`` and the max abs error at most 10 * atol.
        iters: timed runs in the runner.
        runtime: ``"aoti"`` (the C++ runner) or ``"onnxruntime"``.

    Returns:
        One :class:`ModelReport` per input set.

    Raises:
        ValueError: an unknown ``runtime``, or ``"onnxruntime"`` on CUDA without its CUDA
            execution provider.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.eval()
    if runtime not in ("aoti", "onnxruntime"):
        raise ValueError(f"opforge.verify: runtime must be 'aoti' or 'onnxruntime', got {runtime!r}")
    package_dir = Path(package_dir or tempfile.mkdtemp(prefix="opforge-verify-"))
    if runtime == "onnxruntime":
        return _verify_onnxruntime(
            model,
            example_inputs,
            device,
            dynamic_shapes,
            check_inputs,
            reference,
            package_dir,
            (atol, rtol, min_cosine),
            iters,
        )
    with torch.no_grad(), status(f"opforge: exporting {type(model).__name__} (torch.export)"):
        program = torch.export.export(
            model.to(device), tuple(t.to(device) for t in example_inputs), dynamic_shapes=dynamic_shapes
        )
    package = aoti.package(program, package_dir)
    reference = (reference or model).cpu().eval()
    reports = []
    for inputs in check_inputs or [example_inputs]:
        written = [t.clone() for t in inputs]  # the reference's copies: it may write them in place
        with torch.inference_mode():
            expected = reference(*written)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        run = aoti.run(package, inputs, device=device, warmup=3, iters=iters)
        outs = [
            _compare(k, got, want, atol, rtol, min_cosine, "output")
            for k, (got, want) in enumerate(zip(run.outputs, expected))
        ]
        if len(run.outputs) != len(expected):
            outs.append(OutputResult(len(expected), [], math.inf, 0.0, "FAIL"))
        for k, (before, want, got) in enumerate(zip(inputs, written, run.inputs_after)):
            if not torch.equal(before, want) or not torch.equal(before, got):
                outs.append(_compare(k, got, want, atol, rtol, min_cosine, "input"))
        reports.append(ModelReport(run.device, outs, run.latency_ms, str(package)))
    return reports


def _verify_onnxruntime(
    model, example_inputs, device, dynamic_shapes, check_inputs, reference, package_dir, tolerances, iters
) -> list[ModelReport]:
    """:func:`verify_model` with ``runtime="onnxruntime"``."""
    import statistics
    import time

    import onnxruntime

    from .. import _torch
    from .. import onnx as opforge_onnx
    from ..onnx._runtime import libraries_serving

    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise ValueError(
                "opforge.verify: this onnxruntime has no CUDA execution provider "
                f"(it has {', '.join(onnxruntime.get_available_providers())}); install onnxruntime-gpu"
            )
        providers.insert(0, "CUDAExecutionProvider")
    path = package_dir / "model.onnx"
    with torch.no_grad(), status(f"opforge: exporting {type(model).__name__} (torch.onnx)"):
        program = opforge_onnx.export(
            model.to(device), tuple(t.to(device) for t in example_inputs), dynamic_shapes=dynamic_shapes
        )
    program.save(str(path))
    libraries = libraries_serving(program.model_proto, _torch.loaded_libraries())
    options = opforge_onnx.session_options(libraries) if libraries else onnxruntime.SessionOptions()
    session = onnxruntime.InferenceSession(str(path), options, providers=providers)
    names = [i.name for i in session.get_inputs()]
    reference = (reference or model).cpu().eval()
    reports = []
    for inputs in check_inputs or [example_inputs]:
        with torch.inference_mode():
            expected = reference(*[t.clone() for t in inputs])
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        feed = {n: t.numpy() for n, t in zip(names, inputs, strict=True)}
        got = session.run(None, feed)  # the compared run, which also warms up
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            session.run(None, feed)
            times.append((time.perf_counter() - start) * 1e3)
        latency = {"median": statistics.median(times), "min": min(times), "max": max(times)} if times else {}
        outs = [
            _compare(k, torch.from_numpy(g), w, *tolerances, "output") for k, (g, w) in enumerate(zip(got, expected))
        ]
        if len(got) != len(expected):
            outs.append(OutputResult(len(expected), [], math.inf, 0.0, "FAIL"))
        reports.append(ModelReport(device, outs, latency, str(path)))
    return reports
