"""Shim for Liger-Kernel's package ``liger_kernel`` (not upstream's file): upstream's ``__init__``
imports every op and backend of the package; the vendored kernel files need only
``liger_kernel.utils`` and ``liger_kernel.ops.utils``, which sit beside this file as they came
(PROVENANCE.md)."""
