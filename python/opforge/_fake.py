"""Fake kernels of ops whose outputs have data-dependent sizes (``opforge::size_of``; Note
[Data-dependent sizes] in ``opforge/expr.h``).

Such a size exists only after the kernel runs, so under torch.compile and torch.export it is an
unbacked symbol, which only torch's Python side can create
(``torch.library.get_ctx().new_dynamic_size()``). The fake kernel registered here creates one per
such output and calls the op's fake companion (``ns::_opforge_fake_<op>``, whose Meta kernel is
the adapter's C++ one), which evaluates every rule of the op in the core with those sizes: no
rule is restated in Python.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .description import Op

#: The prefix of an op's fake companion (core::fake_companion_name).
COMPANION_PREFIX = "_opforge_fake_"


def register_data_dependent_fakes(ops: Iterable[Op]) -> None:
    """Registers with torch the fake kernel of each op in ``ops`` that has an output of
    data-dependent size (an Output whose ``size_from`` is set)."""
    for op in ops:
        count = sum(o.size_from is not None for o in op.outputs)
        if not count:
            continue
        ns, name = op.name.split("::")
        companion = getattr(getattr(torch.ops, ns), COMPANION_PREFIX + name).default

        def fake(*args, _count=count, _companion=companion, **kwargs):
            ctx = torch.library.get_ctx()
            sizes = [ctx.new_dynamic_size() for _ in range(_count)]
            return _companion(*args, data_dependent_sizes=sizes, **kwargs)

        torch.library.register_fake(op.name, fake)
