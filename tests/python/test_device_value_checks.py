"""Value domains of device calls are checked on the device (Note [Device value checks] in
src/core/device_checks.h): a bad index stops the CUDA context with a device-side assertion that
names the op, the input and the value, before the op's kernel can dereference it, in eager calls
and in CUDA graph replays alike. A failed device-side assertion leaves the process's CUDA context
unusable, so each bad call runs in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import serving
from conftest import requires_cuda

TESTS = Path(__file__).resolve().parent


def run_bad_call(body: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(
        """
        import torch, serving
        serving.load()
        """
    ) + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)


def assert_stopped_by_the_check(done: subprocess.CompletedProcess, message: str, before: str = "") -> None:
    """The bad call's process printed ``before`` (the good call's line, where given), then ended in
    the device value check's assertion with ``message``: never past the bad call ("no error"),
    never in an illegal address from the op's kernel."""
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert before in output, output
    assert "device-side assert triggered" in output, output
    assert message in output, output
    assert "illegal memory access" not in output, output
    assert "no error" not in output


@requires_cuda
def test_a_position_past_the_cache_stops_the_rotary_kernel():
    done = run_bad_call(
        """
        positions, q, cache, k, _ = serving.rotary(5, 4, 64, 32, torch.float16, "cuda")
        before = q.clone()
        positions[3] = cache.shape[0] + 6
        torch.ops.examples.rotary_embedding(positions, q, cache, k, True)
        torch.cuda.synchronize()
        print("no error")
        """
    )
    assert_stopped_by_the_check(
        done,
        "examples::rotary_embedding: positions: expected values in [0, cos_sin_cache.size(0)) = [0, 10), "
        "got 16 at flat index 3",
    )


@requires_cuda
def test_a_slot_past_the_cache_stops_the_cache_write_inside_a_cuda_graph():
    done = run_bad_call(
        """
        key, value, key_cache, value_cache, slots = serving.kv_cache(6, 2, 16, 4, 4, torch.float16, "cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up: compile and load the kernels
            torch.ops.examples.kv_cache_write(key, value, key_cache, value_cache, slots)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch.ops.examples.kv_cache_write(key, value, key_cache, value_cache, slots)
        graph.replay()
        torch.cuda.synchronize()
        print("good replay")
        slots[2] = key_cache.shape[0] * key_cache.shape[1] + 1  # past the cache
        graph.replay()
        torch.cuda.synchronize()
        print("no error")
        """
    )
    assert_stopped_by_the_check(done, "examples::kv_cache_write: slot_mapping: expected values in", "good replay")


@requires_cuda
def test_a_kernel_that_checks_its_own_slots_stops_before_its_store():
    """reshape_and_cache_flash declares .checks_values_in_kernel(): no check kernel runs, and the
    kernel checks each token's slot against the domain it is passed before it stores. One slot
    far past any allocation, last of many: the call ends in the kernel's assertion with the
    message the separate check prints, never in an illegal address from the store."""
    done = run_bad_call(
        """
        key, value, key_cache, value_cache, slots = serving.kv_cache(65536, 8, 128, 4096, 16, torch.bfloat16, "cuda")
        slots = torch.arange(65536, device="cuda")
        caches = [torch.zeros(c.shape, dtype=torch.float8_e4m3fn, device="cuda") for c in (key_cache, value_cache)]
        scale = torch.tensor(1.0, device="cuda")
        torch.ops.examples.reshape_and_cache_flash(key, value, *caches, slots, "fp8", scale, scale)
        torch.cuda.synchronize()
        print("good call")
        slots[-1] = 1 << 40  # [8, 128] bytes a slot: 2**50 bytes past the cache
        torch.ops.examples.reshape_and_cache_flash(key, value, *caches, slots, "fp8", scale, scale)
        torch.cuda.synchronize()
        print("no error")
        """
    )
    assert_stopped_by_the_check(
        done,
        "examples::reshape_and_cache_flash: slot_mapping: expected values in "
        "[0, key_cache.size(0) * key_cache.size(1)) = [0, 65536) or -1, got 1099511627776 at flat index 65535",
        "good call",
    )


@requires_cuda
def test_a_kernel_launched_beside_the_check_waits_for_its_verdict():
    """kv_cache_write declares .waits_for_value_checks(): on sm_90 or newer it starts while the
    check of slot_mapping runs and must not store through a slot before the check's verdict. One
    slot far past any allocation, last of many (the check reads it late): the call ends in the
    check's assertion, never in an illegal address from the kernel's store."""
    done = run_bad_call(
        """
        key, value, key_cache, value_cache, slots = serving.kv_cache(65536, 8, 128, 4096, 16, torch.bfloat16, "cuda")
        slots = torch.arange(65536, device="cuda")
        torch.ops.examples.kv_cache_write(key, value, key_cache, value_cache, slots)
        torch.cuda.synchronize()
        print("good call")
        slots[-1] = 1 << 40  # [8, 128] bf16 a slot: 2**51 bytes past the cache
        torch.ops.examples.kv_cache_write(key, value, key_cache, value_cache, slots)
        torch.cuda.synchronize()
        print("no error")
        """
    )
    assert_stopped_by_the_check(
        done,
        "examples::kv_cache_write: slot_mapping: expected values in "
        "[0, key_cache.size(0) * key_cache.size(1)) = [0, 65536) or -1, got 1099511627776 at flat index 65535",
        "good call",
    )


@requires_cuda
def test_a_negative_slot_that_is_not_the_marker_stops_the_self_checking_kernel():
    """The kernel skips a token whose slot is negative, but only -1 is padding: -5 must end in its
    own check's assertion (checked before the skip), inside a CUDA graph as well."""
    done = run_bad_call(
        """
        key, value, key_cache, value_cache, slots = serving.kv_cache(6, 2, 16, 4, 4, torch.float16, "cuda")
        scale = torch.tensor(1.0, device="cuda")
        call = lambda: torch.ops.examples.reshape_and_cache_flash(
            key, value, key_cache, value_cache, slots, "auto", scale, scale)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up: compile and load the kernel
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        print("good replay")
        slots[4] = -5
        graph.replay()
        torch.cuda.synchronize()
        print("no error")
        """
    )
    assert_stopped_by_the_check(
        done,
        "examples::reshape_and_cache_flash: slot_mapping: expected values in "
        "[0, key_cache.size(0) * key_cache.size(1)) = [0, 16) or -1, got -5 at flat index 4",
        "good replay",
    )


@requires_cuda
def test_a_self_checking_kernel_with_checks_off_writes_as_with_them_on():
    """With device value checks off, the kernel is passed domains that admit every value: its
    writes are those of a checked call, bit for bit."""
    import opforge

    serving.load()
    key, value, key_cache, value_cache, slots = serving.kv_cache(37, 4, 64, 8, 16, torch.bfloat16, "cuda")
    scale = torch.tensor(0.5, device="cuda")
    caches = {}
    for checked in (True, False):
        mine = [torch.zeros(key_cache.shape, dtype=torch.float8_e4m3fn, device="cuda") for _ in range(2)]
        opforge.set_device_value_checks(checked)
        try:
            torch.ops.examples.reshape_and_cache_flash(key, value, *mine, slots, "fp8", scale, scale)
        finally:
            opforge.set_device_value_checks(True)
        caches[checked] = [c.view(torch.uint8) for c in mine]
    torch.testing.assert_close(caches[True], caches[False], rtol=0, atol=0)
    assert caches[True][0].count_nonzero() > 0


def test_the_description_says_which_kernel_checks_its_own_values():
    """Without a GPU: the library's description marks the kernel declared
    .checks_values_in_kernel(), and only it."""
    import opforge

    library = opforge.load_library(opforge.example_library("kv_cache_write"))
    checks = {op.name: [k.checks_values for k in op.runtime_kernels] for op in library.ops}
    assert checks == {"examples::kv_cache_write": [False], "examples::reshape_and_cache_flash": [True]}


@requires_cuda
def test_a_host_launched_kernel_beside_the_check_waits_for_its_verdict():
    """paged_decode_attention's host function launches its split kernel as the check's
    programmatic dependent (Context::after_value_check): on sm_90 or newer the kernel loads its
    block ids while the check of block_tables runs and must not read a page before the verdict.
    One sequence of 4096 tokens, its last block id far past the cache (the check reads it last):
    the call ends in the check's assertion, never in an illegal address from the kernel's read."""
    done = run_bad_call(
        """
        import opforge
        opforge.load_library(opforge.example_library("paged_decode_attention"))
        blocks = 257
        query = torch.randn(1, 32, 128, dtype=torch.bfloat16, device="cuda")
        key_cache = torch.randn(blocks, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
        value_cache = torch.randn_like(key_cache)
        tables = torch.randperm(blocks, device="cuda")[:256].view(1, 256).int()
        lens = torch.tensor([4096], dtype=torch.int32, device="cuda")
        torch.ops.examples.paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.0)
        torch.cuda.synchronize()
        print("good call")
        tables[0, -1] = 1 << 30  # 32 KiB a block: 2**45 bytes past the cache
        torch.ops.examples.paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.0)
        torch.cuda.synchronize()
        print("no error")
        """
    )
    assert_stopped_by_the_check(
        done,
        "examples::paged_decode_attention: block_tables: expected values in "
        "[0, key_cache.size(0)) = [0, 257), got 1073741824 at flat index 255",
        "good call",
    )


@requires_cuda
def test_checked_and_unchecked_calls_agree():
    import opforge

    serving.load()
    positions, q, cache, k, _ = serving.rotary(33, 4, 128, 128, torch.bfloat16, "cuda")
    mine = [t.clone() for t in (q, k)]
    torch.ops.examples.rotary_embedding(positions, mine[0], cache, mine[1], True)
    opforge.set_device_value_checks(False)
    try:
        torch.ops.examples.rotary_embedding(positions, q, cache, k, True)
    finally:
        opforge.set_device_value_checks(True)
    torch.testing.assert_close(mine, [q, k], rtol=0, atol=0)


def test_the_switch_is_reachable_without_a_gpu():
    """The checks' switch and the poison switch are opforge's public API (no GPU needed to set)."""
    import opforge

    opforge.set_device_value_checks(False)
    opforge.set_device_value_checks(True)
    x = torch.randn(4, 3)
    opforge.set_poison_outputs(2)
    try:
        y = torch.ops.examples.softshrink(x, 0.5)
    finally:
        opforge.set_poison_outputs(False)
    torch.testing.assert_close(y, torch.nn.functional.softshrink(x, 0.5))  # the reference writes every element
