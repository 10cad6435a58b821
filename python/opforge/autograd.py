"""Autograd for opforge ops that name a backward op (Note [Backward ops] in ``opforge/op.h``).

An op declared with ``.backward("softshrink_backward")`` gets, when its library is loaded, an
autograd formula registered with :func:`torch.library.register_autograd`. The two ops meet by
argument names, as in PyTorch's ``derivatives.yaml``:

- an input of the backward op named ``grad_<output>`` receives the gradient of that output of
  the forward op (zeros where the output did not reach the loss); an input named like one of
  the forward op's inputs, parameters or outputs receives that value, saved by the forward call;
- an output of the backward op named ``grad_<input>`` becomes the gradient of that tensor input
  of the forward op; other inputs get ``None``.

The backward op is an ordinary opforge op, so it runs on every device the op library supports,
inside ``torch.compile``'s backward graph too, and ``opforge verify`` checks its kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_GRAD = "grad_"


@dataclass(frozen=True)
class BackwardPlan:
    """How a forward op's values reach its backward op, checked when the library loads.

    Attributes:
        forward: the forward op's qualified name (``ns::name``).
        backward: the backward op's qualified name.
        sources: for each backward-op argument in schema order, ``("grad", j)`` for the gradient
            of forward output ``j``, ``("input", i)`` for forward argument ``i`` (tensor or
            parameter) or ``("output", j)`` for forward output ``j``.
        targets: for each backward-op output in order, the index of the forward argument whose
            gradient it is.
        tensor_args: for each forward argument, whether it is a tensor.
    """

    forward: str
    backward: str
    sources: tuple[tuple[str, int], ...]
    targets: tuple[int, ...]
    tensor_args: tuple[bool, ...]


def _is_tensor(arg: dict) -> bool:
    return arg["type"].startswith("Tensor")


def plan_backward(spec: dict, backward_spec: dict) -> BackwardPlan:
    """Match a backward op's arguments and outputs to its forward op by name.

    Args:
        spec: the forward op's description (an entry of :attr:`opforge.Library.ops`).
        backward_spec: the backward op's description.

    Returns:
        The :class:`BackwardPlan`.

    Raises:
        ValueError: an argument or output of the backward op matches nothing of the forward op;
            the message names each one and what it may be called.
    """
    fwd, bwd = spec["name"], backward_spec["name"]
    arg_names = [a["name"] for a in spec["args"]]
    tensor_args = tuple(_is_tensor(a) for a in spec["args"])
    out_names = [o["name"] for o in spec["outputs"]]
    problems = []
    sources = []
    for a in backward_spec["args"]:
        name = a["name"]
        if name.startswith(_GRAD) and name[len(_GRAD):] in out_names:
            sources.append(("grad", out_names.index(name[len(_GRAD):])))
        elif name in arg_names:
            sources.append(("input", arg_names.index(name)))
        elif name in out_names:
            sources.append(("output", out_names.index(name)))
        else:
            problems.append(
                f"input {name!r} of {bwd} matches nothing of {fwd}: expected one of "
                f"{', '.join([_GRAD + o for o in out_names] + arg_names + out_names)}")
    targets = []
    differentiable = [n for n, t in zip(arg_names, tensor_args) if t]
    for o in backward_spec["outputs"]:
        name = o["name"]
        if name.startswith(_GRAD) and name[len(_GRAD):] in differentiable:
            targets.append(arg_names.index(name[len(_GRAD):]))
        else:
            problems.append(f"output {name!r} of {bwd} is not the gradient of a tensor input of {fwd}: expected "
                            f"one of {', '.join(_GRAD + n for n in differentiable)}")
    if problems:
        raise ValueError(f"opforge: {fwd} names {bwd} as its backward op, but:\n  " + "\n  ".join(problems))
    return BackwardPlan(fwd, bwd, tuple(sources), tuple(targets), tensor_args)


def _op(qualname: str) -> torch._ops.OpOverload:
    ns, name = qualname.split("::")
    return getattr(getattr(torch.ops, ns), name).default


def _register(plan: BackwardPlan) -> None:
    backward_op = _op(plan.backward)
    saved_args = sorted({i for kind, i in plan.sources if kind == "input"})
    saved_outputs = sorted({j for kind, j in plan.sources if kind == "output"})
    num_args = len(plan.tensor_args)

    def setup_context(ctx, inputs, output):
        outputs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*[inputs[i] for i in saved_args if plan.tensor_args[i]],
                              *[outputs[j] for j in saved_outputs])
        ctx.opforge_params = {i: inputs[i] for i in saved_args if not plan.tensor_args[i]}

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        values = {("input", i): next(saved) for i in saved_args if plan.tensor_args[i]}
        values.update({("output", j): next(saved) for j in saved_outputs})
        values.update({("input", i): v for i, v in ctx.opforge_params.items()})
        args = [grads[i] if kind == "grad" else values[(kind, i)] for kind, i in plan.sources]
        result = backward_op(*args)
        results = result if isinstance(result, tuple) else (result,)
        input_grads = [None] * num_args
        for target, grad in zip(plan.targets, results):
            input_grads[target] = grad
        return tuple(input_grads)

    try:
        torch.library.register_autograd(plan.forward, backward, setup_context=setup_context)
    except (RuntimeError, NotImplementedError) as e:  # e.g. an op that mutates an input
        raise ValueError(f"opforge: cannot register {plan.backward} as the backward of {plan.forward}: {e}") from e


def register_backward_ops(ops: list[dict], loaded: list[dict]) -> None:
    """Register the autograd formula of every op in ``ops`` that names a backward op.

    Args:
        ops: descriptions of the ops just loaded.
        loaded: descriptions of every op loaded before, where a backward op may also live.

    Raises:
        ValueError: a backward op is not loaded (it must be declared in the same library or in
            one loaded first), or its names do not match (see :func:`plan_backward`).
    """
    known = {s["name"]: s for s in [*loaded, *ops]}
    plans = []
    for spec in ops:
        if "backward" not in spec:
            continue
        if spec["backward"] not in known:
            raise ValueError(f"opforge: {spec['name']} names {spec['backward']} as its backward op, which is not "
                             f"loaded: declare it in the same library or load its library first")
        plans.append(plan_backward(spec, known[spec["backward"]]))
    for plan in plans:  # every plan checked before any registration
        _register(plan)
