"""The example models (examples/models/pipeline.py, side_by_side.py, llama_layer.py and liger_block.py) end to
end: each
``main()`` exports the model with a dynamic batch dim, AOTInductor-compiles it, runs it in the
C++ runner and compares it with the same weights in plain torch, in eager on the CPU; the
decoder layer's ``main()`` also runs a generation loop of its decode step in the runner. One
package per model and device (module-scoped): AOTInductor takes tens of seconds on a CPU."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import requires_cuda
from opforge import verify
from readme_blocks import command

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "models"))
import liger_block  # noqa: E402
import llama_layer  # noqa: E402
import pipeline  # noqa: E402
import side_by_side  # noqa: E402

MODELS = {"pipeline": pipeline, "side_by_side": side_by_side, "llama_layer": llama_layer, "liger_block": liger_block}
#: Output shapes for a batch of b (tokens for the decoder layer).
SHAPES = {
    "pipeline": lambda b: [[b, pipeline.SEQ, pipeline.HIDDEN]],
    "side_by_side": lambda b: [[b, side_by_side.LENGTH, side_by_side.HIDDEN], [b, side_by_side.CLASSES]],
    "llama_layer": lambda b: [[b, llama_layer.HIDDEN]],
    "liger_block": lambda b: [[b, liger_block.SEQ, liger_block.HIDDEN], [b, liger_block.SEQ, liger_block.CLASSES]],
}
#: The ops in a model's graph, where they are not one per library of ``SPEC.ops`` (the library
#: ``liger`` holds Liger-Kernel's ops).
GRAPH_OPS = {
    "liger_block": {
        "examples::add_layer_norm",
        "examples::bias_gelu",
        "examples::liger_rms_norm",
        "examples::liger_swiglu",
        "examples::liger_softmax",
    }
}


def readme_argv(name: str, device: str) -> list[str]:
    """The model's command line as the docs give it (``python examples/models/<name>.py
    --device cpu``), its arguments for ``main``, on ``device``."""
    argv = shlex.split(command(f"python examples/models/{name}.py"))[2:]
    assert argv[:2] == ["--device", "cpu"], argv
    return ["--device", device, *argv[2:]]


@dataclass
class MainRun:
    name: str
    exit_code: int
    stdout: str
    results: dict
    package_dir: Path


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("pipeline", "cpu"), id="pipeline-cpu"),
        pytest.param(("side_by_side", "cpu"), id="side_by_side-cpu"),
        pytest.param(("llama_layer", "cpu"), id="llama_layer-cpu"),
        pytest.param(("liger_block", "cpu"), id="liger_block-cpu"),
        pytest.param(("pipeline", "cuda"), id="pipeline-cuda", marks=requires_cuda),
        pytest.param(("side_by_side", "cuda"), id="side_by_side-cuda", marks=requires_cuda),
        pytest.param(("llama_layer", "cuda"), id="llama_layer-cuda", marks=requires_cuda),
        pytest.param(("liger_block", "cuda"), id="liger_block-cuda", marks=requires_cuda),
    ],
)
def main_run(request, tmp_path_factory) -> MainRun:
    """The model's ``main`` with the README's arguments (``--device`` set to the device) and
    ``--out`` a temporary folder, run once, its output captured."""
    name, device = request.param
    tmp = tmp_path_factory.mktemp(f"{name}-{device}")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):  # the kernel cache: conftest's _session_opforge_cache
        code = MODELS[name].main(readme_argv(name, device) + ["--out", str(tmp / "package")])
    return MainRun(
        name, code, stdout.getvalue(), json.loads((tmp / "package" / "results.json").read_text()), tmp / "package"
    )


@pytest.mark.slow
def test_runner_matches_plain_torch(main_run):
    assert main_run.exit_code == 0, main_run.stdout
    assert main_run.results["passed"] is True
    batches = [run["batch"] for run in main_run.results["runs"]]
    assert batches == list(MODELS[main_run.name].SPEC.batches)
    spec = MODELS[main_run.name].SPEC
    for run in main_run.results["runs"]:
        outputs = [o for o in run["outputs"] if o["kind"] == "output"]
        assert [o["shape"] for o in outputs] == SHAPES[main_run.name](run["batch"])
        assert all(o["status"] == "pass" and o["max_abs_error"] < 10 * spec.atol for o in run["outputs"]), outputs
        assert run["device"].split(":")[0] == main_run.results["device"]


def test_prints_every_output_error(main_run):
    for run in main_run.results["runs"]:
        for o in run["outputs"]:
            assert (
                f"{main_run.name} on {run['device']}, batch {run['batch']}: {o['kind']} {o['index']} {o['shape']}: "
                f"max abs error {o['max_abs_error']:.2e}"
            ) in main_run.stdout
    assert f"{main_run.name}: OK" in main_run.stdout


def test_package_carries_every_custom_op(main_run):
    manifest = (main_run.package_dir / "opforge_ops.txt").read_text().splitlines()
    ops = {line.split()[0] for line in manifest if not line.startswith("#")}
    want = GRAPH_OPS.get(main_run.name, {f"examples::{name}" for name in MODELS[main_run.name].SPEC.ops})
    assert ops == want
    assert all((main_run.package_dir / line.split()[1]).exists() for line in manifest if not line.startswith("#"))


@pytest.mark.parametrize("name", MODELS)
def test_opforge_ops_match_plain_torch_in_eager(name):
    spec = MODELS[name].SPEC
    llama_layer.model_check.load_example_ops(spec.ops)  # run alone too, not only after the main runs
    model, plain = spec.make_model(), spec.make_model(plain=True)
    tol = spec.atol if spec.atol > 1e-4 else 1e-5  # the float32 models agree to 1e-5 in eager
    for batch in spec.batches:
        mine, theirs = spec.example_inputs(batch), spec.example_inputs(batch)  # each call writes its own
        with torch.inference_mode():
            got, want = model(*mine), plain(*theirs)
        for g, w in zip(*[[t] if isinstance(t, torch.Tensor) else t for t in (got, want)]):
            torch.testing.assert_close(g.float(), w.float(), atol=tol, rtol=tol)
        for g, w in zip(mine, theirs):  # and the inputs the models write
            torch.testing.assert_close(g.float(), w.float(), atol=tol, rtol=tol)


def test_side_by_side_passes_identity_conv_a_permuted_view():
    spec = side_by_side.SPEC
    program = torch.export.export(spec.make_model(), tuple(spec.example_inputs(2)), dynamic_shapes=spec.dynamic_shapes)
    (node,) = [n for n in program.graph.nodes if n.target == torch.ops.examples.identity_conv.default]
    x = node.args[0].meta["val"]
    assert not x.is_contiguous() and x.stride()[1:] == (1, side_by_side.LENGTH)


def test_mismatch_exits_nonzero(monkeypatch, tmp_path, capsys):
    output = verify.OutputResult(index=0, shape=[3, 6, 32], max_abs_error=0.5, cosine=0.9, status="FAIL")
    bad = verify.ModelReport(device="cpu", outputs=[output], latency_ms={"median": 1.0}, package="model.pt2")
    monkeypatch.setattr(verify, "verify_model", lambda *args, **kwargs: [bad] * len(pipeline.SPEC.batches))
    assert pipeline.main(["--device", "cpu", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "batch 3: output 0 [3, 6, 32]: max abs error 5.00e-01, cosine 0.9000000: FAIL" in out
    assert "pipeline: FAILED" in out
    assert json.loads((tmp_path / "results.json").read_text())["passed"] is False


@pytest.mark.parametrize("folder, fp8", llama_layer.DECODE_RUNS, ids=["auto", "fp8"])
def test_llama_decode_loop_in_the_runner_matches_plain_torch(main_run, folder, fp8):
    """llama_layer's ``main()`` runs DECODE_STEPS decode steps, each in the C++ runner, the caches
    and hidden state carried from step to step, against plain torch: every step and the caches
    after the last pass, and seq_lens grows by one a step; with caches of the layer's dtype, then
    float8 caches (kv_cache_dtype "fp8": reshape_and_cache_flash and the fp8 paged decode)."""
    if main_run.name != "llama_layer":
        pytest.skip("the decode loop is llama_layer's")
    results = json.loads((main_run.package_dir / folder / "results.json").read_text())
    assert results["passed"] is True and results["device"] == main_run.results["device"]
    assert results["fp8"] is fp8
    label = llama_layer.decode_label(fp8)
    contexts, steps = llama_layer.DECODE_CONTEXTS, llama_layer.DECODE_STEPS
    assert [s["seq_lens"] for s in results["steps"]] == [[c + k + 1 for c in contexts] for k in range(steps)]
    for s in results["steps"]:
        assert s["passed"] is True and s["cosine"] >= llama_layer.DECODE_MIN_COSINE, s
        assert f"{label} on {main_run.results['device']}" in main_run.stdout
        assert (
            f"step {s['step']}: output [{len(contexts)}, {llama_layer.HIDDEN}]: max abs error "
            f"{s['max_abs_error']:.2e}, cosine {s['cosine']:.7f}, seq_lens {s['seq_lens']}: pass"
        ) in main_run.stdout
    assert [(c["name"], c["passed"]) for c in results["caches"]] == [("key_cache", True), ("value_cache", True)]
    assert f"{label}: OK: {steps} steps in opforge-runner against plain torch" in main_run.stdout


@pytest.mark.parametrize("fp8", [False, True], ids=["auto", "fp8"])
def test_llama_decode_step_matches_plain_torch_in_eager(fp8):
    """The decode step with opforge ops against plain torch, in eager, over DECODE_STEPS steps of
    one loop: outputs, seq_lens and every input the step writes; with float8 caches too, whose
    writes must quantise as vLLM's do (compared as the values they stand for, with FP8_CACHE_RTOL)."""
    llama_layer.model_check.load_example_ops((*llama_layer.SPEC.ops, "paged_decode_attention"))
    model = llama_layer.make_model(kind=llama_layer.LlamaDecodeStep, fp8=fp8)
    plain = llama_layer.make_model(plain=True, kind=llama_layer.LlamaDecodeStep, fp8=fp8)
    mine, theirs = llama_layer.decode_inputs(fp8=fp8), llama_layer.decode_inputs(fp8=fp8)
    if fp8:
        assert mine[2].dtype == mine[3].dtype == torch.float8_e4m3fn
    for _ in range(llama_layer.DECODE_STEPS):
        with torch.inference_mode():
            got, want = model(*mine), plain(*theirs)
        assert llama_layer.compare(got[0], want[0])[2], llama_layer.compare(got[0], want[0])
        for g, w, scale in zip(mine[2:4], theirs[2:4], (llama_layer.K_SCALE, llama_layer.V_SCALE)):  # as written
            assert llama_layer.compare_cache(g, w, scale)[2], llama_layer.compare_cache(g, w, scale)
        assert torch.equal(got[1], want[1]) and torch.equal(got[1], mine[5] + 1)
        # x (normed) and residual, as written, carry the rounding of every step before in the
        # residual stream, which grows by a hidden state each step: their cosine, and 4 x the tolerance.
        for g, w in zip(mine[:2], theirs[:2]):
            err, cos, _ = llama_layer.compare(g, w)
            tol = 4 * llama_layer.DECODE_TOLERANCE
            assert cos >= llama_layer.DECODE_MIN_COSINE and torch.allclose(g, w, atol=tol, rtol=tol), (err, cos)
        mine, theirs = llama_layer.next_inputs(mine, got), llama_layer.next_inputs(theirs, want)
