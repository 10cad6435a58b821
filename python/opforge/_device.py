"""Whether a device a user named (``--device cuda``) exists here, said in one line before any work."""

from __future__ import annotations

import torch

#: What the message of a machine without CUDA suggests instead.
_ON_THE_CPU = "; --device cpu runs on the CPU"


def missing_device(device: str | torch.device) -> str | None:
    """Why torch cannot run on ``device`` here, in one line, or None when it can.

    A command line checks its ``--device`` with it before any work and exits with status 2 on the
    line it returns, instead of failing later in a traceback from the CUDA driver::

        if (problem := opforge.missing_device(args.device)) is not None:
            parser.exit(2, f"{parser.prog}: {problem}\\n")

    Args:
        device: a torch device or its name: "cpu", "cuda", "cuda:1", ...

    Returns:
        None; "no CUDA device: ..." for CUDA on a machine where torch finds no GPU, or for
        "cuda:N" past the last GPU; "not a device: ..." for a name torch does not parse. Other
        device types are left to torch (None).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        return f"not a device: {device!r} ({str(e).splitlines()[0]})"
    if dev.type != "cuda":
        return None
    if torch.version.cuda is None:
        return f"no CUDA device: this torch ({torch.__version__}) is built without CUDA{_ON_THE_CPU}"
    if not torch.cuda.is_available():
        return (
            f"no CUDA device: torch {torch.__version__} finds no GPU (torch.cuda.is_available() is False){_ON_THE_CPU}"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        return f"no CUDA device {dev}: torch finds {count} GPU{'s' * (count != 1)} (cuda:0 to cuda:{count - 1})"
    return None
