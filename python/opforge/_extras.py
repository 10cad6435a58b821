"""The packages some parts of opforge need beyond its dependencies, and the extra of ``pip install``
that brings each (``[project.optional-dependencies]`` of pyproject.toml; a test keeps both in step):
``test`` (pytest, for the test ``opforge new`` writes), ``doctor`` (matplotlib, for its plots),
``jax`` (:mod:`opforge.jax`) and ``onnx``."""

from __future__ import annotations

import importlib
from types import ModuleType


def install(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'opforge[<extra>]'``."""
    return f"pip install 'opforge[{extra}]'"


def require(module: str, extra: str, who: str) -> ModuleType:
    """Imports ``module``, needed by ``who`` (a function or feature, named in the error).

    Raises:
        ImportError: ``module`` cannot be imported: "<who> needs <module>, which this Python does
            not have (No module named ...): pip install 'opforge[<extra>]'".
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{who} needs {module}, which this Python does not have ({e}): {install(extra)}") from e
