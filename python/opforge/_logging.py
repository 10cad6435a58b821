"""Log records of torch that opforge silences (installed by ``import opforge``, which imports no
torch: a filter on a logger by name needs only :mod:`logging`)."""

from __future__ import annotations

import logging


def _no_cuda_runtime_warning(record: logging.LogRecord) -> bool:
    """False for torch.utils.cpp_extension's "No CUDA runtime is found" warning, which Inductor's
    import of it prints on every machine without a GPU (opforge's compile checks, AOTInductor
    packaging): there is nothing a user can do about it there."""
    return not record.getMessage().startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_no_cuda_runtime_warning)
