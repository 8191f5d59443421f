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
from conftest import hugetlbfs_mount, socket_bound

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


FAILED_CREATOR = """
import os, sys, time, hostpool
try:
    hostpool.Pool(size="8MiB", shared=hostpool.Shared(sys.argv[1], 2, 0, attach_timeout=20))
except hostpool.Error as e:
    print("raised", type(e).__name__, flush=True)
# An engine lives on after the error; its failed pool still answers.
time.sleep(float(sys.argv[2]))
"""

LATE_PEER = """
import sys, time, hostpool
t = time.monotonic()
try:
    hostpool.Pool(size="8MiB", shared=hostpool.Shared(sys.argv[1], 2, 1, attach_timeout=20))
    print("built")
except hostpool.PeerError as e:
    print(f"peer {time.monotonic() - t:.2f} {e.pid} {e}")
"""


def test_a_rank_that_comes_after_its_creator_failed_hears_the_cause_at_once():
    """Issue 19: the creator's mmap fails before its peer connects (vLLM's
    test_mmap_failure_unlinks_initialized_file_before_releasing_peers). Its
    Pool() raises at once; the peer that comes later fails within a second
    with the creator's cause, instead of becoming a creator itself and
    waiting out its attach timeout."""
    import subprocess
    import sys
    import time

    import hostpool._hostpool

    assert hostpool._hostpool._FAILPOINTS, "build with --features failpoints (cargo xtask test does)"
    name = f"py-late-{os.getpid()}"
    env = {**os.environ, "HOSTPOOL_TEST_FAILPOINTS": "shared-creator-map=ENOMEM"}
    creator = subprocess.Popen([sys.executable, "-c", FAILED_CREATOR, name, "10"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = creator.stdout.readline()
        assert line.startswith("raised Error"), line + creator.stderr.read()
        # The failed pool still answers: its socket name is held (by the
        # creator's refusing thread), so the late peer connects to it.
        deadline = time.monotonic() + 10
        while not socket_bound(name):
            assert time.monotonic() < deadline, f"nothing holds the socket of `{name}`"
            time.sleep(0.01)
        late = subprocess.run([sys.executable, "-c", LATE_PEER, name],
                              capture_output=True, text=True, timeout=30)
        out = late.stdout.strip()
        assert out.startswith("peer "), out + late.stderr
        _, seconds, pid, message = out.split(" ", 3)
        assert float(seconds) < 2.0, out
        assert int(pid) == creator.pid, out
        assert "its creator" in message and "Cannot allocate memory" in message, out
    finally:
        creator.kill()
        creator.wait()
