"""The typed description of op libraries: what each op declares, as libopforge_core describes it.

Every Python module of opforge reads op declarations through these classes; none parses the
library JSON itself, and none evaluates a rule: shape rules, output shapes, example sizes and
sharding follow dims are evaluated by the core (:mod:`opforge._core`), which also computes the
derived facts held here (``multiple_of``, ``follows``, ``unshardable_dims``). The JSON format is
documented in ``src/core/description.h``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: A parameter without a default (its :attr:`Param.default`).
REQUIRED = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()


def _float(value) -> float:
    """A JSON float: a number, or "inf", "-inf", "nan" (which JSON cannot hold)."""
    return float(value)


@dataclass(frozen=True)
class ValueDomain:
    """The values an integer input takes (Note [Value domains]): each element in [low, high)
    (expressions, as text) or the ``sentinel`` marker; distinct if ``unique``."""

    low: str
    high: str
    unique: bool
    sentinel: int | None


@dataclass(frozen=True)
class Rule:
    """A cross-argument rule (``.require(...)``): its ``text`` ("x.size(-1) % block == 0") and its
    comparison ``op`` ("==")."""

    text: str
    op: str


@dataclass(frozen=True)
class ParamDtypeRule:
    """A tensor input's dtype rule where a parameter has one value (``opforge::when(param,
    value, rule)``; Note [Rules that follow a parameter] in ``include/opforge/op_constraints.h``).

    Attributes:
        param: the parameter's name; value: its value (str, int or bool).
        dtypes, same_dtype, dtype_alternatives: the rule, as :class:`TensorArg`'s fields.
    """

    param: str
    value: object
    dtypes: tuple[str, ...]
    same_dtype: str | None
    dtype_alternatives: tuple[str, ...]


@dataclass(frozen=True)
class ParamCase:
    """A shape rule (of a tensor input or an output), or an output's dtype rule, where a parameter
    has one value (``opforge::when(param, value, opforge::shape({...}))``; Note [Rules that follow a
    parameter] in ``include/opforge/op_constraints.h``).

    Attributes:
        param: the parameter's name; value: its value (str, int or bool).
        shape: per dim the rule's text, or None for a case that rules the dtype only;
            leading_dims: ``shape`` rules the last dims.
        dtype, dtype_like: an output's dtype rule in this case (a dtype name, or the input whose
            dtype it takes), both None for a case that rules the shape only.
    """

    param: str
    value: object
    shape: tuple[str, ...] | None
    leading_dims: bool
    dtype: str | None
    dtype_like: str | None


def _cases(cases: list[dict]) -> tuple[ParamCase, ...]:
    return tuple(
        ParamCase(
            c["param"],
            c["value"],
            tuple(c["shape"]) if c["shape"] is not None else None,
            c["leading_dims"],
            c["dtype"],
            c["dtype_like"],
        )
        for c in cases
    )


@dataclass(frozen=True)
class TensorArg:
    """A tensor input.

    Attributes:
        name, index: the argument's name and position in the schema.
        dtypes: allowed dtype names ("float32", "bfloat16", ...).
        same_dtype, same_shape: the input (declared before or after) whose dtype or shape this one
            must have.
        dtype_alternatives: with ``same_dtype``, the dtypes also accepted whatever that input's
            (``same_dtype("x") | kFloat32``).
        dtype_cases: the rules where a parameter has a value (:class:`ParamDtypeRule`); ``dtypes``,
            ``same_dtype`` and ``dtype_alternatives`` are then the rule of every other value.
        min_rank, max_rank: rank bounds (-1: none).
        leading_dims: ``shape`` rules the last dims, after any number of leading ones.
        leading_dims_of: the input whose leading dims this one's equal
            (``shape({leading_dims_of("x"), ...})``), or None.
        layout: "contiguous" (kernels get a dense, 16-byte aligned view), "strided" (any view),
            or "contiguous_last_dim" (rows of adjacent elements at 16-byte aligned strides).
        optional: the caller may pass None (``Tensor? name``).
        default_none: an optional input that the caller may leave out (``Tensor? name=None``): only
            arguments with defaults follow it; one before a required argument is passed, None or not.
        mutated: the kernel writes it in place (``Tensor(a!) name``; Note [Mutated inputs]).
        values: the values of an integer input that indexes something, or None.
        shape: per dim the rule's text ("*", "x.size(-1)", "multiple of 4"), or None.
        shape_cases: the shape rules where a parameter has a value (:class:`ParamCase`); ``shape``
            is then the rule of every other value.
        multiple_of: {dim: k} for dims declared ``opforge::multiple_of(k)``.
        follows: {dim of the first tensor input: this input's dim} for ops sharded by dims.
    """

    name: str
    index: int
    dtypes: tuple[str, ...]
    same_dtype: str | None
    dtype_alternatives: tuple[str, ...]
    dtype_cases: tuple[ParamDtypeRule, ...]
    same_shape: str | None
    min_rank: int
    max_rank: int
    leading_dims: bool
    leading_dims_of: str | None
    layout: str
    optional: bool
    default_none: bool
    mutated: bool
    values: ValueDomain | None
    shape: tuple[str, ...] | None
    multiple_of: dict[int, int]
    follows: dict[int, int]
    shape_cases: tuple[ParamCase, ...] = ()

    kind = "tensor"
    type = "Tensor"


@dataclass(frozen=True)
class Param:
    """A parameter (int, float, bool, str, int[], float[]).

    Attributes:
        name, index: the argument's name and position in the schema.
        type: the schema type ("int", "float", "bool", "str", "int[]", "float[]").
        default: the declared default as a Python value, or :data:`REQUIRED`.
        min, max: inclusive bounds of numeric parameters (per element for lists), or None.
        choices: the allowed values, or None.
        compile_time: a template argument of the op's run-time kernels.
    """

    name: str
    index: int
    type: str
    default: object
    min: float | None
    max: float | None
    choices: tuple | None
    compile_time: bool

    kind = "param"

    @property
    def has_default(self) -> bool:
        return self.default is not REQUIRED


Arg = TensorArg | Param


@dataclass(frozen=True)
class Output:
    """An output: its dtype rule (a fixed ``dtype`` or ``dtype_like`` an input) and shape rule
    (``like`` an input with ``with_dims`` replaced, or an explicit ``shape``), as text.
    ``present_with``: the optional input whose rules its rules read; the output is None in calls
    that leave that input out. ``size_from``: the 0-dim int64 output whose value is this output's
    first dim (a data-dependent size). ``cases``: its shape and dtype rules where a parameter has
    a value (:class:`ParamCase`); ``shape``, ``dtype`` and ``dtype_like`` are then the rules of every
    other value."""

    name: str
    dtype: str | None
    dtype_like: str | None
    like: str | None
    present_with: str | None
    size_from: str | None
    shape: tuple[str, ...]
    with_dims: dict[int, str]
    cases: tuple[ParamCase, ...] = ()


@dataclass(frozen=True)
class RuntimeKernel:
    """A run-time kernel: its file (in the library's kernel folder), its name (a CUDA name
    template, a Triton function's name, or a prebuilt kernel's symbol) and how it is made:
    ``"nvrtc"`` (CUDA C++), ``"triton"`` (Note [Triton kernels] in ``opforge/op_launch.h``) or
    ``"binary"`` (a prebuilt cubin, fatbin or PTX file: Note [Prebuilt kernels]);
    ``checks_values``: the kernel checks its indices itself (``.checks_values_in_kernel()``), so
    device calls launch no separate value check."""

    source: str
    name: str
    backend: str = "nvrtc"
    checks_values: bool = False


@dataclass(frozen=True)
class Op:
    """One op's declaration.

    Attributes:
        name: "ns::op". schema: the torch schema with namespace; out_schema: its out= overload's
            (None for an op without outputs). doc: the one-line description.
        file, line: where it was declared.
        equivalent: the torch expression verify compares the CPU reference with, or None.
        backward: the op that computes its input gradients, or None. is_backward_op: another
            op names this one.
        backward_sources: per argument of the backward op, where its value comes from (the
            core's BackwardPlan): ("grad", k) the gradient of result k, ("arg", i) argument i,
            ("result", k) result k, where the results are the outputs, then the values after
            the op of the mutated inputs. backward_gradients: per output of the backward op, the
            argument indices it is the gradient of (several for ``grad_<a>_and_<b>``).
            differentiable_results: per result, whether the backward op takes its gradient; a
            result whose gradient it does not take is not differentiable (empty without one).
        autocast: the policy under torch.autocast: "none", "float32", "lower_precision" or
            "promote" (opforge::Autocast).
        tolerances: {dtype: (atol, rtol)} the op declares for opforge verify
            (``.tolerance()``), where its arithmetic is looser than the dtype's defaults.
        tolerance_vs_equivalent: where a device kernel misses those, verify still passes an
            output whose largest error is at most this many times that of ``equivalent`` run
            in the case's own dtypes (``.tolerance_vs_equivalent()``), or None.
        sharding: "none", "pointwise", "rowwise" or "dims"; sharding_dims: the first tensor
            input's dims for "dims"; unshardable_dims: dims (from the end) never sharded.
        batchable: the inputs a batching transform may give a leading batch dim for one call
            (the first tensor input and those same_shape of it; core::batchable_args), empty
            when it must call the op once per batch element.
        rules: the cross-argument rules every call must satisfy.
        args: inputs and parameters in schema order. outputs. devices: "cpu", "cuda".
        runtime_kernels.
        dtype_combinations: every dtype assignment of the tensor inputs the dtype rules accept
            ({name: dtype}, optional inputs included), computed by the core: those the CPU
            reference takes.
        dtype_combinations_on: by device ("cpu", "cuda"), those of ``dtype_combinations`` the
            device's kernel takes (fewer where it declares ``kernel_dtypes()``).
    """

    name: str
    schema: str
    out_schema: str | None
    doc: str
    file: str
    line: int
    equivalent: str | None
    backward: str | None
    backward_sources: tuple[tuple[str, int], ...]
    backward_gradients: tuple[tuple[int, ...], ...]
    differentiable_results: tuple[bool, ...]
    is_backward_op: bool
    autocast: str
    tolerances: dict[str, tuple[float, float]]
    tolerance_vs_equivalent: float | None
    sharding: str
    sharding_dims: tuple[int, ...]
    unshardable_dims: frozenset[int]
    batchable: tuple[str, ...]
    rules: tuple[Rule, ...]
    args: tuple[Arg, ...]
    outputs: tuple[Output, ...]
    devices: tuple[str, ...]
    runtime_kernels: tuple[RuntimeKernel, ...]
    dtype_combinations: tuple[dict[str, str], ...]
    dtype_combinations_on: dict[str, tuple[dict[str, str], ...]]

    @property
    def backward_targets(self) -> tuple[int, ...]:
        """The argument indices the backward op gives gradients for, in its outputs' order."""
        return tuple(i for targets in self.backward_gradients for i in targets)

    @property
    def tensors(self) -> list[TensorArg]:
        """The tensor inputs, in schema order."""
        return [a for a in self.args if isinstance(a, TensorArg)]

    @property
    def mutated(self) -> list[TensorArg]:
        """The tensor inputs the op writes in place."""
        return [a for a in self.args if isinstance(a, TensorArg) and a.mutated]

    @property
    def params(self) -> list[Param]:
        """The parameters, in schema order."""
        return [a for a in self.args if isinstance(a, Param)]

    def arg(self, name: str) -> Arg:
        """The argument called ``name``. Raises KeyError."""
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(f"{self.name} has no argument {name!r}")


@dataclass(frozen=True)
class Field:
    """One field of a custom class's objects: ``kind`` is "Tensor" or a parameter's schema type
    ("int", "float", "bool", "str", "int[]", "float[]"); ``optional``: a tensor that may be None."""

    name: str
    kind: str
    optional: bool = False


@dataclass(frozen=True)
class Method:
    """A method of a custom class: it runs ``op`` ("ns::name") with ``bound[i]`` (a field's
    name) as the op's argument i, or the caller's next argument where ``bound[i]`` is None."""

    name: str
    op: str
    bound: tuple[str | None, ...]


@dataclass(frozen=True)
class CustomClass:
    """A custom class (Note [Custom classes] in ``opforge/op_class.h``), ``torch.classes.<ns>.<Name>``
    once loaded: the object's ``fields``, its ``methods``, and the ``constructor`` op its
    ``__init__`` runs (or None: ``__init__`` takes the fields)."""

    name: str
    qualified_name: str
    doc: str | None
    file: str
    line: int
    constructor: str | None
    fields: tuple[Field, ...]
    methods: tuple[Method, ...]


@dataclass(frozen=True)
class Library:
    """A loaded op library.

    Attributes:
        path: the shared object's resolved path.
        kernel_dir: the folder its run-time kernel sources are read from
            (``lib<name>.kernels/`` beside the shared object), or None.
        ops: its ops' declarations.
        classes: its custom classes' declarations.
    """

    path: Path
    ops: tuple[Op, ...]
    kernel_dir: Path | None = None
    classes: tuple[CustomClass, ...] = ()

    @property
    def op_names(self) -> list[str]:
        """Qualified op names, e.g. ``["examples::softshrink"]``."""
        return [op.name for op in self.ops]


def _param_value(kind: str, value):
    if kind == "float":
        return _float(value)
    if kind == "float[]":
        return [_float(v) for v in value]
    if kind == "int[]":
        return list(value)
    return value


def _arg(index: int, a: dict) -> Arg:
    if a["kind"] == "tensor":
        return TensorArg(
            name=a["name"],
            index=index,
            dtypes=tuple(a["dtypes"]),
            same_dtype=a["same_dtype"],
            dtype_alternatives=tuple(a["dtype_alternatives"]),
            dtype_cases=tuple(
                ParamDtypeRule(
                    c["param"], c["value"], tuple(c["dtypes"]), c["same_dtype"], tuple(c["dtype_alternatives"])
                )
                for c in a["dtype_cases"]
            ),
            same_shape=a["same_shape"],
            min_rank=a["min_rank"],
            max_rank=a["max_rank"],
            leading_dims=a["leading_dims"],
            leading_dims_of=a["leading_dims_of"],
            layout=a["layout"],
            optional=a["optional"],
            default_none=a["default_none"],
            mutated=a["mutated"],
            values=ValueDomain(**a["values"]) if a["values"] is not None else None,
            shape=tuple(a["shape"]) if a["shape"] is not None else None,
            multiple_of={d: k for d, k in a["multiple_of"]},
            follows={d: j for d, j in a["follows"]},
            shape_cases=_cases(a["shape_cases"]),
        )
    kind = a["type"]
    return Param(
        name=a["name"],
        index=index,
        type=kind,
        default=_param_value(kind, a["default"]) if "default" in a else REQUIRED,
        min=_float(a["min"]) if "min" in a else None,
        max=_float(a["max"]) if "max" in a else None,
        choices=tuple(a["choices"]) if a["choices"] is not None else None,
        compile_time=a["compile_time"],
    )


def _op(o: dict) -> Op:
    return Op(
        name=o["name"],
        schema=o["schema"],
        out_schema=o["out_schema"],
        doc=o["doc"],
        file=o["file"],
        line=o["line"],
        equivalent=o["equivalent"],
        backward=o["backward"],
        backward_sources=tuple((kind, index) for kind, index in o["backward_sources"]),
        backward_gradients=tuple(tuple(g) for g in o["backward_gradients"]),
        differentiable_results=tuple(o["differentiable_results"]),
        is_backward_op=o["is_backward_op"],
        autocast=o["autocast"],
        tolerances={dtype: (atol, rtol) for dtype, (atol, rtol) in o["tolerances"].items()},
        tolerance_vs_equivalent=o["tolerance_vs_equivalent"],
        sharding=o["sharding"],
        sharding_dims=tuple(o["sharding_dims"]),
        unshardable_dims=frozenset(o["unshardable_dims"]),
        batchable=tuple(o["batchable"]),
        rules=tuple(Rule(**r) for r in o["rules"]),
        args=tuple(_arg(i, a) for i, a in enumerate(o["args"])),
        outputs=tuple(
            Output(
                name=x["name"],
                dtype=x["dtype"],
                dtype_like=x["dtype_like"],
                like=x["like"],
                present_with=x["present_with"],
                size_from=x["size_from"],
                shape=tuple(x["shape"]),
                with_dims={d: t for d, t in x["with_dims"]},
                cases=_cases(x["cases"]),
            )
            for x in o["outputs"]
        ),
        devices=tuple(o["devices"]),
        runtime_kernels=tuple(
            RuntimeKernel(k["source"], k["name"], k.get("backend", "nvrtc"), k.get("checks_values", False))
            for k in o["runtime_kernels"]
        ),
        dtype_combinations=tuple(o["dtype_combinations"]),
        dtype_combinations_on={d: tuple(cs) for d, cs in o["dtype_combinations_on"].items()},
    )


def library_from_json(path: Path, description: dict) -> Library:
    """The :class:`Library` at ``path`` from its JSON description (``src/core/description.h``)."""
    kernel_dir = description["kernel_dir"]
    classes = tuple(
        CustomClass(
            name=c["name"],
            qualified_name=c["qualified_name"],
            doc=c["doc"],
            file=c["file"],
            line=c["line"],
            constructor=c["constructor"],
            fields=tuple(Field(f["name"], f["kind"], f["optional"]) for f in c["fields"]),
            methods=tuple(Method(m["name"], m["op"], tuple(m["bound"])) for m in c["methods"]),
        )
        for c in description.get("classes", ())
    )
    return Library(
        path=path,
        ops=tuple(_op(o) for o in description["ops"]),
        kernel_dir=Path(kernel_dir) if kernel_dir else None,
        classes=classes,
    )


#: Namespaces of torch's own operators: doctor treats ops of any other as custom, and
#: ``opforge new`` refuses them for new ops.
TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "torch", "_c10d_functional", "c10d", "profiler", "inductor"})
