"""all-MiniLM-L6-v2 through ONNX Runtime with opforge ops, against the same model exported without.

Batch 32 x sequence 128 (the demo's sentences, repeated and padded to 128 tokens), in the same
process:

- opforge: every layer's attention, residual LayerNorms and bias + GELU as opforge ops
  (``minilm.OpforgeBert``), exported with ``opforge.onnx.export`` and run by ONNX Runtime with the
  opforge adapter (``opforge.onnx.session_options``);
- the unmodified model (transformers' BertModel), exported with ``torch.onnx.export(dynamo=True)``
  and run by the same ONNX Runtime.

On the CPU execution provider both run in float32 (the opforge ops run their CPU references);
with ``--cuda`` (an onnxruntime with the CUDA execution provider) in float16, the opforge ops'
CUDA kernels on ONNX Runtime's stream. Each is compared with the float32 model in eager on the CPU
(worst cosine over the batch, max abs error). Latency: median wall time of ``session.run`` over
``--iters`` runs after warm-up, inputs and outputs on the host.

    python3 bench/bench_onnx.py [--batch 32] [--seq 128] [--iters 20] [--cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "models"))
import minilm  # noqa: E402
from common import report  # noqa: E402
from minilm_demo import compare  # noqa: E402

import opforge  # noqa: E402
import opforge.onnx  # noqa: E402

OPS = ("attention", "add_layer_norm", "bias_gelu")


def with_opforge_ops(reference: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``reference`` in ``dtype`` with every encoder layer computed by opforge ops (minilm.OpforgeBert)."""
    model = copy.deepcopy(reference).to(dtype)
    model.bert = minilm.OpforgeBert(model.bert)
    return model.eval()


def session_ms(session: onnxruntime.InferenceSession, feed: dict, iters: int) -> tuple[list, float]:
    """The outputs of one run, and the median wall time of ``iters`` more, in milliseconds."""
    outputs = session.run(None, feed)
    for _ in range(3):
        session.run(None, feed)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return outputs, statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--cuda", action="store_true", help="the CUDA execution provider, float16")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.cuda and "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        print(f"bench_onnx: this onnxruntime has no CUDA execution provider ({onnxruntime.get_available_providers()})")
        return 2
    libs = [opforge.load_library(opforge.example_library(op)) for op in OPS]
    bert, tokenizer = minilm.load()
    reference = minilm.SentenceEmbedder(bert).eval()
    inputs = minilm.batch_inputs(tokenizer, args.batch, args.seq)
    with torch.inference_mode():
        expected = reference(*inputs)

    dtype = torch.float16 if args.cuda else torch.float32
    device = "cuda" if args.cuda else "cpu"
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if args.cuda else ["CPUExecutionProvider"]
    models = {"opforge ops": with_opforge_ops(reference, dtype), "no custom ops": copy.deepcopy(reference).to(dtype)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="opforge-bench-onnx-") as tmp:
        for name, model in models.items():
            model = model.to(device).eval()
            path = Path(tmp) / f"{name.replace(' ', '_')}.onnx"
            with torch.no_grad():
                program = opforge.onnx.export(model, tuple(t.to(device) for t in inputs), libraries=libs)
            program.save(str(path))
            session = onnxruntime.InferenceSession(str(path), opforge.onnx.session_options(libs), providers=providers)
            feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
            outputs, ms = session_ms(session, feed, args.iters)
            rows.append(
                {
                    "impl": f"ONNX Runtime {providers[0]}, {name}",
                    **compare(torch.from_numpy(outputs[0]), expected),
                    "latency_ms": ms,
                }
            )
            print(f"  measured: {rows[-1]}", flush=True)
    base = rows[1]["latency_ms"]
    for r in rows:
        r["group"] = (
            f"all-MiniLM-L6-v2 {str(dtype).removeprefix('torch.')}, [{args.batch}, {args.seq}], "
            f"ONNX Runtime {onnxruntime.__version__}, against float32 eager on the CPU"
        )
        r["speedup_vs_without"] = base / r["latency_ms"]
    report(
        rows,
        lambda r: (
            f"{r['impl']:<52} cosine {r['cosine_min']:.6f}  max abs {r['max_abs_error']:.2e}  "
            f"{r['latency_ms']:8.2f} ms  x{r['speedup_vs_without']:.2f}"
        ),
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
