"""opforge's Triton compiler process: ``python -m opforge._triton_worker`` reads one JSON request
on stdin and writes one JSON answer on stdout; with ``--serve`` it reads one request per line and
writes one answer line each, until stdin ends.

The op library (C++, src/oplib/triton_worker.cpp) starts this process (``--serve``, kept between
requests) when a Triton kernel variant is missing from its kernel cache, so a compile holds no
caller's GIL and a process without Python never compiles. Nothing
but the answer reaches stdout: Triton's own prints (and the kernel file's) go to stderr. No torch
is imported here.

Requests (``file``: an absolute path to a ``.py`` file; ``function``: the name of a
``@triton.jit`` function in it, possibly wrapped by ``triton.autotune`` and ``triton.heuristics``):

- ``{"verb": "inspect", "file", "function"}`` -> ``{"ok": true, "triton_version", "function",
  "line" (of its ``def``), "params": [{"name", "constexpr", "annotation", "has_default",
  "default", "do_not_specialize", "do_not_specialize_on_alignment"}], "debug", "wrappers"
  (outermost first, of "autotune" and "heuristics"), "autotune": null | {"configs": [{"kwargs",
  "num_warps", "num_stages", "num_ctas", "maxnreg", "ir_override", "pre_hook"}], "key",
  "reset_to_zero", "restore_value", "prune_configs_by", "early_config_prune", "perf_model",
  "top_k", "pre_hook", "post_hook", "do_bench", "cache_results"}, "heuristics": null | [names],
  "sha256" (of the file's bytes), "sources": [{"path", "sha256"}] (the file, then every module
  it imported from its own folder tree), "jit_cache_key" (Triton's hash of the function's source,
  of the ``@triton.jit`` functions it calls wherever they live, and of the constexpr globals it
  reads)}``.
- ``{"verb": "compile", "file", "function", "target": {"arch": 90, "warp_size": 32}, "ptx":
  false, "variants": [{"signature": {param: type}, "constexprs": {param: value}, "attrs": {param:
  [["tt.divisibility", 16]]}, "options": {"num_warps": 4, ...}, "config": index}]}`` ->
  ``{"ok": true, "triton_version", "sources", "variants": [...]}``, one entry per variant:
  ``{"ok": true, "name", "cubin_b64", "ptx_b64" (when "ptx" is true), "shared", "num_warps",
  "num_ctas", "cluster_dims", "global_scratch_size", "global_scratch_align",
  "profile_scratch_size", "profile_scratch_align", "launch_pdl", "launch_cooperative_grid",
  "tensordesc_meta", "kernel_params": [{"name", "type", "bytes"}], "triton_version", "hash"}`` or
  ``{"ok": false, "error"}``. Types are Triton's (``"*fp16"``, ``"i32"``, ``"fp32"``, ...); a
  constexpr value is a JSON scalar, a string, or ``{"dtype": "bf16"}`` for a ``tl.dtype``; a
  ``tl.constexpr`` parameter left out takes its default. ``config``: the index of an autotune
  config, whose kwargs join the constexprs and whose num_warps, num_stages, num_ctas and maxnreg
  join the options. ``kernel_params`` is checked against the PTX entry's parameter sizes.

A request that cannot be served as a whole (bad JSON, a file that does not import, a missing
function) is answered ``{"ok": false, "error"}``; the process then exits with status 0, and with
status 1 only after an internal error (its traceback goes to stderr).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

#: A kernel parameter's size in the kernel's parameter buffer, by Triton type (pointers: 8). Float
#: scalars travel at their own width (Triton's launcher packs fp16/bf16 into 16 bits, fp32 into
#: 32); a tensor descriptor passed as a TMA descriptor is a 128-byte CUtensorMap.
_PARAM_BYTES = {
    **dict.fromkeys(("i1", "u1", "i8", "u8"), 1),
    **dict.fromkeys(("i16", "u16", "fp16", "bf16"), 2),
    **dict.fromkeys(("i32", "u32", "fp32", "f32"), 4),
    **dict.fromkeys(("i64", "u64", "fp64"), 8),
    "nvTmaDesc": 128,
}


class RequestError(Exception):
    """A request (or a variant of one) the worker refuses; the message is the answer's error."""


def main(argv: list[str] | None = None) -> int:
    """Serves one request from stdin, or with ``--serve`` one request per line until stdin ends
    (an answer per line, flushed); returns the exit status. A request that fails internally
    ends a serving worker with status 1 and no answer (its traceback on stderr)."""
    serve = "--serve" in (sys.argv[1:] if argv is None else argv)
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # fd 1 is stderr from here on: the answer alone goes to the saved stdout
    sys.stdout = sys.stderr
    # The worker compiles for a device: Triton's interpreter mode would replace the functions.
    os.environ.pop("TRITON_INTERPRET", None)
    with os.fdopen(answer_fd, "w") as out:
        requests = iter(sys.stdin.readline, "") if serve else [sys.stdin.read()]
        for text in requests:
            answer, status = _answer(text)
            if serve and status != 0:
                return status
            json.dump(answer, out)
            out.write("\n")
            out.flush()
            if status != 0:
                return status
    return 0


def _answer(text: str) -> tuple[dict, int]:
    """The answer to one request and the exit status it calls for (1 after an internal error)."""
    try:
        return _serve(text), 0
    except RequestError as e:
        return {"ok": False, "error": str(e)}, 0
    except Exception as e:
        traceback.print_exc()
        sys.stderr.flush()
        return {"ok": False, "error": f"internal error in opforge's Triton worker: {type(e).__name__}: {e}"}, 1


def _serve(text: str) -> dict:
    try:
        request = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(f"the request is not JSON: {e}") from None
    if not isinstance(request, dict):
        raise RequestError("the request must be a JSON object")
    verb = request.get("verb")
    if verb not in ("inspect", "compile"):
        raise RequestError(f"unknown verb {verb!r}: expected 'inspect' or 'compile'")
    try:
        import triton
    except ImportError as e:
        raise RequestError(f"Triton is not installed in {sys.executable}: {e}") from None
    kernel = _Kernel(_field(request, "file", str), _field(request, "function", str))
    if verb == "inspect":
        return {"ok": True, "triton_version": triton.__version__, **kernel.describe()}
    target = _field(request, "target", dict)
    arch, warp_size = _field(target, "arch", int), _field({"warp_size": 32, **target}, "warp_size", int)
    variants = _field(request, "variants", list)
    results = [kernel.compile(i, v, arch, warp_size, bool(request.get("ptx"))) for i, v in enumerate(variants)]
    return {"ok": True, "triton_version": triton.__version__, "sources": kernel.sources, "variants": results}


def _field(obj: dict, name: str, kind: type) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {str: "a string", int: "an integer", dict: "an object", list: "a list"}[kind]
        raise RequestError(f"'{name}' must be {expected}, got {json.dumps(value)}")
    return value


class _Kernel:
    """A ``@triton.jit`` function imported from its file, with the wrappers around it.

    Raises:
        RequestError: the file does not exist or does not import (``file:line: Type: message``),
            or it has no ``@triton.jit`` function of that name.
    """

    def __init__(self, file: str, function: str) -> None:
        from triton.runtime.jit import JITFunction

        self.path, self.function = Path(file), function
        if not self.path.is_absolute():
            raise RequestError(f"{file}: the kernel file must be given by an absolute path")
        try:
            before = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as e:
            raise RequestError(f"{file}: cannot read the kernel file: {e.strerror}") from None
        self.module, self.sources = self._import()
        if self.sources[0]["sha256"] != before:
            raise RequestError(f"{file}: the file changed while it was imported; run again")
        obj = self.module.__dict__.get(function)
        if obj is None:
            mine = [(n, _wrappers(v)[0]) for n, v in vars(self.module).items()]
            kernels = [n for n, f in mine if isinstance(f, JITFunction) and f.__module__ == self.module.__name__]
            raise RequestError(f"{file}: no function '{function}' (its @triton.jit functions: {', '.join(kernels)})")
        obj, self.wrappers = _wrappers(obj)
        if not isinstance(obj, JITFunction):
            raise RequestError(f"{file}: '{function}' is not a @triton.jit function (it is a {type(obj).__name__})")
        self.jit = obj

    def _import(self) -> tuple[ModuleType, list[dict]]:
        """The kernel file as a module of a name of its own, imported with its folder on sys.path,
        and the sources it read: the file, then the modules it imported from its folder tree."""
        folder = str(self.path.parent)
        name = "opforge_triton_" + hashlib.sha256(str(self.path).encode()).hexdigest()[:16]
        spec = importlib.util.spec_from_file_location(name, self.path)
        if spec is None or spec.loader is None:
            raise RequestError(f"{self.path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        # A worker serves many requests: the folder's own modules are imported anew each time, so
        # that an edit to a helper is seen and the helpers are found among the new imports.
        for n, m in list(sys.modules.items()):
            if getattr(m, "__file__", None) and _within(m.__file__, self.path.parent):
                del sys.modules[n]
        known = set(sys.modules)
        sys.modules[name] = module
        sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except SyntaxError as e:
            text = f"\n    {e.text.strip()}" if e.text and e.text.strip() else ""
            raise RequestError(f"{e.filename}:{e.lineno}: {type(e).__name__}: {e.msg}{text}") from None
        except Exception as e:
            frames = [f for f in traceback.extract_tb(e.__traceback__) if _within(f.filename, self.path.parent)]
            where = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else f"{self.path}: "
            raise RequestError(f"{where}{type(e).__name__}: {e}") from None
        finally:
            sys.path.remove(folder)
        imported = {Path(m.__file__) for n, m in sys.modules.items() if n not in known and getattr(m, "__file__", None)}
        helpers = sorted(p for p in imported if p != self.path and _within(str(p), self.path.parent))
        sources = [
            {"path": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in [self.path, *helpers]
        ]
        return module, sources

    def describe(self) -> dict:
        """The answer to ``inspect`` (see the module's docstring), less ``ok`` and the version."""
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import get_jit_fn_file_line

        tuner = next((w for w in self.wrappers if isinstance(w, Autotuner)), None)
        heuristics = [w for w in self.wrappers if not isinstance(w, Autotuner)]
        try:
            jit_cache_key = self.jit.cache_key
        except Exception as e:  # what the function refers to cannot be compiled (Triton's check)
            raise RequestError(f"{self.path}: {self.function}: {type(e).__name__}: {e}") from None
        return {
            "function": self.function,
            "line": get_jit_fn_file_line(self.jit)[1],
            "params": [
                {
                    "name": p.name,
                    "constexpr": p.is_constexpr,
                    "annotation": p.annotation,
                    "has_default": p.has_default,
                    "default": _to_json(p.default) if p.has_default else None,
                    "do_not_specialize": p.do_not_specialize,
                    "do_not_specialize_on_alignment": p.do_not_specialize_on_alignment,
                }
                for p in self.jit.params
            ],
            "debug": bool(self.jit.debug),
            "wrappers": ["autotune" if isinstance(w, Autotuner) else "heuristics" for w in self.wrappers],
            "autotune": _describe_autotune(tuner) if tuner else None,
            "heuristics": [name for w in heuristics for name in w.values] if heuristics else None,
            "sha256": self.sources[0]["sha256"],
            "sources": self.sources,
            "jit_cache_key": jit_cache_key,
        }

    def compile(self, index: int, variant: Any, arch: int, warp_size: int, want_ptx: bool) -> dict:
        """Compiles one variant for ``sm_<arch>``; returns its answer entry, ``ok`` or not."""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.compiler.errors import CompilationError

        target = GPUTarget("cuda", arch, warp_size)
        try:
            if not isinstance(variant, dict):
                raise RequestError("a variant must be a JSON object")
            signature, constexprs, attrs, options = self._variant(variant, target)
            kernel = triton.compile(ASTSource(self.jit, signature, constexprs, attrs), target=target, options=options)
            return _compiled(kernel, self._kernel_params(signature, kernel.metadata.tensordesc_meta), want_ptx)
        except RequestError as e:
            return {"ok": False, "error": f"{self.path}: {self.function}, variant {index}: {e}"}
        except CompilationError as e:
            return {"ok": False, "error": _locate(e)}
        except Exception as e:
            where = f"(compiling {self.function} of {self.path} for sm_{arch}, variant {index})"
            return {"ok": False, "error": f"{type(e).__name__}: {e}\n{where}"}

    def _variant(self, variant: dict, target: Any) -> tuple[dict, dict, dict, dict]:
        """The variant as ``ASTSource`` and ``triton.compile`` take it: every parameter typed in
        order (``"constexpr"`` for those with a value), attributes by parameter index."""
        from triton import knobs
        from triton.compiler.compiler import make_backend

        fields = {"signature": {}, "constexprs": {}, "attrs": {}, "options": {}, **variant}
        types, values, attrs, options = (
            dict(_field(fields, f, dict)) for f in ("signature", "constexprs", "attrs", "options")
        )
        values = {k: _from_json(v) for k, v in values.items()}
        if "config" in variant:
            _apply_config(self._config(variant["config"]), values, options)
        params = {p.name: p for p in self.jit.params}
        for given, what in ((types, "signature"), (values, "constexprs"), (attrs, "attrs")):
            unknown = [n for n in given if n not in params]
            if unknown:
                raise RequestError(f"{what} names {', '.join(unknown)}, not parameters of {self.function}")
        signature = {}
        for name, p in params.items():
            if name in values:
                if types.get(name, "constexpr") != "constexpr":
                    raise RequestError(f"parameter '{name}' has both a type and a constexpr value")
                signature[name] = "constexpr"
            elif p.is_constexpr and p.has_default:
                signature[name], values[name] = "constexpr", p.default
            elif p.is_constexpr:
                raise RequestError(f"parameter '{name}' is tl.constexpr and has no value in constexprs")
            elif name not in types:
                raise RequestError(f"parameter '{name}' has no type in signature")
            elif p.annotation_type and types[name] != p.annotation_type:
                raise RequestError(
                    f"parameter '{name}' is annotated {p.annotation_type}, signature gives {types[name]}"
                )
            else:
                signature[name] = _to_tuple(types[name])
        index = {name: i for i, name in enumerate(params)}
        backend = make_backend(target)
        known = {f.name for f in dataclasses.fields(backend.parse_options({}))} - {"arch"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise RequestError(f"unknown options {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        # As JITFunction.run: the function's debug flag, or Triton's, and the instrumentation mode.
        options.setdefault("debug", bool(self.jit.debug) or knobs.runtime.debug)
        options.setdefault("instrumentation_mode", knobs.compilation.instrumentation_mode)
        return signature, values, {(index[name],): value for name, value in attrs.items()}, options

    def _config(self, index: Any) -> Any:
        from triton.runtime.autotuner import Autotuner

        tuner = next((w for w in self.wrappers if isinstance(w, Autotuner)), None)
        if tuner is None:
            raise RequestError(f"'config' given, but {self.function} is not wrapped by triton.autotune")
        if not isinstance(index, int) or not 0 <= index < len(tuner.configs):
            raise RequestError(f"'config' must be an index below {len(tuner.configs)}, got {json.dumps(index)}")
        return tuner.configs[index]

    def _kernel_params(self, signature: dict, tensordesc_meta: list | None) -> list[dict]:
        """The compiled kernel's parameters in order, as Triton's launcher passes them
        (triton/backends/nvidia/driver.py, make_launcher): constexprs are dropped, tuples
        flattened, tensor descriptors expanded, and two pointers appended (global and profile
        scratch; null when the kernel's scratch size is 0)."""
        out: list[tuple[str, str]] = []
        metas = iter(tensordesc_meta or [])
        for name, ty in signature.items():
            if isinstance(ty, str) and ty.startswith("tensordesc"):
                out += _tensordesc_params(name, ty, next(metas, None))
            else:
                out += _flatten(name, ty)
        out += [("global_scratch", "*i8"), ("profile_scratch", "*i8")]
        return [{"name": n, "type": t, "bytes": 8 if t.startswith("*") else _PARAM_BYTES[t]} for n, t in out]


def _describe_autotune(tuner: Any) -> dict:
    return {
        "configs": [
            {
                "kwargs": {k: _to_json(v) for k, v in c.kwargs.items()},
                "num_warps": c.num_warps,
                "num_stages": c.num_stages,
                "num_ctas": c.num_ctas,
                "maxnreg": c.maxnreg,
                "ir_override": c.ir_override,
                "pre_hook": c.pre_hook is not None,
            }
            for c in tuner.configs
        ],
        "key": list(tuner.keys),
        "reset_to_zero": tuner.reset_to_zero,
        "restore_value": tuner.restore_value,
        "prune_configs_by": tuner.early_config_prune is not None or tuner.perf_model is not None,
        "early_config_prune": tuner.early_config_prune is not None,
        "perf_model": tuner.perf_model is not None,
        "top_k": tuner.configs_top_k,
        "pre_hook": tuner.user_defined_pre_hook,
        "post_hook": tuner.user_defined_post_hook,
        "do_bench": tuner._do_bench is not None,
        "cache_results": tuner.cache_results,
    }


def _apply_config(config: Any, values: dict, options: dict) -> None:
    """Merges an autotune config into a variant, as Autotuner.run passes ``config.all_kwargs()``:
    its kwargs become constexprs, num_warps/num_stages/num_ctas/maxnreg/ir_override options."""
    meta = {"num_warps", "num_stages", "num_ctas", "maxnreg", "ir_override"}
    for key, value in config.all_kwargs().items():
        into = options if key in meta else values
        if key in into:
            raise RequestError(f"'{key}' is given by the variant and by autotune config {config}")
        into[key] = value


def _compiled(kernel: Any, params: list[dict], want_ptx: bool) -> dict:
    md = kernel.metadata
    ptx = kernel.asm.get("ptx")
    if ptx is not None:
        entry = _ptx_param_bytes(ptx)
        if entry != [p["bytes"] for p in params]:
            raise RequestError(f"internal: the kernel's PTX parameters (bytes {entry}) differ from {params}")
    elif want_ptx:
        raise RequestError("Triton kept no PTX for this kernel (TRITON_STORE_BINARY_ONLY is set)")
    answer = {
        "ok": True,
        "name": md.name,
        "cubin_b64": base64.b64encode(kernel.asm["cubin"]).decode(),
        "shared": md.shared,
        "num_warps": md.num_warps,
        "num_ctas": md.num_ctas,
        # Triton keeps no cluster shape: its launcher launches clusters of num_ctas x 1 x 1.
        "cluster_dims": [md.num_ctas, 1, 1],
        "global_scratch_size": md.global_scratch_size,
        "global_scratch_align": md.global_scratch_align,
        "profile_scratch_size": md.profile_scratch_size,
        "profile_scratch_align": md.profile_scratch_align,
        "launch_pdl": md.launch_pdl,
        "launch_cooperative_grid": md.launch_cooperative_grid,
        "tensordesc_meta": md.tensordesc_meta,
        "kernel_params": params,
        "triton_version": md.triton_version,
        "hash": md.hash,
    }
    if want_ptx:
        answer["ptx_b64"] = base64.b64encode(ptx.encode()).decode()
    return answer


def _ptx_param_bytes(ptx: str) -> list[int]:
    """The sizes of the ``.entry``'s parameters in a PTX text (``.param .u32 x`` is 4 bytes,
    ``.param .align 2 .b8 x[2]`` 2)."""
    entry = re.search(r"\.entry\s+\w+\s*\(([^)]*)\)", ptx)
    params = re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.[a-z]+(\d+)[^,\[]*?\w+(?:\[(\d+)\])?\s*(?:,|$)", entry[1])
    return [int(bits) // 8 * int(count or 1) for bits, count in params]


def _flatten(name: str, ty: Any) -> list[tuple[str, str]]:
    if isinstance(ty, tuple):
        return [p for i, t in enumerate(ty) for p in _flatten(f"{name}[{i}]", t)]
    return [] if ty == "constexpr" else [(name, ty)]


def _tensordesc_params(name: str, ty: str, meta: dict | None) -> list[tuple[str, str]]:
    """A tensor descriptor parameter as the launcher expands it (driver.py, _expand_signature and
    make_tensordesc_arg): a TMA descriptor where the compiler made one (``meta``), else the base
    pointer, shape and strides as i64 and a padding flag; then shape as i32 and strides as i64."""
    match = re.match(r"tensordesc<([^[>]*)\[([^]]*)\]", ty)
    if match is None:
        raise RequestError(f"parameter '{name}': malformed tensor descriptor type {ty}")
    rank = match[2].count(",") + 1
    shape = [(f"{name}.shape[{i}]", "i32") for i in range(rank)]
    strides = [(f"{name}.strides[{i}]", "i64") for i in range(rank)]
    if meta is not None:
        return [(f"{name}.tma", "nvTmaDesc"), *shape, *strides]
    wide = [(n, "i64") for n, _ in shape]
    return [(f"{name}.base", "*" + match[1]), *wide, *strides, (f"{name}.padding_nan", "i1"), *shape, *strides]


def _locate(error: Any) -> str:
    """A Triton compile error as ``file:line: Type: message``, where the innermost of its chain
    of CompilationErrors (one per call into another ``@triton.jit`` function) points, followed by
    Triton's message and a ``called from file:line`` line per caller."""
    from triton.compiler.errors import CompilationError

    chain = [error]
    while isinstance(chain[-1].__cause__ or chain[-1].__context__, CompilationError):
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    places = _jit_sources()

    def where(e: Any) -> str:
        file, line = places.get(e.src, ("<unknown file>", 1))
        return f"{file}:{line + getattr(e.node, 'lineno', 1) - 1}"

    inner = chain[-1]
    lines = [f"{where(inner)}: {type(inner).__name__}: {inner.error_message or 'error'}", str(inner)]
    lines += [f"called from {where(e)}" for e in reversed(chain[:-1])]
    return "\n".join(lines)


def _jit_sources() -> dict[str, tuple[str, int]]:
    """Every loaded ``@triton.jit`` function's source -> (its file, the line of its ``def``)."""
    from triton.runtime.jit import JITCallable, get_jit_fn_file_line

    places = {}
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            value = _wrappers(value)[0]
            if isinstance(value, JITCallable) and hasattr(value, "raw_src"):
                places.setdefault(value.src, get_jit_fn_file_line(value))
    return places


def _wrappers(obj: Any) -> tuple[Any, list[Any]]:
    """``obj`` without its ``triton.autotune`` and ``triton.heuristics`` wrappers, and those
    wrappers, outermost first."""
    from triton.runtime.jit import JITCallable, KernelInterface

    wrappers = []
    while isinstance(obj, KernelInterface) and not isinstance(obj, JITCallable):
        wrappers.append(obj)
        obj = obj.fn
    return obj, wrappers


def _within(file: str, folder: Path) -> bool:
    return Path(file).is_relative_to(folder)


def _to_tuple(value: Any) -> Any:
    return tuple(_to_tuple(v) for v in value) if isinstance(value, list) else value


def _to_json(value: Any) -> Any:
    """A Python value as the answer carries it: scalars and strings as they are, a ``tl.dtype``
    as ``{"dtype": name}``, a ``tl.constexpr`` as its value, anything else as ``{"repr": ...}``."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tl.dtype):
        return {"dtype": value.name}
    return {"repr": repr(value)}


def _from_json(value: Any) -> Any:
    import triton.language as tl

    if isinstance(value, dict):
        if set(value) != {"dtype"} or not isinstance(value["dtype"], str):
            raise RequestError(f"a constexpr value must be a scalar, a string or {{'dtype': name}}, got {value}")
        return tl.dtype(value["dtype"])
    if isinstance(value, list):
        raise RequestError(f"a constexpr value must be a scalar, a string or {{'dtype': name}}, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
