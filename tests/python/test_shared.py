"""Shared pools across processes started with multiprocessing (spawn), as
an engine's tensor-parallel ranks: every rank sees the others' writes, a
rank SIGKILLed mid-setup is named by the others' PeerError, and nothing is
left on disk or in the huge page pool."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

import hostpool
from conftest import hugetlbfs_mount

WORLD = 4
MiB = 1 << 20


def _rank(name, rank, kwargs, barrier, out, kill_rank):
    if rank == kill_rank:
        # The build stops before the barrier, so the rank is certainly
        # mid-setup when it dies, once its prefault is done.
        os.environ["HOSTPOOL_TEST_FAILPOINTS"] = "shared-before-barrier=stall"

    def progress(phase, done, total):
        if rank == kill_rank and phase == "prefault" and done == total:
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        pool = hostpool.Pool(
            size=64 * MiB,
            shared=hostpool.Shared(name, WORLD, rank, attach_timeout=20.0, barrier_timeout=20.0),
            progress=progress,
            **kwargs,
        )
    except hostpool.PeerError as e:
        out.put((rank, "peer", e.rank, e.ranks, e.pid, str(e)))
        return
    except Exception as e:  # reported to the parent, which fails the test
        out.put((rank, "error", None, (), None, f"{type(e).__name__}: {e}"))
        return
    with pool:
        mem = memoryview(pool)
        stride = pool.nbytes // WORLD
        mem[rank * stride] = rank + 1
        barrier.wait(timeout=30)
        seen = [mem[r * stride] for r in range(WORLD)]
        barrier.wait(timeout=30)  # nobody closes before everyone has read
        out.put((rank, "ok", pool.shard, seen, pool.report["sharing"]["role"]))
        del mem


def _run(name, kwargs, kill_rank=None):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WORLD if kill_rank is None else WORLD - 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(name, r, kwargs, barrier, out, kill_rank)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung"
    results = {}
    while not out.empty():
        r = out.get()
        results[r[0]] = r[1:]
    return procs, results


@pytest.fixture(params=["anon", "shm", "hugetlbfs-2M"])
def shared_kwargs(request):
    if request.param == "anon":
        return {}
    if request.param == "shm":
        return {"dir": "/dev/shm"}
    return {"backing": "hugetlbfs", "dir": hugetlbfs_mount("2M")}


def test_every_rank_sees_the_others_writes(shared_kwargs):
    procs, results = _run(f"py-share-{os.getpid()}", shared_kwargs)
    assert [p.exitcode for p in procs] == [0] * WORLD, results
    assert sorted(results) == list(range(WORLD))
    shards = []
    for rank, (status, shard, seen, role) in results.items():
        assert status == "ok", (rank, seen)
        assert seen == [r + 1 for r in range(WORLD)], f"rank {rank} saw {seen}"
        shards.append(shard)
    # Each rank prefaulted its own shard; together they tile the pool.
    shards.sort()
    assert shards[0][0] == 0
    for (o1, n1), (o2, _) in zip(shards, shards[1:]):
        assert o1 + n1 == o2
    assert sorted(r[3] for r in results.values()).count("creator") == 1


def test_a_rank_killed_mid_setup_is_named_by_every_other(shared_kwargs):
    import hostpool._hostpool

    # The victim stalls at a failpoint: only a test build has them.
    assert hostpool._hostpool._FAILPOINTS, "build with --features failpoints (cargo xtask test does)"
    procs, results = _run(f"py-kill-{os.getpid()}", shared_kwargs, kill_rank=2)
    assert procs[2].exitcode == -signal.SIGKILL
    dead_pid = procs[2].pid
    for rank in (0, 1, 3):
        assert rank in results, f"rank {rank} reported nothing"
        status, err_rank, err_ranks, err_pid, message = results[rank]
        assert status == "peer", (rank, message)
        assert err_rank == (err_ranks[0] if err_ranks else None), (rank, err_rank, err_ranks)
        if "never attached" in message:
            # A rank that retried against a new pool after the failure
            # waits for the ranks that never came to it, the dead one too.
            assert 2 in err_ranks and err_pid is None, (rank, err_ranks, err_pid, message)
        else:
            # The dead rank by rank and pid, or (a joiner that never learned
            # the creator's rank) by pid alone.
            assert err_ranks in ((2,), ()) and err_pid == dead_pid, (rank, err_ranks, err_pid, dead_pid, message)
        assert procs[rank].exitcode == 0
