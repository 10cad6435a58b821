"""An op of a loaded op library as a JAX function.

Calling ``ops.<ns>.<op>(*args, **kwargs)`` binds the arguments by the op's schema (names,
order, defaults), asks the core for the outputs' shapes and dtypes (``_core.output_shapes``: the
checks and messages of a PyTorch call, raised at trace time) and calls the op's XLA FFI target
through ``jax.ffi.ffi_call`` with the call frame of Note [The JAX call frame] in
``src/jax/ffi_handlers.cpp``. Parameters are static: each distinct set of parameter values is
its own function, cached.

The function is a ``jax.custom_vjp`` of a ``jax.custom_batching.custom_vmap`` of the ffi_call:

- **grad**: the op's backward op computes the input gradients, its arguments taken from the
  forward call as the core's backward plan says (``Op.backward_sources``, ``Op.backward_gradients``);
  an op without one raises when a gradient must flow through it. A result whose gradient the
  backward op does not take (``Op.differentiable_results``) is not differentiable: its cotangent
  is stopped (``jax.lax.stop_gradient``), where torch records no history for it.
- **vmap**: when only the inputs the core calls batchable (``Op.batchable``) are batched, one
  call with the batch as one more leading dim (unbatched batchable inputs broadcast to it);
  otherwise one call per batch element (``jax.lax.map``). Nested vmap applies the rule per level.

Results: each output (None for one that exists only with an optional input the call left out),
then each written input's value after the op (an op that writes in place returns the new value,
as JAX arrays are immutable); one result alone is returned as itself, several as a tuple.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _core
from ..description import REQUIRED, Op, Param, TensorArg
from ._adapter import target_name

#: Whether this jax's ShapeDtypeStruct takes the manual-axis type of jax.shard_map's values.
_MANUAL_AXIS_TYPE = "manual_axis_type" in inspect.signature(jax.ShapeDtypeStruct).parameters


def _result_type(shape, dtype, like) -> jax.ShapeDtypeStruct:
    """A result's type. Inside ``jax.shard_map`` a result varies over the mesh axes its inputs vary
    over (their manual-axis type, which ffi_call requires to agree among them); without it,
    shard_map would take the result for replicated and a gradient would not type-check."""
    t = jax.typeof(like) if like is not None and _MANUAL_AXIS_TYPE else None
    mat = getattr(t, "mat", None)
    if mat is None or not mat.varying:
        return jax.ShapeDtypeStruct(shape, dtype)
    sharding = jax.sharding.NamedSharding(t.sharding.mesh, jax.sharding.PartitionSpec())
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding, manual_axis_type=mat)


#: Attribute names of the call frame itself, which a parameter may not take.
_FRAME_ATTRIBUTES = ("opforge_op", "opforge_absent")


#: Python types a parameter's value may have, by the parameter's schema type (None: its default).
_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _static(value: Any, op: Op, param: Param) -> Any:
    """A parameter's value as the plain Python value the core checks: numpy and concrete JAX
    scalars and arrays unwrapped; None stays None (the declared default).

    Raises:
        TypeError: the value is traced (parameters are static attributes of the call).
        ValueError: a value no parameter of that type takes (a complex number, bytes, a dict, an
            int past int64), in the message shape of the core's checks.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{op.name}: parameter {param.name} is static (an attribute of the call); got a traced value, "
            "pass a Python value (or mark it static in jax.jit)"
        )
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        value = np.asarray(value).tolist()
    elif isinstance(value, (tuple, range)):
        value = list(value)
    if value is None:
        return None
    element = param.type.removesuffix("[]")
    items = value if param.type.endswith("[]") and isinstance(value, list) else [value]
    ok = (isinstance(value, list) or not param.type.endswith("[]")) and all(
        isinstance(v, _SCALARS[element]) and not (isinstance(v, int) and not -(2**63) <= v < 2**63) for v in items
    )
    if not ok:
        raise ValueError(
            f"{op.schema}: invalid arguments\n  {param.name}: expected a value of type {param.type}, "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def _key(value: Any) -> tuple:
    """A cache key that tells apart what == does not: 0.0 and -0.0, True and 1, 1 and 1.0."""
    if isinstance(value, list):
        return ("list", tuple(_key(v) for v in value))
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


def _value(key: tuple) -> Any:
    """The value :func:`_key` made ``key`` from."""
    kind, v = key
    if kind == "list":
        return [_value(e) for e in v]
    return float.fromhex(v) if kind == "float" else v


def _attribute(param: Param, value: Any) -> Any:
    """A checked parameter value as the XLA attribute the handler reads (int64, float64, bool,
    string, dense int64 or float64 arrays)."""
    if param.type == "int":
        return np.int64(value)
    if param.type == "float":
        return np.float64(value)
    if param.type == "bool":
        return np.bool_(value)
    if param.type == "int[]":
        return np.asarray(value, dtype=np.int64).reshape(-1)
    if param.type == "float[]":
        return np.asarray(value, dtype=np.float64).reshape(-1)
    return str(value)


def _device(tensors) -> str:
    """The device name the core's checks get for a call on `tensors`: that of the first concrete
    array's devices (XLA runs a call on committed arrays where they live, as on the CPU of a
    machine whose default backend is a GPU), else, for arrays being traced, that of JAX's
    default device (``jax.default_device``) or default backend."""
    for t in tensors:
        if isinstance(t, jax.Array) and not isinstance(t, jax.core.Tracer):
            return "cpu" if all(d.platform == "cpu" for d in t.devices()) else "cuda"
    default = jax.config.jax_default_device
    platform = getattr(default, "platform", default) or jax.default_backend()
    return "cpu" if platform == "cpu" else "cuda"


class JaxOp:
    """``ns::op`` as a JAX function (see the module docstring). Its signature is the op's schema:
    tensor inputs take arrays (anything ``jnp.asarray`` takes; None for an optional one left out),
    parameters Python values, with the declared defaults."""

    def __init__(self, op: Op, resolve) -> None:
        """``resolve(name)`` returns the :class:`JaxOp` of another loaded op (the backward op)."""
        self.op = op
        self._resolve = resolve
        clash = [p.name for p in op.params if p.name in _FRAME_ATTRIBUTES]
        if clash:
            raise ValueError(f"opforge.jax: {op.name}: a parameter may not be called {clash[0]} (the call frame's own)")
        parameters = []
        for a in op.args:
            default = inspect.Parameter.empty
            if isinstance(a, TensorArg) and a.default_none:
                default = None
            elif isinstance(a, Param) and a.default is not REQUIRED:
                default = a.default
            parameters.append(inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
        self.__signature__ = inspect.Signature(parameters)
        self.__name__ = op.name.split("::")[1]
        self.__qualname__ = op.name
        self.__doc__ = f"{op.schema}\n\n{op.doc}"

    def __repr__(self) -> str:
        return f"<opforge.jax op {self.op.schema}>"

    def __call__(self, *args, **kwargs):
        op = self.op
        dynamic = [o.name for o in op.outputs if o.size_from]
        if dynamic:
            raise NotImplementedError(
                f"opforge.jax: {op.name}: the sizes of its outputs {', '.join(dynamic)} depend on the input values "
                "(opforge::size_of), and XLA needs every shape when it traces"
            )
        try:
            bound = self.__signature__.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{op.schema}: {e}") from None
        bound.apply_defaults()
        tensors, present, params = [], [], {}
        for a in op.args:
            value = bound.arguments[a.name]
            if isinstance(a, Param):
                params[a.name] = _static(value, op, a)
            elif value is None:
                present.append(False)
            else:
                present.append(True)
                tensors.append(value if isinstance(value, jax.Array) else jnp.asarray(value))
        device = _device(tensors)  # where the call runs; its traced checks assume the same
        outs = _check(op, params, tuple(present), tensors, device)  # every check, before anything is built
        params_key = tuple((k, _key(v)) for k, v in params.items())
        flat = list(_function(self, params_key, tuple(present), device)(*tensors))
        results = [None if o is None else flat.pop(0) for o in outs] + flat  # then the written inputs
        return results[0] if len(results) == 1 else tuple(results)


def _check(op: Op, params: dict, present: tuple[bool, ...], tensors, device: str) -> list[dict | None]:
    """The outputs' specs for a call on `device` ("cpu" or "cuda", :func:`_device`) (the core's
    output_shapes: every check of the call), None for an output the call does not have.

    Raises:
        ValueError: the call's check fails, with the message a PyTorch call gives.
        NotImplementedError: a symbolic dim (jax.export shape polymorphism).
    """
    avals = []
    for a, t in zip((a for a, here in zip(op.tensors, present, strict=True) if here), tensors, strict=True):
        if not all(isinstance(d, (int, np.integer)) for d in t.shape):
            raise NotImplementedError(
                f"opforge.jax: {op.name}: {a.name} has the symbolic shape {tuple(t.shape)}; opforge evaluates shape "
                "rules on concrete sizes under JAX (export with concrete shapes)"
            )
        avals.append((str(jnp.dtype(t.dtype)), tuple(int(d) for d in t.shape)))
    params_key = tuple((k, _key(v)) for k, v in params.items())
    names = tuple(a.name for a in op.tensors)
    return _checked(op.name, names, params_key, present, tuple(avals), device)


@functools.lru_cache(maxsize=4096)
def _checked(
    name: str, tensors: tuple[str, ...], params_key: tuple, present: tuple[bool, ...], avals: tuple, device: str
) -> list[dict | None]:
    """:func:`_check`, once per op, parameter values, input shapes and dtypes (a failing check is
    not cached: it raises every time)."""
    args = {k: _value(v) for k, v in params_key}  # None: the default, which the core applies
    it = iter(avals)
    for tensor, here in zip(tensors, present, strict=True):
        dtype, shape = next(it) if here else (None, None)
        args[tensor] = {"dtype": dtype, "shape": list(shape), "device": device} if here else None
    return _core.output_shapes(name, args)


def _result_index(op: Op, outs: list[dict | None], present: tuple[bool, ...]) -> dict[int, int]:
    """Result k in the core's order (outputs, then mutated inputs) -> its position in the flat
    results of a call (absent outputs and left-out written inputs have none)."""
    index, position = {}, 0
    for k, o in enumerate(outs):
        if o is not None:
            index[k] = position
            position += 1
    k = len(outs)
    for a, here in zip(op.tensors, present, strict=True):
        if a.mutated:
            if here:
                index[k] = position
                position += 1
            k += 1
    return index


@functools.lru_cache(maxsize=4096)
def _function(jop: JaxOp, params_key: tuple, present: tuple[bool, ...], device: str):
    """The JAX function of one op and set of static parameter values for calls on `device`, whose
    traced arrays are checked for it: jit(custom_vjp(custom_vmap(ffi_call)))."""
    op = jop.op
    params = {k: _value(v) for k, v in params_key}
    # A parameter left at None is no attribute: the handler takes its default, as the core did.
    attrs = {p.name: _attribute(p, params[p.name]) for p in op.params if params[p.name] is not None}
    absent = sum(1 << a.index for a, here in zip(op.tensors, present, strict=True) if not here)
    names = [a.name for a, here in zip(op.tensors, present, strict=True) if here]
    written = [i for i, a in enumerate(a for a, here in zip(op.tensors, present, strict=True) if here) if a.mutated]

    def ffi(*tensors):
        outs = _check(op, params, present, tensors, device)
        like = tensors[0] if tensors else None
        shapes = [_result_type(o["shape"], jnp.dtype(o["dtype"]), like) for o in outs if o is not None]
        aliases = {}
        for i in written:
            aliases[i] = len(shapes)
            shapes.append(_result_type(tensors[i].shape, tensors[i].dtype, like))
        call = jax.ffi.ffi_call(target_name(op), shapes, input_output_aliases=aliases, vmap_method="sequential")
        return tuple(call(*tensors, opforge_op=op.name, opforge_absent=np.int64(absent), **attrs))

    primitive = jax.custom_batching.custom_vmap(ffi)

    @primitive.def_vmap
    def _batched(axis_size, in_batched, *tensors):
        batched = {n for n, b in zip(names, in_batched, strict=True) if b}
        if batched <= set(op.batchable):  # one call, the batch as one more leading dim
            call = [
                jnp.broadcast_to(t, (axis_size, *t.shape)) if not b and n in op.batchable else t
                for n, b, t in zip(names, in_batched, tensors, strict=True)
            ]
            out = primitive(*call)
        else:  # one call per batch element

            def one(xs):
                it = iter(xs)
                return primitive(*[next(it) if b else t for b, t in zip(in_batched, tensors, strict=True)])

            out = jax.lax.map(one, tuple(t for b, t in zip(in_batched, tensors, strict=True) if b))
        return out, tuple(True for _ in out)

    fn = jax.custom_vjp(primitive)

    # The inputs the backward op computes a gradient for (by name), as the torch adapter's plan has them.
    produced = {op.args[i].name for targets in op.backward_gradients for i in targets}

    def forward(*primals):
        # symbolic_zeros: each primal says whether the caller differentiates with respect to it,
        # so a gradient nobody computes is refused when the derivative is traced, as torch's
        # autograd refuses it, instead of arriving as zeros.
        tensors = tuple(p.value for p in primals)
        wanted = [
            n
            for n, p, t in zip(names, primals, tensors, strict=True)
            if p.perturbed and jnp.issubdtype(t.dtype, jnp.inexact)
        ]
        if wanted and op.backward is None:
            raise NotImplementedError(
                f"derivative for {op.name} is not implemented: it declares no backward op (opforge .backward()), "
                "and a gradient must flow through it"
            )
        for n in wanted:
            if n not in produced:
                raise NotImplementedError(
                    f"the derivative of {op.name} for its input '{n}' is not implemented: its backward op "
                    f"{op.backward} has no grad_{n} output"
                )
        out = primitive(*tensors)
        return out, (tensors, out)

    def backward(saved, grads):
        tensors, out = saved
        grads = tuple(
            jnp.zeros(g.shape, g.dtype) if isinstance(g, jax.custom_derivatives.SymbolicZero) else g for g in grads
        )
        bwd = jop._resolve(op.backward)
        outs = _check(op, params, present, tensors, device)
        flat = _result_index(op, outs, present)
        arg_tensor = dict(zip(names, tensors, strict=True))
        values = []
        for kind, index in op.backward_sources:
            if kind == "arg":
                a = op.args[index]
                if isinstance(a, Param):  # a parameter left at None: its declared default
                    values.append(a.default if params[a.name] is None else params[a.name])
                else:
                    values.append(arg_tensor.get(a.name))
            else:
                source = grads if kind == "grad" else out
                values.append(source[flat[index]] if index in flat else None)
        result = bwd(*values)
        result = result if isinstance(result, tuple) else (result,)
        gradient = {}
        for g, targets in zip(result, op.backward_gradients, strict=False):
            for i in targets:
                gradient[op.args[i].name] = g
        return tuple(
            gradient.get(n) if jnp.issubdtype(t.dtype, jnp.inexact) else None
            for n, t in zip(names, tensors, strict=True)
        )

    fn.defvjp(forward, backward, symbolic_zeros=True)

    def call(*tensors):
        out = fn(*tensors)
        if all(op.differentiable_results):
            return out
        # A result whose gradient the backward op does not take is not differentiable: its
        # cotangent is stopped, as JAX does for the integer results of its own primitives.
        flat = _result_index(op, _check(op, params, present, tensors, device), present)
        stop = {flat[k] for k, d in enumerate(op.differentiable_results) if not d and k in flat}
        return tuple(jax.lax.stop_gradient(r) if i in stop else r for i, r in enumerate(out))

    return jax.jit(call)  # an eager call dispatches one compiled computation instead of tracing the wrappers
