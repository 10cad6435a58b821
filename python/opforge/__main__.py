"""opforge's command line: ``python -m opforge verify ...``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _verify(args: argparse.Namespace) -> int:
    import opforge
    from opforge import verify

    names: list[str] = []
    for target in args.targets:
        if target.endswith(".so") or Path(target).exists():
            names += opforge.load_library(target).op_names
        elif "::" in target:
            names.append(target)
        else:  # an example op's name
            names += opforge.load_library(opforge.example_library(target)).op_names
    report = None
    try:
        for name in names:
            report = verify.verify_op(name, device=args.device, seed=args.seed, dtypes=args.dtype, report=report)
    except (ValueError, opforge.OpforgeError) as e:
        print(f"opforge verify: {e} (pass the op library's path to load it)", file=sys.stderr)
        return 2
    if report is None:
        print("opforge verify: no ops to verify", file=sys.stderr)
        return 2
    verify.print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opforge", description="opforge command line")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser(
        "verify",
        help="compare device kernels with the CPU reference, per op",
        description="Verify ops: device kernels against the CPU reference (on a machine without "
        "a GPU, the reference against the description's torch equivalent), "
        "opcheck, torch.compile without recompiles, Meta against real, and for "
        "an op with a backward op, torch.autograd.gradcheck in float64.",
    )
    v.add_argument("targets", nargs="+", help="op library (.so), qualified op name (ns::op), or example op name")
    v.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    v.add_argument("--seed", type=int, default=None, help="seed of the run (printed; default random)")
    v.add_argument("--dtype", action="append", default=None, help="dtype to check (repeatable; default all floating)")
    v.add_argument("--json", default=None, help="also write the report as JSON to this file")
    v.set_defaults(func=_verify)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
