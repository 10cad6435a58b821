"""The end-to-end demo (``make demo``): a real sentence-embedding model with an opforge op
inside, exported, compiled ahead of time and run by the C++ runner.

1. Load the pretrained all-MiniLM-L6-v2 and tokenize a handful of real sentences.
2. Swap every layer's intermediate ``dense + GELU`` for a matmul and ``examples::bias_gelu``.
3. ``torch.export`` with dynamic batch and sequence dims, AOTInductor-compile into a ``.pt2``
   package with the op library beside it.
4. Run the package in ``opforge-runner`` (a separate C++ process, no Python) on CUDA if there
   is a GPU, else on the CPU, on the sentences and on a second batch of another shape.
5. Compare its embeddings with the unmodified model run in eager on the CPU
   (``opforge.verify.verify_model``): cosine similarity (the worst sentence) and max abs
   error; print a table, write the same as JSON.

With ``--int8``, step 2 instead swaps every encoder linear layer for ``examples::Int8Linear``
(a custom class holding int8 weights per output channel, quantised and packed at construction;
float16 activations on CUDA, float32 on the CPU), and the package carries the objects.

Exits with status 1 if any cosine similarity is below --min-cosine (default 0.9999; 0.999 with
--int8, whose weights are rounded to 8 bits).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm  # noqa: E402

import opforge  # noqa: E402
from opforge import verify  # noqa: E402


def eager_latency_ms(model: torch.nn.Module, inputs: list[torch.Tensor], iters: int) -> float:
    """Median wall time of one forward pass, in milliseconds (synchronised on CUDA)."""
    times = []
    with torch.inference_mode():
        model(*inputs)
        for _ in range(iters):
            if inputs[0].is_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(*inputs)
            if inputs[0].is_cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Worst per-row cosine similarity and max abs error of ``out`` against ``ref`` (both [B, D])."""
    out, ref = out.double().cpu(), ref.double().cpu()
    cos = torch.nn.functional.cosine_similarity(out, ref, dim=1)
    return {"cosine_min": cos.min().item(), "max_abs_error": (out - ref).abs().max().item()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="package and results folder")
    parser.add_argument("--iters", type=int, default=20, help="timed runs per measurement")
    parser.add_argument("--int8", action="store_true", help="int8 weights in every encoder linear layer")
    parser.add_argument("--min-cosine", type=float, default=None, help="default 0.9999, 0.999 with --int8")
    args = parser.parse_args()
    if (problem := opforge.missing_device(args.device)) is not None:
        parser.exit(2, f"{parser.prog}: {problem}\n")
    if args.min_cosine is None:
        args.min_cosine = 0.999 if args.int8 else 0.9999
    console = Console(width=max(100, Console().width))
    device = torch.device(args.device)

    opforge.load_library(opforge.example_library("bias_gelu"))
    bert, tokenizer = minilm.load()
    reference = minilm.SentenceEmbedder(bert).eval()
    if args.int8:
        dtype = torch.float16 if device.type == "cuda" else torch.float32
        custom, what = minilm.with_int8_linears(reference, device, dtype).eval(), f"examples::Int8Linear ({dtype})"
    else:
        custom, what = minilm.with_bias_gelu(reference).to(device).eval(), "examples::bias_gelu"

    batches = {
        "sentences": tokenizer(minilm.SENTENCES, padding=True, return_tensors="pt"),
        "short": tokenizer(minilm.SENTENCES[5:7], padding=True, return_tensors="pt"),  # another [B, S]
    }
    inputs = {k: [b["input_ids"], b["attention_mask"]] for k, b in batches.items()}
    with torch.inference_mode():
        expected = {k: reference(*v) for k, v in inputs.items()}

    console.print(f"[bold]opforge demo[/]: all-MiniLM-L6-v2 with {what}, runner on {device}")
    dims = {
        "input_ids": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
        "attention_mask": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
    }
    t0 = time.perf_counter()
    # The model-level check: export, AOTInductor package, C++ runner on the device, each output
    # against the unmodified model in eager on the CPU.
    reports = verify.verify_model(
        custom,
        inputs["sentences"],
        device=str(device),
        dynamic_shapes=dims,
        check_inputs=list(inputs.values()),
        reference=reference,
        package_dir=args.out / "minilm",
        min_cosine=args.min_cosine,
        atol=1e-2 if args.int8 else 1e-4,  # max abs error of unit-norm embeddings
        iters=args.iters,
    )
    package_s = time.perf_counter() - t0
    console.print(f"exported, packaged and run in {package_s:.1f} s: {reports[0].package}", soft_wrap=True)

    rows = []
    custom.to(device)  # verify_model leaves the model where its export ran or on the CPU
    for (name, tensors), report in zip(inputs.items(), reports):
        shape = list(tensors[0].shape)
        out = report.outputs[0]
        rows.append(
            {
                "model": "AOTI runner",
                "device": report.device,
                "batch": name,
                "shape": shape,
                "cosine_min": out.cosine,
                "max_abs_error": out.max_abs_error,
                "latency_ms": report.latency_ms["median"],
                "status": out.status,
            }
        )
        with torch.inference_mode():
            eager_out = custom(*[t.to(device) for t in tensors])
        rows.append(
            {
                "model": "eager + op",
                "device": str(device),
                "batch": name,
                "shape": shape,
                **compare(eager_out, expected[name]),
                "latency_ms": eager_latency_ms(custom, [t.to(device) for t in tensors], args.iters),
            }
        )
        rows.append(
            {
                "model": "eager, reference",
                "device": "cpu",
                "batch": name,
                "shape": shape,
                **compare(expected[name], expected[name]),
                "latency_ms": eager_latency_ms(reference, tensors, args.iters),
            }
        )

    table = Table(title="Embeddings against the unmodified model in eager on the CPU (the reference)")
    for col in ("model", "device", "batch [B, S]", "cosine (min)", "max abs err", "latency / batch"):
        table.add_column(col, justify="left" if col in ("model", "device", "batch [B, S]") else "right")
    for r in rows:
        table.add_row(
            r["model"],
            r["device"],
            f"{r['batch']} {r['shape']}",
            f"{r['cosine_min']:.7f}",
            f"{r['max_abs_error']:.2e}",
            f"{r['latency_ms']:.2f} ms",
        )
    console.print(table)

    ok = all(r["cosine_min"] >= args.min_cosine for r in rows) and all(r.ok for r in reports)
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.node(),
        "torch": torch.__version__,
        "device": str(device),
        "int8": args.int8,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "export_compile_run_s": package_s,
        "min_cosine_required": args.min_cosine,
        "passed": ok,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    console.print(f"results written to {args.out / 'results.json'}")
    if not ok:
        failed = [f"{r['model']} {r['batch']}" for r in rows if r.get("status", "pass") != "pass"]
        console.print(
            f"[red]FAILED[/]: a cosine similarity is below {args.min_cosine}"
            + (f", or the runner's max abs error is too large ({', '.join(failed)})" if failed else "")
        )
        return 1
    console.print(f"[green]OK[/]: every embedding within cosine {args.min_cosine} of the unmodified model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
