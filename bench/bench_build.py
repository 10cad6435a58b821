"""Build time of a new one-op library: opforge against a torch.utils.cpp_extension build of the same op.

The op is examples/ops/softshrink (op file and run-time kernel sources, copied to a scratch
folder); the baseline is the same CPU reference registered by hand with TORCH_LIBRARY
(bench/build_baseline/softshrink_ext.cpp), built by ``torch.utils.cpp_extension.load``. Each
measurement runs in a fresh process and times building and loading the library:

- fresh: a new build folder (nothing cached; ccache disabled);
- edit: the op file changed (a comment appended) and built again in the same folder.

    python3 bench/bench_build.py [--repeats 3] [--json out.json]

Prints the median of ``--repeats`` runs per row and the ratio baseline / opforge. Run it on an
idle machine: the figures are wall-clock seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OP_FOLDER = HERE.parent / "examples" / "ops" / "softshrink"
BASELINE = HERE / "build_baseline" / "softshrink_ext.cpp"

# Each child prints the seconds it spent building and loading.
OPFORGE_CHILD = """
import sys, time, opforge
t = time.perf_counter()
opforge.load_library(opforge.build_library("softshrink_bench", folder=sys.argv[1], build_dir=sys.argv[2]))
print(time.perf_counter() - t)
"""
BASELINE_CHILD = """
import sys, time
from torch.utils import cpp_extension
t = time.perf_counter()
cpp_extension.load("softshrink_ext", [sys.argv[1]], build_directory=sys.argv[2], is_python_module=False)
print(time.perf_counter() - t)
"""


def _seconds(child: str, *args: str) -> float:
    env = {**os.environ, "CCACHE_DISABLE": "1", "OPFORGE_QUIET": "1"}
    proc = subprocess.run([sys.executable, "-c", child, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_build: a build failed:\n{proc.stdout}{proc.stderr}")
    return float(proc.stdout.strip().splitlines()[-1])


def _append_comment(path: Path, run: int) -> None:
    with path.open("a") as f:
        f.write(f"// edit {run}\n")


def measure(repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {
        k: [] for k in ("opforge fresh", "opforge edit", "baseline fresh", "baseline edit")
    }
    for run in range(repeats):
        with tempfile.TemporaryDirectory(prefix="opforge-bench-build-") as tmp:
            folder = Path(tmp) / "softshrink"
            shutil.copytree(OP_FOLDER, folder)
            times["opforge fresh"].append(_seconds(OPFORGE_CHILD, str(folder), str(Path(tmp) / "opforge")))
            _append_comment(folder / "softshrink.cpp", run)
            times["opforge edit"].append(_seconds(OPFORGE_CHILD, str(folder), str(Path(tmp) / "opforge")))
            source = Path(tmp) / "softshrink_ext.cpp"
            shutil.copy(BASELINE, source)
            (Path(tmp) / "ext").mkdir()
            times["baseline fresh"].append(_seconds(BASELINE_CHILD, str(source), str(Path(tmp) / "ext")))
            _append_comment(source, run)
            times["baseline edit"].append(_seconds(BASELINE_CHILD, str(source), str(Path(tmp) / "ext")))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    times = measure(args.repeats)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"one-op library (examples/ops/softshrink), median of {args.repeats}, seconds to build and load")
    for kind in ("fresh", "edit"):
        mine, theirs = median[f"opforge {kind}"], median[f"baseline {kind}"]
        ratio = theirs / mine
        print(f"  {kind:<6} opforge {mine:6.2f} s   torch.utils.cpp_extension {theirs:6.2f} s   {ratio:5.1f} x faster")
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "seconds": times}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
