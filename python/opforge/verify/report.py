"""The results of a verification run, and their printed table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .compare import TOLERANCES


@dataclass
class CaseResult:
    """One checked case. ``status`` is "pass", "FAIL" or "skip"; ``repro`` says how to rebuild
    the inputs (seed, dtypes, shapes, strides, parameters)."""

    op: str
    check: str
    dtype: str
    case: str
    status: str
    max_abs_error: float | None = None
    # worst |out - ref| / (atol + rtol * |ref|), or for an output held to an op's
    # .tolerance_vs_equivalent its largest error over that bound; <= 1 passes
    error_vs_tolerance: float | None = None
    tolerance: tuple[float, float] | None = None
    message: str = ""
    repro: dict = field(default_factory=dict)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass
class Report:
    """Every case of a verification run, with the seed it started from."""

    seed: int
    device: str
    results: list[CaseResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "FAIL"]

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        """One line: "3 ops, 17 checks (1204 cases), all passed", with ", 2 skipped" for checks
        that did not apply, or ": 2 checks failed (5 cases): ns::op values float32, ..." naming
        each failed check. A check is one row of :func:`print_report`'s table: an op, a check and
        a dtype combination."""
        groups: dict[tuple, list[CaseResult]] = {}
        for r in self.results:
            groups.setdefault((r.op, r.check, r.dtype), []).append(r)
        head = f"{_count(len({r.op for r in self.results}), 'op')}, {_count(len(groups), 'check')}"
        head += f" ({_count(len(self.results), 'case')})"
        skipped = sum(all(r.status == "skip" for r in rs) for rs in groups.values())
        skips = f", {skipped} skipped" if skipped else ""
        failed = [" ".join(k) for k, rs in groups.items() if any(r.status == "FAIL" for r in rs)]
        if not failed:
            return f"{head}, all passed{skips}"
        return (
            f"{head}{skips}: {_count(len(failed), 'check')} failed ({_count(len(self.failures), 'case')}): "
            + ", ".join(failed)
        )

    def to_dict(self) -> dict:
        """The report as plain data for :func:`json.dumps` (``opforge verify --json``): seed,
        device, ok, the tolerances by dtype and every case's fields."""
        return {
            "seed": self.seed,
            "device": self.device,
            "ok": self.ok,
            "tolerances": TOLERANCES,
            "results": [asdict(r) for r in self.results],
        }


#: The checks that compile an op's device kernels without a GPU (checks.py): the kernels do not run.
COMPILED_NOT_RUN = ("nvrtc", "binary", "triton")


def print_report(report: Report, console=None) -> None:
    """A table with a row per op, check and dtype combination (its number of cases, failures and
    largest errors), each failure with how to reproduce it, the tolerances, and last the
    report's :meth:`Report.summary` line (rich)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=max(120, Console().width))
    table = Table(title=f"opforge verify on {report.device} (seed {report.seed})")
    for col in ("op", "check", "dtype", "cases", "failed", "max abs err", "worst err / tol"):
        table.add_column(col, justify="left" if col in ("op", "check", "dtype") else "right")
    groups: dict[tuple, list[CaseResult]] = {}
    for r in report.results:
        groups.setdefault((r.op, r.check, r.dtype), []).append(r)
    for (op, check, dtype), rs in groups.items():
        failed = [r for r in rs if r.status == "FAIL"]
        errs = [r.max_abs_error for r in rs if r.max_abs_error is not None]
        ratios = [r.error_vs_tolerance for r in rs if r.error_vs_tolerance is not None]
        status = "skipped: " + rs[0].message if all(r.status == "skip" for r in rs) else str(len(failed))
        table.add_row(
            op,
            check,
            dtype,
            str(len(rs)),
            status if not failed else f"[red]{len(failed)}[/]",
            f"{max(errs):.2e}" if errs else "",
            f"{max(ratios):.3f}" if ratios else "",
        )
    console.print(table)
    for r in report.failures:
        console.print(
            "[red]FAIL[/] " + escape(f"{r.op} {r.check} {r.dtype} [{r.case}]: {r.message}\n  reproduce: {r.repro}"),
            soft_wrap=True,
        )
    console.print(
        "tolerances (atol, rtol) against float64: "
        + ", ".join(f"{k} {v[0]:g}/{v[1]:g}" for k, v in TOLERANCES.items())
        + "; an output passed by its op's .tolerance_vs_equivalent counts its error over that bound",
        soft_wrap=True,
    )
    compiled = sorted({r.op for r in report.results if r.check in COMPILED_NOT_RUN})
    if report.device == "cpu" and compiled:
        console.print(
            f"on the CPU, the device kernels of {', '.join(compiled)} were compiled, not run: the values are the "
            "CPU reference against the op's .equivalent() torch expression (on a GPU, the kernels against the "
            "reference)",
            soft_wrap=True,
        )
    console.print(escape(report.summary()), soft_wrap=True)
