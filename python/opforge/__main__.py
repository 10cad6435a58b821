"""opforge's command line: ``opforge new | build | verify | doctor | run | stubs`` (also ``python -m opforge``).

Exit codes: 0 success; 1 the step ran and failed (a build error, a verify mismatch, a runner
failure); 2 a usage error (bad arguments, a missing file, a library that does not load).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from opforge._extras import install

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _fail(verb: str, message: object, code: int = EXIT_USAGE) -> int:
    """Prints "opforge <verb>: <message>" (without the "opforge: " the core's messages start with)
    on standard error and returns ``code``."""
    print(f"opforge {verb}: {str(message).removeprefix('opforge: ')}", file=sys.stderr)
    return code


def _build(args: argparse.Namespace) -> int:
    import opforge

    paths = [Path(p) for p in args.paths]
    folder = paths[0] if len(paths) == 1 and paths[0].is_dir() else None
    if folder is None and any(p.is_dir() for p in paths):
        return _fail("build", "give one op folder, or op files (.cpp) and CUDA sources (.cu)")
    name = args.name or (folder.resolve().name if folder is not None else paths[0].stem)
    try:
        so = opforge.build_library(
            name,
            () if folder is not None else paths,
            folder=folder,
            kernels=args.kernels,
            build_dir=args.build_dir,
            cuda_architectures=args.cuda_architectures,
            verbose=args.verbose,
        )
    except ValueError as e:
        return _fail("build", f"{e} (see `opforge build --help`)")
    except opforge.BuildError as e:
        return _fail("build", e, EXIT_FAILED)
    print(so)
    return EXIT_OK


#: Files of an op folder that a user may give `opforge verify` for the folder itself.
SOURCE_SUFFIXES = (".cpp", ".cc", ".cu", ".cuh", ".h", ".hpp", ".py")


def _library(target: str) -> Path:
    """The op library a target of ``opforge verify`` names: an op folder (built as ``opforge
    build`` builds it: at once when it is up to date), a library file, or a library's name, which
    ``opforge build`` built into its cache (``lib<name>.so`` under ``~/.cache/opforge/build``) or,
    in a checkout, ``make build`` as an example op.

    Raises:
        FileNotFoundError: no library has that name.
        ValueError: several have (the message lists them), or the folder is no op folder.
        BuildError: building the folder failed.
    """
    import opforge
    from opforge import _build, _paths

    path = Path(target)
    if path.is_dir():
        return opforge.build_library(path.resolve().name, folder=path)
    if path.is_file() and path.suffix in SOURCE_SUFFIXES:
        raise ValueError(
            f"{target} is a source file, not an op library: give its op folder ({path.resolve().parent}) or the "
            "lib<name>.so built from it"
        )
    if path.suffix == ".so" or path.exists() or not target.isidentifier():
        return path

    def named(name: str) -> list[Path]:
        found = _build.built_libraries(name)
        if not _paths.installed() and (_paths.build_dir() / "lib" / f"lib{name}.so").exists():
            found.append(_paths.build_dir() / "lib" / f"lib{name}.so")
        return found

    name, found = target, named(target)
    if not found and target.startswith("lib") and target[3:].isidentifier():  # libX, the file's stem: X
        name, found = target[3:], named(target[3:])
    if not found:
        raise FileNotFoundError(
            f"no op library named {name!r}: give its op folder, its lib{name}.so, or an op name ns::op "
            f"(`opforge build <folder>` builds lib{name}.so from an op folder named {name})"
        )
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} op libraries are named {name!r}; give the op folder or the path of one:\n"
            + "\n".join(
                f"  {p}" + (f" (from {', '.join(src)})" if (src := _build.built_from(p)) else "") for p in found
            )
        )
    return found[0]


def _verify(args: argparse.Namespace) -> int:
    import opforge
    from opforge import verify
    from opforge._doctor import writable_file

    if args.device is not None and (problem := opforge.missing_device(args.device)) is not None:
        return _fail("verify", problem)
    names: list[str] = []
    given: list[str] = []  # the ops of the libraries given
    try:
        if args.json:
            writable_file(args.json, "json report")
        for target in args.targets:
            if "::" in target:
                names.append(target)
            else:
                given += opforge.load_library(_library(target)).op_names
        names = names if names else given
    except (ValueError, FileNotFoundError, opforge.OpforgeError) as e:
        return _fail("verify", str(e).removeprefix("opforge.doctor: "))
    except opforge.BuildError as e:
        return _fail("verify", e, EXIT_FAILED)
    report = None
    try:
        for name in dict.fromkeys(names):  # an op named twice (its library and its name) is verified once
            if given and name not in given:
                return _fail("verify", f"no op {name!r} in the op libraries given; they declare {', '.join(given)}")
            try:
                opforge.find_op(name)
            except ValueError as e:  # a qualified name whose library was not given
                return _fail("verify", f"{e} (pass the op library's path to load it)")
            report = verify.verify_op(name, device=args.device, seed=args.seed, dtypes=args.dtype, report=report)
    except (ValueError, opforge.OpforgeError) as e:
        return _fail("verify", e)
    if report is None:
        return _fail("verify", "no ops to verify")
    verify.print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2))
    return EXIT_OK if report.ok else EXIT_FAILED


#: ``opforge run --help`` before the runner is built (building it takes a minute; the runner's
#: own --help, shown once it is built, describes every option).
RUN_USAGE = """\
usage: opforge run PACKAGE.pt2 --inputs IN.pt --output OUT.pt [--inputs-after AFTER.pt]
                   [--device cpu|cuda[:N]] [--warmup N] [--iters N]

Run an AOTInductor package written by opforge.aoti.package in the C++ runner (opforge-runner, no
Python) and print one JSON line with its latency. The runner is built on the first `opforge run`
with this torch (once, a minute or so); `opforge run --help` then describes every option."""


def _option(args: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` in ``args`` (the last one), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.partition("=")[2]
    return value


def _run(rest: list[str]) -> int:
    import subprocess

    import opforge
    from opforge import _adapter, _paths

    device = _option(rest, "--device")
    if device is not None and (problem := opforge.missing_device(device)) is not None:
        return _fail("run", problem)
    runner = _adapter.built_path(_adapter.RUNNER, build=False)
    if not runner.exists() and not _paths.installed():
        return _fail("run", f"the C++ runner {runner} is not built; run `make build` in the checkout")
    if not runner.exists() and (not rest or "-h" in rest or "--help" in rest):  # usage builds nothing
        print(RUN_USAGE, file=sys.stdout if rest else sys.stderr)
        return EXIT_OK if rest else EXIT_USAGE
    try:
        runner = _adapter.runner_path()
    except (opforge.BuildError, opforge.OpforgeError) as e:
        return _fail("run", e, EXIT_FAILED)
    return subprocess.run([str(runner), *rest]).returncode


def _new(args: argparse.Namespace) -> int:
    from opforge.scaffold import new_op

    try:
        try:
            shape = None if args.shape is None else [int(d) for d in args.shape.split(",")]
        except ValueError:
            raise ValueError(f"--shape takes comma-separated sizes such as 64,512; got {args.shape!r}") from None
        written = new_op(args.op, Path(args.dir), args.dtypes.split(","), shape, triton=args.triton)
    except ValueError as e:
        return _fail("new", e)
    for path in written:
        print(path)
    folder = written[0].parent
    print(
        f"next: edit {written[0].name} and kernels/{written[1].name}, then `opforge verify {folder}` and "
        f"`pytest {folder / written[2].name}`"
    )
    if importlib.util.find_spec("pytest") is None:
        print(f"pytest is not installed in this Python: {install('test')}")
    return EXIT_OK


def _load_model(spec: str):
    """(model, inputs) from "file.py:function" or "package.module:function", whose function takes
    no arguments and returns them."""
    import importlib
    import importlib.util

    where, sep, func = spec.rpartition(":")
    if not sep or not where or not func:
        raise ValueError(f"expected file.py:function or module:function, got {spec!r}")
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise ValueError(f"{where} does not exist")
        module_spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    if not callable(getattr(module, func, None)):
        raise ValueError(f"{where} has no function {func}")
    made = getattr(module, func)()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise ValueError(f"{spec} must return (model, inputs), got {type(made).__name__}")
    return made


def _doctor(args: argparse.Namespace) -> int:
    import opforge
    from opforge._doctor import checked_plot_file, writable_file

    try:
        if args.json:
            writable_file(args.json, "json report")
        if args.plot:
            checked_plot_file(args.plot)
        model, inputs = _load_model(args.model)
        report = opforge.doctor(model, inputs, trace=args.trace, plot=args.plot)
    except (ValueError, TypeError, ImportError, OSError) as e:
        return _fail("doctor", str(e).removeprefix("opforge.doctor: "))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2))
    else:
        report.print_table()
    return EXIT_OK


def _stubs(args: argparse.Namespace) -> int:
    import opforge
    from opforge import _core
    from opforge.stubs import write_stubs

    try:
        library = _library(args.library)
        if not Path(library).exists():
            return _fail("stubs", f"{args.library} does not exist; build it with `opforge build`")
        written = write_stubs(_core.load_library(library), args.out)
    except (ValueError, FileNotFoundError, _core.OpforgeError) as e:
        return _fail("stubs", e)
    except opforge.BuildError as e:
        return _fail("stubs", e, EXIT_FAILED)
    for path in written:
        print(path)
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    """The command line's parser (``opforge --help``)."""
    import opforge

    top = argparse.ArgumentParser(
        prog="opforge",
        description="Build, verify and deploy operators described once in C++ (opforge/op.h).",
        epilog="Exit codes: 0 success, 1 the step failed, 2 bad arguments or input.",
    )
    top.add_argument("--version", action="version", version=f"opforge {opforge.__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="{new,build,verify,doctor,run,stubs}")

    n = sub.add_parser(
        "new",
        help="start an op folder (description, CPU reference, run-time kernel, a verify test)",
        description="Write <dir>/<name>/ for the op ns::name: an op file, kernels/<name>.cu (kernels/<name>.py "
        "with --triton) and test_<name>.py. It describes the identity y = x, which builds and passes opforge "
        "verify as written; replace its math with the op's.",
    )
    n.add_argument("op", help="the qualified op name, ns::name")
    n.add_argument("--dir", default=".", help="the folder to create it in (default: .)")
    n.add_argument(
        "--dtypes", default="float32,float16,bfloat16", help="comma-separated input dtypes (default: %(default)s)"
    )
    n.add_argument(
        "--shape",
        default=None,
        help="comma-separated sizes the model calls it with (opforge doctor prints them): the test also runs "
        "the op at that shape",
    )
    n.add_argument(
        "--triton",
        action="store_true",
        help="write the device kernel as a Triton kernel (kernels/<name>.py, launched by a grid function) "
        "instead of CUDA C++",
    )
    n.set_defaults(func=_new)

    b = sub.add_parser(
        "build",
        help="build an op folder, or op files, into an op library (lib<name>.so)",
        description="Build an op library with CMake and Ninja against the prebuilt op-library runtime; "
        "prints the path of lib<name>.so. A folder's *.cpp and *.cu are its sources, and its kernels/*.cu, "
        "kernels/*.py (Triton) and the folders in kernels/ its run-time kernels. Rebuilding after an edit "
        "compiles only what changed.",
    )
    b.add_argument("paths", nargs="+", help="one op folder, or op files (.cpp) and CUDA sources (.cu)")
    b.add_argument("--name", help="the library's name (default: the folder's name, or the first file's stem)")
    b.add_argument(
        "--kernels",
        nargs="*",
        default=(),
        help="run-time kernel sources for op files: .cu files, Triton .py files and folders of modules they import",
    )
    b.add_argument("--build-dir", default=None, help="where to build (default: under ~/.cache/opforge/build)")
    b.add_argument("--cuda-architectures", default="90", help="CMake CUDA architectures for .cu files (default 90)")
    b.add_argument("-v", "--verbose", action="store_true", help="print the build's output")
    b.set_defaults(func=_build)

    v = sub.add_parser(
        "verify",
        help="compare device kernels with the CPU reference, per op",
        description="Verify ops: device kernels against the CPU reference (on a machine without "
        "a GPU, the reference against the description's torch equivalent), "
        "opcheck, torch.compile without recompiles, Meta against real, and for "
        "an op with a backward op, torch.autograd.gradcheck.",
    )
    v.add_argument(
        "targets",
        nargs="+",
        help="an op folder (built first), an op library (lib<name>.so, or its name <name>: the one `opforge build` "
        "built, or in a checkout the example op's), or a qualified op name (ns::op) from a library also given: "
        "then only the ops named are verified",
    )
    v.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    v.add_argument("--seed", type=int, default=None, help="seed of the run (printed; default random)")
    v.add_argument(
        "--dtype",
        action="append",
        default=None,
        help="check the dtype combinations whose first floating input has this dtype (repeatable; default: all)",
    )
    v.add_argument("--json", default=None, help="also write the report as JSON to this file")
    v.set_defaults(func=_verify)

    d = sub.add_parser(
        "doctor",
        help="profile a model: what keeps it off the GPU or out of the compiled graph, and incomplete custom ops",
        description="Run opforge.doctor on the (model, inputs) that FUNCTION returns: CPU fallbacks, "
        "host-GPU copies, synchronisations and GPU idle gaps of one step under torch.profiler, graph breaks, "
        "recompiles and custom ops without a CUDA kernel, fake kernel or backward, most costly first, with "
        "module path and source line.",
    )
    d.add_argument("model", help="file.py:FUNCTION or package.module:FUNCTION returning (model, inputs)")
    d.add_argument("--json", default=None, help="write the findings as JSON to this file instead of the table")
    d.add_argument("--trace", default=None, help="write the profiled step as a Chrome/Perfetto trace to this file")
    d.add_argument(
        "--plot",
        default=None,
        help=f"write the step's GPU timeline as a PNG to this file (needs matplotlib: {install('doctor')})",
    )
    d.set_defaults(func=_doctor)

    sub.add_parser(
        "run",
        add_help=False,
        help="run an AOTInductor package in the C++ runner (`opforge run --help` for its options)",
    ).set_defaults(func=_run)

    s = sub.add_parser(
        "stubs",
        help="write typed stubs (<ns>.py + <ns>.pyi) for an op library's ops",
        description="Write <ns>.py (torch.ops.<ns> at run time) and <ns>.pyi (each op's signature and doc) "
        "for each namespace of an op library, so editors complete the ops.",
    )
    s.add_argument(
        "library",
        help="an op folder (built first), an op library (lib<name>.so), or its name <name> (as `opforge verify` "
        "takes them); the stubs' module needs the library loaded (opforge.load_library) before its ops are called",
    )
    s.add_argument("-o", "--out", default=".", help="folder to write the stubs into (default: .)")
    s.set_defaults(func=_stubs)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    top = parser()
    args, rest = top.parse_known_args(argv)
    if args.func is _run:  # everything after `run` is the runner's
        return _run(argv[argv.index("run") + 1 :])
    if rest:
        top.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
