"""Timing and reporting shared by the benchmarks in this folder."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object]) -> float:
    """Median GPU time of ``fn`` in milliseconds (triton.testing.do_bench: CUDA events, 50
    warm-up runs, 400 ms of timed runs)."""
    from triton.testing import do_bench  # imported here: CPU-only benchmarks run without triton

    return do_bench(fn, warmup=50, rep=400, return_mode="median")


def graph_ms(fn: Callable[[], object]) -> float:
    """Median GPU time of ``fn`` in milliseconds with its launches captured in a CUDA graph and
    replayed (triton.testing.do_bench_cudagraph): no launch gaps between a call's kernels, as a
    serving stack runs its decode steps. The L2 cache is not flushed between replays: ``fn``
    should rotate through :func:`input_sets` input sets (:func:`rotating`)."""
    from triton.testing import do_bench_cudagraph

    with torch.cuda.stream(torch.cuda.Stream()):  # graphs are not captured on the default stream
        return do_bench_cudagraph(fn, rep=100, return_mode="median")


def input_sets(nbytes: int) -> int:
    """How many distinct input sets of ``nbytes`` a CUDA graph timing rotates through
    (:func:`rotating`) so that they hold four times the GPU's L2 cache (1 to 8): a replay then reads
    memory, not L2, as an eager call does after do_bench's flush."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, min(8, -(-4 * l2 // nbytes)))


def rotating(fns: list[Callable[[], object]]) -> Callable[[], object]:
    """A callable that calls ``fns`` in turn, one per call. Under CUDA graph capture each captured
    call keeps its own buffers, so the replays rotate through the input sets."""
    cycle = itertools.cycle(fns)
    return lambda: next(cycle)()


def unchecked(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` run with opforge's device value checks off (Note [Device value checks]): their cost
    is the difference to the same call with them on, the default."""
    import opforge  # imported here: benchmarks without opforge ops use this module too

    def run():
        opforge.set_device_value_checks(False)
        try:
            fn()
        finally:
            opforge.set_device_value_checks(True)

    return run


def copy_gbs(nbytes: int, timer: Callable[[Callable[[], object]], float] = median_ms) -> float:
    """Device-to-device copy bandwidth for ``nbytes`` moved (half read, half written), GB/s, timed
    by ``timer`` (:func:`median_ms`, or :func:`graph_ms` over :func:`input_sets` rotating buffer
    pairs): the ceiling of an op that moves as many bytes."""
    copies = []
    for _ in range(input_sets(nbytes) if timer is graph_ms else 1):
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copies.append(lambda src=src, dst=dst: dst.copy_(src))
    return nbytes / timer(rotating(copies)) / 1e6


def bandwidth_group(
    rows: list[dict],
    name: str,
    nbytes: int,
    impls: list[tuple[str, Callable[[], object]]],
    timer: Callable[[Callable[[], object]], float] = median_ms,
) -> None:
    """Appends to ``rows`` a group ``name``: the copy of ``nbytes`` (:func:`copy_gbs`), then each
    ``(label, fn)`` of ``impls`` timed by ``timer`` (:func:`median_ms`, or :func:`graph_ms` for
    CUDA graph replays, where ``fn`` should rotate through :func:`input_sets` sets; the copy is
    timed the same way) as moving ``nbytes``, with its ratio to the copy (``vs_copy``)."""
    ceiling = copy_gbs(nbytes, timer)
    rows.append(
        {"group": name, "impl": "device-to-device copy", "ms": nbytes / ceiling / 1e6, "GB/s": ceiling, "vs_copy": 1.0}
    )
    for label, fn in impls:
        ms = timer(fn)
        gbs = nbytes / ms / 1e6
        rows.append({"group": name, "impl": label, "ms": ms, "GB/s": gbs, "vs_copy": gbs / ceiling})


def kernel_times(fn: Callable[[], object], repeats: int = 10, rows: int = 25) -> list[dict]:
    """GPU kernels ``fn`` launches, by name: count and device time (us) per call of ``fn``.

    Three warm-up calls, then ``repeats`` calls traced with ``torch.profiler`` (CUDA activity
    only); sorted by time, at most ``rows`` names, then a ``(total)`` row.
    """
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, dict] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = kernels.setdefault(event.name, {"name": event.name, "count": 0, "us": 0.0})
        k["count"] += 1 / repeats
        k["us"] += event.device_time_total / repeats
    table = sorted(kernels.values(), key=lambda k: -k["us"])
    total = {"name": "(total)", "count": sum(k["count"] for k in table), "us": sum(k["us"] for k in table)}
    return table[:rows] + [total]


def print_kernel_times(title: str, table: list[dict]) -> None:
    """Prints a kernel_times table under ``title``: count, device time, name."""
    print(f"{title} (count, device time):")
    for k in table:
        print(f"  {k['count']:6.1f}  {k['us']:9.1f} us  {k['name'][:110]}")


class SmClock:
    """Mean SM clock (MHz, NVML) over a timed region, sampled every 20 ms in a thread: a GPU
    that lowers its clock under load slows arithmetic-heavy kernels but not a copy."""

    def __init__(self) -> None:
        """Raises ImportError without nvidia-ml-py (pynvml); see :func:`sm_clock`."""
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        # NVML numbers GPUs its own way (it ignores CUDA_VISIBLE_DEVICES): find ours by PCI id.
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus_id = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)

    @contextlib.contextmanager
    def sampling(self):
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.02):
                samples.append(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))

        thread = threading.Thread(target=sample)
        thread.start()
        try:
            yield lambda: statistics.mean(samples) if samples else None
        finally:
            stop.set()
            thread.join()


def sm_clock() -> SmClock | None:
    """An :class:`SmClock` for the current GPU, or None (with a note on stderr) where NVML
    cannot be used; :func:`timed` then reports None for the clock."""
    try:
        return SmClock()
    except Exception as e:  # noqa: BLE001 -- ImportError, or any NVML error: run without clock figures
        print(f"bench: no SM clock figures ({type(e).__name__}: {e})", file=sys.stderr)
        return None


def timed(fn: Callable[[], object], clock: SmClock | None) -> tuple[float, float | None]:
    """``median_ms(fn)`` and the mean SM clock (MHz) while it ran (None without ``clock``)."""
    if clock is None:
        return median_ms(fn), None
    with clock.sampling() as mhz:
        ms = median_ms(fn)
    return ms, mhz()


def host_us_per_call(fn: Callable[[], object], calls: int = 20000) -> float:
    """Median over 5 rounds of host wall time per call of ``fn``, in microseconds (the GPU, if
    any, synchronised around each round)."""
    rounds = []
    for _ in range(5):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(rounds)[2]


def bandwidth_or_call_line(width: int) -> Callable[[dict], str]:
    """A report line for rows that hold either a bandwidth (ms, GB/s, vs_copy, and sm_mhz if
    measured) or a per-call cost (us_per_call, vs_native), with the implementation's name
    padded to ``width``."""

    def line(r: dict) -> str:
        if "GB/s" in r:
            clock = "" if r.get("sm_mhz") is None else f"  SM {r['sm_mhz']:.0f} MHz"
            return f"{r['impl']:<{width}} {r['ms']:8.3f} ms {r['GB/s']:8.0f} GB/s  {r['vs_copy']:.3f} x copy{clock}"
        return f"{r['impl']:<{width}} {r['us_per_call']:8.2f} us/call  {r['vs_native']:.3f} x native speed"

    return line


def device_name() -> str:
    """The GPU's name, or the CPU's where there is none."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, no GPU)"


def report(rows: list[dict], line: Callable[[dict], str], json_path: str | None, extra: dict | None = None) -> None:
    """Print ``rows`` grouped by their "group" key, one ``line(row)`` each, under the torch
    version and device name; write them, and the keys of ``extra``, to ``json_path`` as JSON if
    given."""
    print(f"torch {torch.__version__}, {device_name()}")
    last = None
    for row in rows:
        if row.get("group") != last:
            last = row.get("group")
            print(f"\n{last}")
        print(f"  {line(row)}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": device_name(), "rows": rows, **(extra or {})}, f, indent=2)
