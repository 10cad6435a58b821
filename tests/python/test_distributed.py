"""DTensor sharding rules derived from op descriptions, on CPU with the gloo backend (two
processes), against the same computation in one process."""

from __future__ import annotations

import os
import queue
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import opforge

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, build_dir: str, reports, parts) -> None:
    name = ""
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OPFORGE_BUILD_DIR=build_dir)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        for name, target, *args in parts:  # noqa: B007 -- the failure names its part
            target(rank, world, *args)
            dist.barrier()  # both ranks through a part before either starts the next, or tears down gloo
            reports.put((name, ""))
        dist.destroy_process_group()
        reports.close()
        reports.join_thread()  # the reports written to the pipe before os._exit ends the feeder thread
        # Leave without interpreter teardown: now and then (about 1 run in 10 on a 2-core
        # machine) rank 0, which hosts the TCPStore, aborted in a static destructor with
        # "terminate called without an active exception" after all checks had passed.
        os._exit(0)
    except Exception as e:  # noqa: BLE001 -- reported to the parent, under the part's name
        import traceback

        reports.put((name, f"rank {rank}: {traceback.format_exc()}"))
        raise SystemExit(1) from e


def run_in_processes(parts: list[tuple], world: int = 2) -> dict[str, str]:
    """Runs each part ``(name, target, *args)`` in turn, ``target(rank, world, *args)`` (a
    module-level function), in ``world`` spawned processes that form one gloo process group and
    use this process's opforge build; a rank stops at its first failure (the others' collectives
    then fail too). Returns each part's failure by name, "" where it passed on every rank: the
    tracebacks of the ranks where it raised or, where it did not run to its end on every rank,
    the processes' exit codes and every traceback."""
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world, port, str(opforge.build_dir()), reports, parts))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        if p.is_alive():  # hung: its exit code (-9) says so below
            p.kill()
            p.join()
    received = []
    for _ in range(reports.qsize()):  # counts a report put by a process killed before it was sent
        try:
            received.append(reports.get(timeout=10))
        except queue.Empty:
            break
    everything = "\n".join(m for _, m in received if m)
    codes = [p.exitcode for p in procs]
    failures = {}
    for name, *_ in parts:
        tracebacks = [m for part, m in received if part == name and m]
        passed = sum(1 for part, m in received if part == name and not m)
        failures[name] = "\n".join(tracebacks) or (
            "" if passed == world else f"the processes exited {codes} before it ran to its end:\n{everything}"
        )
    return failures


def _worker(rank: int, world: int) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.device_mesh import init_device_mesh

    for op in ("softshrink", "bias_gelu"):
        opforge.load_library(opforge.example_library(op))
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same full tensors on every rank
    x, bias = torch.randn(6, 4, 8), torch.randn(8)

    # pointwise: every dim of x can be sharded; the bias follows on the last dim.
    for d in range(3):
        dx = distribute_tensor(x, mesh, [Shard(d)])
        db = distribute_tensor(bias, mesh, [Shard(0)] if d == 2 else [Replicate()])
        y = torch.ops.examples.bias_gelu(dx, db)
        assert y.placements == (Shard(d),), (d, y.placements)
        torch.testing.assert_close(y.full_tensor(), F.gelu(x + bias))
        s = torch.ops.examples.softshrink(dx, 0.3)
        assert s.placements == (Shard(d),)
        torch.testing.assert_close(s.full_tensor(), F.softshrink(x, 0.3))

    # A tensor-parallel feed-forward block: column-parallel matmul -> bias_gelu -> row-parallel
    # matmul, against the same block in one process.
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class FeedForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(8, 32, bias=False)
            self.bias = torch.nn.Parameter(torch.randn(32))
            self.down = torch.nn.Linear(32, 8)

        def forward(self, h):
            return self.down(torch.ops.examples.bias_gelu(self.up(h), self.bias))

    torch.manual_seed(1)
    block = FeedForward()
    h = torch.randn(5, 8)
    expected = block(h)
    parallel = parallelize_module(
        block, mesh, {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}
    )
    parallel.bias = torch.nn.Parameter(distribute_tensor(block.bias.detach(), mesh, [Shard(0)]))
    torch.testing.assert_close(parallel(h), expected)


def _attention_worker(rank: int, world: int) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    opforge.load_library(opforge.example_library("attention"))
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 6, 7, 32, dtype=torch.float16) for _ in range(3))
    mask = torch.randn(4, 7, dtype=torch.float16)
    expected = torch.ops.examples.attention(q, k, v, 32, mask, causal=True)
    # batch (dim 0) and heads (dim 1): the mask follows the batch and is replicated over heads.
    for d, mask_placement in ((0, Shard(0)), (1, Replicate())):
        dq, dk, dv = (distribute_tensor(t, mesh, [Shard(d)]) for t in (q, k, v))
        out = torch.ops.examples.attention(dq, dk, dv, 32, distribute_tensor(mask, mesh, [mask_placement]), causal=True)
        for o, e in zip(out, expected, strict=True):  # o, and lse [batch, heads, seq]
            assert o.placements == (Shard(d),), (d, o.placements)
            assert torch.equal(o.full_tensor(), e)  # the same per-(batch, head) computation
    out, _ = torch.ops.examples.attention(*(distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v)), 32)
    assert out.placements == (Shard(1),) and torch.equal(
        out.full_tensor(), torch.ops.examples.attention(q, k, v, 32)[0]
    )

    class SelfAttention(torch.nn.Module):
        """q, k, v projections column-parallel (heads split across ranks), attention per local
        head, output projection row-parallel: Megatron-style tensor parallelism."""

        def __init__(self, hidden=128, heads=4):
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden, dtype=torch.float16) for _ in range(4))

        def forward(self, x, mask):
            b, s, _ = x.shape
            split = [t.view(b, s, self.heads, -1).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x))]
            ctx, _ = torch.ops.examples.attention(*split, split[0].shape[-1], mask)
            return self.o(ctx.transpose(1, 2).reshape(b, s, -1))

    torch.manual_seed(1)
    block = SelfAttention()
    x, mask = torch.randn(3, 5, 128, dtype=torch.float16), torch.zeros(3, 5, dtype=torch.float16)
    mask[0, 3:] = float("-inf")
    expected = block(x, mask)
    parallel = parallelize_module(
        block,
        mesh,
        {
            "q": ColwiseParallel(use_local_output=False),
            "k": ColwiseParallel(use_local_output=False),
            "v": ColwiseParallel(use_local_output=False),
            "o": RowwiseParallel(),
        },
    )
    torch.testing.assert_close(
        parallel(x, distribute_tensor(mask, mesh, [Replicate()])), expected, atol=2e-3, rtol=2e-3
    )


@pytest.fixture(scope="module")
def two_processes() -> dict[str, str]:
    """Both multi-process checks in one pair of spawned processes (each process imports torch and
    this file): the failure of each, by name (:func:`run_in_processes`)."""
    return run_in_processes([("sharding", _worker), ("attention", _attention_worker)])


def test_attention_shards_over_batch_and_heads(two_processes):
    assert not two_processes["attention"], two_processes["attention"]


def test_sharding_rules_under_two_processes(two_processes):
    assert not two_processes["sharding"], two_processes["sharding"]


def test_strategies_from_the_description():
    from torch.distributed.tensor import Replicate, Shard

    from opforge.distributed import strategies

    class Like:
        def __init__(self, ndim):
            self.ndim = ndim

    point = strategies("pointwise", 1, [Like(3), Like(1)])
    assert point == [
        ([Replicate()], [Replicate(), Replicate()]),
        ([Shard(0)], [Shard(0), Replicate()]),
        ([Shard(1)], [Shard(1), Replicate()]),
        ([Shard(2)], [Shard(2), Shard(0)]),
    ]
    rows = strategies("rowwise", 1, [Like(2), 0.5])
    assert rows == [([Replicate()], [Replicate(), None]), ([Shard(0)], [Shard(0), None])]
    assert opforge.find_op("examples::softshrink").sharding == "pointwise"  # from its launch rule
    # A dim an input declares multiple_of(k) stays whole (its shards need not be multiples of k).
    assert strategies("pointwise", 1, [Like(2), Like(1)], frozenset({-1})) == [
        ([Replicate()], [Replicate(), Replicate()]),
        ([Shard(0)], [Shard(0), Replicate()]),
    ]


def test_dims_strategies_follow_the_shape_rules():
    from torch.distributed.tensor import Replicate, Shard

    from opforge.distributed import dims_strategies

    opforge.load_library(opforge.example_library("attention"))
    op = opforge.find_op("examples::attention")
    assert op.sharding == "dims" and op.sharding_dims == (0, 1)
    assert [a.follows for a in op.tensors] == [{0: 0, 1: 1}, {0: 0, 1: 1}, {0: 0, 1: 1}, {0: 0}]

    class Like:
        ndim = 4

    q = Like()
    mask = type("Mask", (), {"ndim": 2})()
    # The mask passed by keyword lands after the positional args in DTensor's order.
    got = dims_strategies(op, 1, [q, q, q, 32, mask], [None, None, None, None, "mask"])
    assert got == [
        ([Replicate()], [Replicate(), Replicate(), Replicate(), None, Replicate()]),
        ([Shard(0)], [Shard(0), Shard(0), Shard(0), None, Shard(0)]),
        ([Shard(1)], [Shard(1), Shard(1), Shard(1), None, Replicate()]),
    ]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (one per process, NCCL)"),
        ),
    ],
)
def test_tensor_parallel_layer_under_torchrun(device):
    """examples/models/tensor_parallel.py under torchrun with 2 processes matches one process."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "models" / "tensor_parallel.py"
    env = {**os.environ, "OPFORGE_BUILD_DIR": str(opforge.build_dir())}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            str(script),
            "--device",
            device,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"rank {rank}/2 on {device}" in proc.stdout and "matches one process" in proc.stdout
