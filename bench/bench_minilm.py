"""all-MiniLM-L6-v2 end to end with opforge ops, in the C++ runner, against the same model without.

Batch 32 x sequence 128 (the demo's sentences, repeated and padded to 128 tokens), float16,
on CUDA, in the same process:

- opforge: every layer's attention, residual LayerNorms and bias + GELU as opforge ops
  (``minilm.with_opforge_ops``), exported, AOTInductor-compiled, run by ``opforge-runner``;
- the unmodified model (transformers' BertModel, SDPA attention) in float16, exported and
  AOTInductor-compiled the same way, run by the same runner;
- both in eager on CUDA.

Each is compared with the float32 model in eager on the CPU (worst cosine over the batch, max
abs error). Runner latency: median wall time of ``AOTIModelPackageLoader::run`` plus a device
synchronisation (``opforge.aoti.run``); eager: median wall time per forward, synchronised.

With ``--profile``, one forward of each model under ``torch.compile`` (the Inductor lowering
AOTInductor packages) is traced with ``torch.profiler``: the GPU kernels it launches, grouped by
name, with their count and total device time, show where the two compiled models differ.

    python3 bench/bench_minilm.py [--batch 32] [--seq 128] [--iters 50] [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "models"))
import minilm  # noqa: E402
from common import report  # noqa: E402
from minilm_demo import compare, eager_latency_ms  # noqa: E402

from opforge import aoti  # noqa: E402


def profile_compiled(model: torch.nn.Module, inputs: list[torch.Tensor], rows: int = 25) -> list[dict]:
    """GPU kernels of one forward of ``torch.compile(model)``, by name: count and device time (us).

    torch.compile runs the same Inductor lowering as AOTInductor, so the kernels are those of
    the package the runner executes (loading the package's .so into this process instead is
    not supported next to the runner's). Warmed up, then 10 forwards are traced with
    ``torch.profiler``; counts and times are per forward, sorted by time, at most ``rows`` names
    and a total.
    """
    compiled = torch.compile(model, dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            compiled(*inputs)
        torch.cuda.synchronize()
        repeats = 10
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                compiled(*inputs)
            torch.cuda.synchronize()
    kernels: dict[str, dict] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = kernels.setdefault(event.name, {"name": event.name, "count": 0, "us": 0.0})
        k["count"] += 1
        k["us"] += event.device_time_total / repeats
    table = sorted(kernels.values(), key=lambda k: -k["us"])
    for k in table:
        k["count"] = k["count"] / repeats
    total = {"name": "(total)", "count": sum(k["count"] for k in table), "us": sum(k["us"] for k in table)}
    return table[:rows] + [total]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--profile", action="store_true", help="trace each compiled model's GPU kernels")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    bert, tokenizer = minilm.load()
    reference = minilm.SentenceEmbedder(bert).eval()
    sentences = (minilm.SENTENCES * (args.batch // len(minilm.SENTENCES) + 1))[: args.batch]
    tokens = tokenizer(sentences, padding="max_length", max_length=args.seq, truncation=True, return_tensors="pt")
    inputs = [tokens["input_ids"], tokens["attention_mask"]]
    with torch.inference_mode():
        expected = reference(*inputs)

    models = {
        "opforge ops": minilm.with_opforge_ops(reference, torch.float16),  # loads the three ops
        "no custom ops": copy.deepcopy(reference).to(torch.float16),
    }
    cuda_inputs = [t.cuda() for t in inputs]
    rows, profiles = [], {}
    with tempfile.TemporaryDirectory(prefix="opforge-bench-minilm-") as tmp:
        for name, model in models.items():
            model = model.cuda().eval()
            with torch.no_grad():
                program = torch.export.export(model, tuple(cuda_inputs))
            package = aoti.package(program, Path(tmp) / name.replace(" ", "_"))
            run = aoti.run(package, inputs, device="cuda", warmup=5, iters=args.iters)
            rows.append(
                {
                    "impl": f"AOTI runner, {name}",
                    **compare(run.outputs[0], expected),
                    "latency_ms": run.latency_ms["median"],
                }
            )
            print(f"  measured: {rows[-1]}", flush=True)
            if args.profile:
                profiles[name] = profile_compiled(model, cuda_inputs)
            with torch.inference_mode():
                out = model(*cuda_inputs)
            rows.append(
                {
                    "impl": f"eager CUDA, {name}",
                    **compare(out, expected),
                    "latency_ms": eager_latency_ms(model, cuda_inputs, args.iters),
                }
            )
    base = next(r["latency_ms"] for r in rows if r["impl"] == "AOTI runner, no custom ops")
    for r in rows:
        r["group"] = f"all-MiniLM-L6-v2 float16, [{args.batch}, {args.seq}], against float32 eager on the CPU"
        r["speedup_vs_aoti_without"] = base / r["latency_ms"]
    report(
        rows,
        lambda r: (
            f"{r['impl']:<32} {r['latency_ms']:8.3f} ms  {r['speedup_vs_aoti_without']:.3f} x AOTI "
            f"without  cosine {r['cosine_min']:.6f}  max abs err {r['max_abs_error']:.2e}"
        ),
        args.json,
        {"profiles": profiles},
    )
    for name, table in profiles.items():
        print(f"GPU kernels per forward, torch.compile, {name} (count, device time):")
        for k in table:
            print(f"  {k['count']:6.1f}  {k['us']:9.1f} us  {k['name'][:110]}")
    return 0 if all(r["cosine_min"] > 0.999 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
