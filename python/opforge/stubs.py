"""Typed stubs for an op library's ops (``opforge stubs``), so editors complete them.

``torch.ops.<ns>`` is an untyped, dynamic namespace. :func:`write_stubs` writes a module
``<ns>.py`` that is ``torch.ops.<ns>`` at run time (PEP 562 module ``__getattr__``) and a stub
``<ns>.pyi`` beside it with each op's signature and docstring, derived from the op's
description (the same one its torch schema comes from)::

    opforge stubs build/lib/libsoftshrink.so -o typed_ops
    # then, with typed_ops/ importable:
    from typed_ops import examples
    y = examples.softshrink(x, lambd=0.5)      # same object as torch.ops.examples.softshrink

Each op is typed as a class with ``__call__`` and ``default`` (the op's overload) and, for an op
that has one, ``out`` (its out= overload), as ``torch.ops.<ns>.<op>.default`` / ``.out`` are.
"""

from __future__ import annotations

import keyword
from pathlib import Path

from .description import REQUIRED, Library, Op, Param, TensorArg

#: Python annotations of the description's parameter types.
_PARAM_TYPES = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "int[]": "Sequence[int]",
    "float[]": "Sequence[float]",
}


def _default(p: Param) -> str:
    value = p.default
    if isinstance(value, float) and value != value:
        return "float('nan')"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "float('inf')" if value > 0 else "-float('inf')"
    return repr(list(value) if isinstance(value, (list, tuple)) else value)


def _parameters(op: Op, *, out: bool) -> str:
    parts = ["self"]
    for a in op.args:
        if isinstance(a, TensorArg):
            text = f"{a.name}: Tensor" + (" | None" if a.optional else "") + (" = None" if a.default_none else "")
        else:
            annotation = _PARAM_TYPES[a.type]
            text = f"{a.name}: {annotation}" + (f" = {_default(a)}" if a.default is not REQUIRED else "")
        parts.append(text)
    if out:
        parts.append("*")
        parts += [f"{o.name}: Tensor" for o in op.outputs]
    return ", ".join(parts)


def _returns(op: Op) -> str:
    if not op.outputs:
        return "None"
    # An output that exists only with an optional input (schema `Tensor?`) may be None.
    types = ["Tensor | None" if o.present_with is not None else "Tensor" for o in op.outputs]
    return types[0] if len(types) == 1 else "tuple[" + ", ".join(types) + "]"


def _dtypes(op: Op) -> str:
    """Each tensor input's dtype rule, as "x: float32 | float16; bias: the dtype of x" (dtypes
    named as torch names them, float8_e4m3fn included)."""
    rules = []
    for a in op.tensors:
        rule = _dtype_rule(a.dtypes, a.same_dtype, a.dtype_alternatives)
        if a.dtype_cases:  # a rule that follows a parameter: "a where p is 'v', else b"
            cases = [
                f"{_dtype_rule(c.dtypes, c.same_dtype, c.dtype_alternatives)} where {c.param} is {c.value!r}"
                for c in a.dtype_cases
            ]
            rule = ", ".join(cases) + f", else {rule}"
        rules.append(f"{a.name}: {rule}")
    for o in op.outputs:  # an output's dtype rule that follows a parameter
        ruled = [c for c in o.cases if c.dtype is not None or c.dtype_like is not None]
        if ruled:
            text = ", ".join(
                f"{_dtype_rule((c.dtype,), c.dtype_like, ())} where {c.param} is {c.value!r}" for c in ruled
            )
            rules.append(f"{o.name}: {text}, else {_dtype_rule((o.dtype,), o.dtype_like, ())}")
    return "; ".join(rules)


def _shapes(op: Op) -> str:
    """The shape rules that follow a parameter, of inputs and outputs, as "scale: [x.size(0), 1]
    where per_token is True, else [1]" ("" for an op without them)."""

    def rule(shape, leading: bool) -> str:
        return "[" + ", ".join((["*"] if leading else []) + list(shape)) + "]"

    rules = []
    for name, cases, otherwise, leading in [
        *((a.name, a.shape_cases, a.shape or (), a.leading_dims) for a in op.tensors),
        *((o.name, o.cases, o.shape, False) for o in op.outputs),
    ]:
        ruled = [c for c in cases if c.shape is not None]
        if ruled:
            text = ", ".join(f"{rule(c.shape, c.leading_dims)} where {c.param} is {c.value!r}" for c in ruled)
            rules.append(f"{name}: {text}, else {rule(otherwise, leading)}")
    return "; ".join(rules)


def _dtype_rule(dtypes: tuple[str, ...], same_dtype: str | None, alternatives: tuple[str, ...]) -> str:
    """One dtype rule as stubs show it: "float32 | float16" or "the dtype of x | float32"."""
    if same_dtype is None:
        return " | ".join(dtypes)
    return f"the dtype of {same_dtype}" + "".join(f" | {d}" for d in alternatives)


def _doc(op: Op, schema: str) -> str:
    text = (op.doc or op.name).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return (
        f'"""{text}\n\n        Schema: ``{schema}``. Declared at {Path(op.file).name}:{op.line}.\n'
        f"        Dtypes: {_dtypes(op)}.\n"
        + (f"        Shapes: {_shapes(op)}.\n" if _shapes(op) else "")
        + '        """'
    )


def _op_stub(op: Op) -> str:
    short = op.name.split("::", 1)[1]
    lines = [f"class _{short}:"]
    overloads = [("__call__", op.schema, False), ("default", op.schema, False)]
    if op.out_schema is not None:
        overloads.append(("out", op.out_schema, True))
    for method, schema, out in overloads:
        lines.append(f"    def {method}({_parameters(op, out=out)}) -> {_returns(op)}:")
        lines.append(f"        {_doc(op, schema)}")
        lines.append("        ...")
    lines.append("")
    lines.append(f"{short}: _{short}")
    return "\n".join(lines)


def stub_text(namespace: str, ops: list[Op]) -> str:
    """The ``.pyi`` text for the ops of one namespace."""
    body = "\n\n".join(_op_stub(op) for op in ops)
    return (
        f'"""Typed ops of torch.ops.{namespace} (written by `opforge stubs`; do not edit)."""\n\n'
        "from collections.abc import Sequence\n\nfrom torch import Tensor\n\n"
        f"__all__ = {[op.name.split('::', 1)[1] for op in ops]!r}\n\n"
        f"{body}\n"
    )


def module_text(namespace: str) -> str:
    """The run-time ``.py`` text: the module is a view of ``torch.ops.<namespace>``."""
    return (
        f'"""torch.ops.{namespace}, typed by {namespace}.pyi beside this file (written by `opforge stubs`)."""\n\n'
        "import torch\n\n\n"
        "def __getattr__(name: str):\n"
        f"    return getattr(torch.ops.{namespace}, name)\n"
    )


def write_stubs(library: Library, out_dir: str | Path) -> list[Path]:
    """Write ``<ns>.py`` and ``<ns>.pyi`` into ``out_dir`` for each namespace of ``library``.

    The run-time module needs the library loaded (:func:`opforge.load_library`) before its ops
    are used, like ``torch.ops.<ns>`` itself.

    Args:
        library: a loaded (or described) op library.
        out_dir: folder to write into (created).

    Returns:
        The paths written.

    Raises:
        ValueError: a namespace is a Python keyword or not an identifier, so no module can carry it.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_namespace: dict[str, list[Op]] = {}
    for op in library.ops:
        by_namespace.setdefault(op.name.split("::", 1)[0], []).append(op)
    written = []
    for namespace, ops in sorted(by_namespace.items()):
        if not namespace.isidentifier() or keyword.iskeyword(namespace):
            raise ValueError(f"opforge stubs: namespace {namespace!r} cannot be a Python module name")
        for suffix, text in ((".pyi", stub_text(namespace, ops)), (".py", module_text(namespace))):
            path = out / f"{namespace}{suffix}"
            path.write_text(text)
            written.append(path)
    return written
