"""``opforge verify``: device kernels against the CPU reference, per op and per model.

Op level (:func:`verify_op`): inputs are generated from the op's description (dtype sets, ranks,
shape rules, parameter ranges), in every dtype combination its dtype rules accept (the core
enumerates them: each dtype of a set, a ``same_dtype`` input's model dtype and alternatives;
``--dtype`` selects by the first floating input's dtype): sizes that straddle vector and block
boundaries, head sizes 64 and 128, more rows than one row block, random sizes, and on a device
larger ones (:data:`.cases.SHAPES`, :data:`.cases.DEVICE_SHAPES`), strided views of every
input, written ones included where they take them without a copy (permuted, sliced, expanded,
storage-offset, padded or permuted rows that stay 16-byte aligned, and a slice of a longer
tensor), empty tensors and NaN/Inf values. Sizes come from the core, which evaluates the shape
rules (dims declared ``multiple_of(k)`` get multiples of k); sizes that repeat an earlier case's
shapes are left out.
Optional tensor inputs (``Tensor? name=None``) are given in every case, and the shape and empty
cases are repeated with all of them left out (None).
Each case runs the device kernel with its outputs poisoned beforehand (NaN, 0x7b bytes, true;
where the reference holds the poison, again with the alternate poison: Note [Poison that equals
the reference] in :mod:`.poison`) and compares it with the CPU reference run on float64 copies of
the inputs where the op accepts float64, with the tolerances (:data:`TOLERANCES`) of the least
precise dtype among the case's tensors, or the op's own for that dtype where it declares one
(``.tolerance()``: its arithmetic is looser). A floating output that misses those still passes,
for an op that declares ``.tolerance_vs_equivalent(factor)`` (kernels that round by design), if
its largest error against float64 is at most factor times that of the op's ``.equivalent()`` run
in the case's own dtypes on the device (FlashAttention's test criterion).
Inputs declared ``shape({leading_dims, ...})`` also get cases with none and with three leading
dims. On a machine without a GPU, the CPU reference is
compared with the description's ``.equivalent()`` torch expression instead (a reference
compared with itself proves nothing), and each run-time kernel instantiation the cases would use
is compiled with NVRTC for sm_90 and sm_80 (check "nvrtc"), so a kernel source that does not
compile fails there too, on either side of an architecture-specific path (a prebuilt kernel's
file is checked instead, check "binary": Note [Prebuilt kernels]); a Triton kernel is compiled by
Triton for the same targets for the shapes and parameters of value cases a device would run, a
spread of them per instantiation (check "triton": the variant Triton specialises for each call and
the general one; Note [Triton kernels] in ``opforge/op_launch.h``). Parameters: defaults,
the bounds of ranges and a point inside, a random value for unranged floats, every choice. Every
case draws fresh random data from a seed that the report prints. Each op also gets
``torch.library.opcheck``, a ``torch.compile(fullgraph=True, dynamic=True)`` no-recompile check
over three sizes that its rules admit and torch's duck sizing does not recompile for (Note [Duck
sizing] in :mod:`.sweep`; not applicable, with the reason, where no such sizes exist), an out=
check (the out= overload's poisoned outputs against the op's results, as the values check), and a
Meta-versus-real check of shape, dtype and strides (with and without its optional tensor
inputs, if it has any). An op that names a backward op (Note
[Backward ops]) also gets ``torch.autograd.gradcheck`` (check "gradcheck"): the gradients its
backward op computes against finite differences of the op itself, in float64 where the op takes
it, else in float32 with a wider step and tolerances (``checks.FLOAT32_GRADCHECK``).

Model level (:func:`verify_model`): export, AOTInductor-compile, run the package in the C++
runner on the device, and compare each output with the model run in eager on the CPU.

The package's modules: :mod:`.cases` (input generation), :mod:`.sweep` (the compile check's
sizes), :mod:`.poison` (unwritten outputs), :mod:`.compare` (tolerances), :mod:`.checks` (the
op checks), :mod:`.model` (models), :mod:`.report` (results, their table and summary line).

CLI: ``python -m opforge verify LIBRARY_OR_OP... [--device cuda] [--seed N] [--json FILE]``.
"""

from .checks import CHECK_ARCHS, verify_op
from .compare import TOLERANCES
from .model import ModelReport, OutputResult, verify_model
from .report import CaseResult, Report, print_report

__all__ = [
    "CHECK_ARCHS",
    "CaseResult",
    "ModelReport",
    "OutputResult",
    "Report",
    "TOLERANCES",
    "print_report",
    "verify_model",
    "verify_op",
]
