"""Fake classes of opforge's custom classes (Note [Custom classes] in ``opforge/op_class.h``), so that
torch.compile, torch.export and AOTInductor trace modules holding an instance.

torch traces a torchbind object through a fake object built from the real one's
``__obj_flatten__`` (``torch._library.fake_class_registry``) and calls the fake class's methods
with fake tensors. The fake class derived here keeps the flattened fields and runs each method's
op (``torch.ops.<ns>.<op>``) with the fields bound as the C++ class binds them (the description's
``bound``): under fake tensors that is the op's Meta kernel, so every shape and dtype rule is the
core's, as for a plain call of the op.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .description import CustomClass, Method


def _method(cls: CustomClass, method: Method):
    namespace, name = method.op.split("::")
    callers = [i for i, b in enumerate(method.bound) if b is None]

    def call(self, *args):
        if len(args) != len(callers):
            raise TypeError(f"{cls.qualified_name}.{method.name}: expected {len(callers)} arguments, got {len(args)}")
        given = dict(zip(callers, args, strict=True))
        values = [given[i] if b is None else getattr(self, b) for i, b in enumerate(method.bound)]
        return getattr(getattr(torch.ops, namespace), name)(*values)

    call.__name__ = method.name
    call.__qualname__ = f"{cls.name}.{method.name}"
    return call


def fake_class(cls: CustomClass) -> type:
    """The fake class of ``cls``: built from ``__obj_flatten__``'s (name, value) pairs by the
    ``__obj_unflatten__`` classmethod, with the fields as attributes and one method per method
    of ``cls``."""

    def __init__(self, **fields):
        for k, v in fields.items():
            setattr(self, k, v)

    def __obj_unflatten__(klass, flat):
        return klass(**dict(flat))

    def __obj_flatten__(self):
        return tuple((f.name, getattr(self, f.name)) for f in cls.fields)

    namespace = {
        "__init__": __init__,
        "__obj_unflatten__": classmethod(__obj_unflatten__),
        "__obj_flatten__": __obj_flatten__,
        "__doc__": f"Fake {cls.qualified_name} for tracing (derived by opforge from its declaration).",
    }
    for m in cls.methods:
        namespace[m.name] = _method(cls, m)
    return type(f"Fake{cls.name}", (), namespace)


def register_fake_classes(classes: Iterable[CustomClass]) -> None:
    """Registers the fake class of each class in ``classes`` with torch
    (``torch._library.register_fake_class``)."""
    for cls in classes:
        torch._library.register_fake_class(cls.qualified_name)(fake_class(cls))
