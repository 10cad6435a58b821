"""Shim for Liger-Kernel's package ``liger_kernel.ops`` (not upstream's file): upstream's
``__init__`` imports every op module and selects a backend; the vendored kernel files import only
``liger_kernel.ops.utils``, beside this file as it came (PROVENANCE.md)."""
