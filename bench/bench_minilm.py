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
synchronisation (``opforge.aoti.run``), with ``--rounds R`` the median over R runner processes per
package, alternating between the two, and the ratio of each round printed (host-side variation
between runner processes moves it); eager: median wall time per forward, synchronised.

With ``--profile``, one forward of each model under ``torch.compile`` (the Inductor lowering
AOTInductor packages) is traced with ``torch.profiler``: the GPU kernels it launches, grouped by
name, with their count and total device time, show where the two compiled models differ.

    python3 bench/bench_minilm.py [--batch 32] [--seq 128] [--iters 50] [--rounds 1] [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "models"))
import minilm  # noqa: E402
from common import kernel_times, print_kernel_times, report  # noqa: E402
from minilm_demo import compare, eager_latency_ms  # noqa: E402

from opforge import aoti  # noqa: E402


def profile_compiled(model: torch.nn.Module, inputs: list[torch.Tensor]) -> list[dict]:
    """GPU kernels of one forward of ``torch.compile(model)`` (common.kernel_times).

    torch.compile runs the same Inductor lowering as AOTInductor, so the kernels are those of
    the package the runner executes (loading the package's .so into this process instead is
    not supported next to the runner's).
    """
    compiled = torch.compile(model, dynamic=False)
    with torch.no_grad():
        return kernel_times(lambda: compiled(*inputs))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1, help="runner processes per package, alternating")
    parser.add_argument("--profile", action="store_true", help="trace each compiled model's GPU kernels")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    bert, tokenizer = minilm.load()
    reference = minilm.SentenceEmbedder(bert).eval()
    inputs = minilm.batch_inputs(tokenizer, args.batch, args.seq)
    with torch.inference_mode():
        expected = reference(*inputs)

    models = {
        "opforge ops": minilm.with_opforge_ops(reference, torch.float16),  # loads the three ops
        "no custom ops": copy.deepcopy(reference).to(torch.float16),
    }
    cuda_inputs = [t.cuda() for t in inputs]
    rows, profiles, packages, runner_ms = [], {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="opforge-bench-minilm-") as tmp:
        for name, model in models.items():
            model = model.cuda().eval()
            with torch.no_grad():
                program = torch.export.export(model, tuple(cuda_inputs))
            package = packages[name] = aoti.package(program, Path(tmp) / name.replace(" ", "_"))
            run = aoti.run(package, inputs, device="cuda", warmup=5, iters=args.iters)
            runner_ms[name] = [run.latency_ms["median"]]
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
        for _ in range(args.rounds - 1):  # later rounds alternate the packages' runner processes
            for name, package in packages.items():
                run = aoti.run(package, inputs, device="cuda", warmup=5, iters=args.iters)
                runner_ms[name].append(run.latency_ms["median"])
    for r in rows:
        if r["impl"].startswith("AOTI runner, "):
            r["latency_ms"] = statistics.median(runner_ms[r["impl"].removeprefix("AOTI runner, ")])
    ratios = [w / o for w, o in zip(runner_ms["no custom ops"], runner_ms["opforge ops"])]
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
        {"profiles": profiles, "runner_ms": runner_ms, "runner_ratios": ratios},
    )
    print(
        f"runner, opforge ops x no custom ops over {len(ratios)} rounds: median {statistics.median(ratios):.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})"
    )
    for name, table in profiles.items():
        print_kernel_times(f"GPU kernels per forward, torch.compile, {name}", table)
    return 0 if all(r["cosine_min"] > 0.999 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
