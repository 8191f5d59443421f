"""hostpool.Pool(keeper=...): an engine leases a pool that `hostpool keep`
built and keeps, instead of building it (issue 19)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

import hostpool

MiB = 1 << 20


def test_a_pool_leased_from_a_keeper_comes_resident_and_keeps_its_bytes(keeper):
    name = f"py-keep-{os.getpid()}"
    ready = keeper(name, "--size", "8MiB", "--content", "keep")
    with hostpool.Pool(keeper=name, keeper_tag="model-a") as pool:
        lease = pool.report["keeper"]
        assert lease["name"] == name and lease["generation"] == 1 and lease["content"] == "keep"
        assert lease["instance"] == ready["instance"] and lease["previous"] is None
        assert lease["tag"] is None
        assert pool.report["prefault"]["bytes"] == 0
        assert pool.nbytes == 8 * MiB and pool.backing == "shm-segmented"
        pool.view(4 * MiB, 5)[:] = b"kvkv!"
    with hostpool.Pool(keeper=name, size="8MiB") as again:
        lease = again.report["keeper"]
        assert lease["generation"] == 2 and lease["tag"] == "model-a"
        assert lease["previous"]["how"] == "closed" and lease["previous"]["pid"] == os.getpid()
        assert bytes(again.view(4 * MiB, 5)) == b"kvkv!"


def test_a_zeroed_pool_shows_no_bytes_of_the_previous_lease(keeper):
    name = f"py-zero-{os.getpid()}"
    keeper(name, "--size", "4MiB")
    with hostpool.Pool(keeper=name) as pool:
        pool.view(0, 4)[:] = b"old!"
    with hostpool.Pool(keeper=name) as pool:
        assert pool.report["keeper"]["content"] == "zero"
        assert bytes(pool.view(0, 4)) == b"\0\0\0\0"


def test_a_second_lease_is_refused_naming_the_holder(keeper):
    name = f"py-busy-{os.getpid()}"
    keeper(name, "--size", "4MiB")
    with hostpool.Pool(keeper=name):
        with pytest.raises(hostpool.KeeperError, match=f"leased by pid {os.getpid()}") as e:
            hostpool.Pool(keeper=name)
        assert e.value.pid == os.getpid() and e.value.keeper == name and not e.value.absent
        assert e.value.exit_code == 1


def test_a_missing_keeper_fails_or_falls_back_as_the_config_says():
    name = f"py-absent-{os.getpid()}"
    with pytest.raises(hostpool.KeeperError, match=f"@hostpool-keep/{name}") as e:
        hostpool.Pool(keeper=name, size="4MiB")
    assert e.value.absent and e.value.keeper == name and e.value.pid is None
    with hostpool.Pool(keeper=name, size="4MiB", keeper_fallback="build") as pool:
        assert "keeper" not in pool.report
        assert "no keeper answers" in pool.report["keeper_fallback"]
        assert pool.report["prefault"]["bytes"] == 4 * MiB
    with pytest.raises(hostpool.ConfigError, match="keeper_fallback"):
        hostpool.Pool(size="4MiB", keeper_fallback="build")
    with pytest.raises(hostpool.ConfigError, match="keeper fallback"):
        hostpool.Pool(keeper=name, keeper_fallback="maybe")


def test_the_size_asked_for_must_be_the_kept_pools(keeper):
    name = f"py-size-{os.getpid()}"
    keeper(name, "--size", "4MiB")
    with pytest.raises(hostpool.ConfigError, match="asks for 8 MiB, but kept pool"):
        hostpool.Pool(keeper=name, size="8MiB")
    with hostpool.Pool.from_config({"lease": {"keeper": name}, "size": "4MiB"}) as pool:
        assert pool.report["keeper"]["name"] == name


def test_lease_keys_are_checked_and_a_stopped_keeper_is_waited_for_as_long_as_asked(keeper):
    name = f"py-stopped-{os.getpid()}"
    ready = keeper(name, "--size", "4MiB")
    for kwargs, says in [
        ({"keeper": "a b"}, "lease.keeper name `a b`"),
        ({"keeper": name, "keeper_tag": "t" * 20000}, r"Python keeper_tag=\) is 20000 bytes"),
        ({"keeper": name, "keeper_attach_timeout": 0.0}, r"Python keeper_attach_timeout=\) = 0 s"),
        ({"keeper": name, "keeper_attach_timeout": float("inf")}, "at most one day"),
        ({"keeper_attach_timeout": 1.0}, r"keeper_attach_timeout=\) is given but no keeper"),
    ]:
        with pytest.raises(hostpool.ConfigError, match=says):
            hostpool.Pool(**kwargs)
    # A config's lease keys are one table; the old flat keys name their place in it.
    with pytest.raises(hostpool.ConfigError, match=r"`keeper_tag` moved into the \[lease\] table as `tag`"):
        hostpool.Pool.from_config({"keeper_tag": "x", "size": "4MiB"})
    with pytest.raises(hostpool.ConfigError, match="is given but no keeper"):
        hostpool.Pool.from_config({"lease": {"tag": "x"}, "size": "4MiB"})
    os.kill(ready["pid"], signal.SIGSTOP)
    try:
        t = time.monotonic()
        with pytest.raises(hostpool.KeeperError, match="it is stopped") as e:
            hostpool.Pool(keeper=name, keeper_attach_timeout=1.0)
        took = time.monotonic() - t
        assert e.value.pid == ready["pid"] and "within 1 s" in str(e.value)
        assert took < 4, took
        t = time.monotonic()
        with pytest.raises(hostpool.KeeperError, match="it is stopped"):
            hostpool.Pool.from_config({"lease": {"keeper": name, "attach_timeout_secs": 0.5}})
        assert time.monotonic() - t < 3
    finally:
        os.kill(ready["pid"], signal.SIGCONT)
    # The two that gave up were no leases: the next is the first.
    with hostpool.Pool(keeper=name) as pool:
        assert pool.report["keeper"]["generation"] == 1
        assert pool.report["keeper"]["previous"] is None


KILLED = """
import sys, time, hostpool
pool = hostpool.Pool(keeper=sys.argv[1])
pool.view(0, 6)[:] = b"before"
print(pool.report["keeper"]["generation"], flush=True)
time.sleep(60)
"""


def test_an_engine_killed_mid_lease_is_reported_as_died(keeper):
    import sys

    name = f"py-died-{os.getpid()}"
    keeper(name, "--size", "4MiB", "--content", "keep")
    p = subprocess.Popen([sys.executable, "-c", KILLED, name], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "1"
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 5
    while True:
        try:
            pool = hostpool.Pool(keeper=name)
            break
        except hostpool.KeeperError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    with pool:
        prev = pool.report["keeper"]["previous"]
        assert prev["how"] == "died" and prev["pid"] == p.pid
        assert bytes(pool.view(0, 6)) == b"before"


RANK = """
import json, sys, hostpool
name, engine, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
with hostpool.Pool(keeper=name, shared=hostpool.Shared(engine, 2, rank)) as pool:
    if rank == 0:
        pool.view(100, 5)[:] = b"rank0"
    print(json.dumps({"lease": pool.report["keeper"], "sharing": pool.report["sharing"],
                      "shard": list(pool.shard)}), flush=True)
    sys.stdin.readline()
    print(bytes(pool.view(100, 5)).decode(), flush=True)
"""


def _ranks(name, engine):
    """Ranks 0 and 1 of `engine` leasing kept pool `name` (the RANK script)."""
    import sys

    return [subprocess.Popen([sys.executable, "-c", RANK, name, engine, str(r)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in (0, 1)]


def test_the_ranks_of_one_engine_share_one_lease(keeper):
    name = f"py-ranks-{os.getpid()}"
    keeper(name, "--size", "8MiB")
    engine = f"py-engine-{os.getpid()}"
    ranks = _ranks(name, engine)
    try:
        said = [json.loads(p.stdout.readline() or "null") for p in ranks]
        assert all(said), [p.stderr.read() for p in ranks]
        for r, s in enumerate(said):
            assert s["lease"]["generation"] == 1, s
            assert s["sharing"]["rank"] == r and s["sharing"]["rendezvous"] == "keeper", s
        assert said[0]["shard"] != said[1]["shard"]
        for p in ranks:
            p.stdin.write("\n")
            p.stdin.flush()
        # Both map the same memory: rank 1 reads what rank 0 wrote.
        assert [p.stdout.readline().strip() for p in ranks] == ["rank0", "rank0"]
        assert [p.wait(timeout=10) for p in ranks] == [0, 0]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()


def _status(hostpool_bin, name):
    out = subprocess.run([str(hostpool_bin), "keep", "status", "--name", name, "--json"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    [status] = json.loads(out.stdout)
    return status


def test_a_companion_maps_its_engines_lease_and_the_lease_ends_after_it(keeper, hostpool_bin):
    """Issue 29: vLLM's scheduler is none of its engine's ranks, yet it keeps the
    kept pool's index: it maps the lease its ranks hold as their companion."""
    name = f"py-comp-{os.getpid()}"
    keeper(name, "--size", "8MiB", "--content", "keep")
    engine = f"py-engine-{os.getpid()}"
    companion = {"lease": {"keeper": name, "companion_of": engine}}
    # No lease of the engine yet: a companion starts none.
    with pytest.raises(hostpool.KeeperError, match=f"no lease of engine `{engine}`") as e:
        hostpool.Pool.from_config(companion)
    assert not e.value.absent
    # Its keys are a companion's, never a rank's.
    with pytest.raises(hostpool.ConfigError, match="`sharing` is for an engine's ranks"):
        hostpool.Pool.from_config({**companion, "sharing": {"name": engine, "world": 2, "rank": 0}})
    ranks = _ranks(name, engine)
    try:
        said = [json.loads(p.stdout.readline() or "null") for p in ranks]
        assert all(said), [p.stderr.read() for p in ranks]
        with pytest.raises(hostpool.KeeperError, match=f"leased by engine `{engine}`"):
            hostpool.Pool.from_config({"lease": {"keeper": name, "companion_of": "another-engine"}})
        pool = hostpool.Pool.from_config(companion)
        lease = pool.report["keeper"]
        # The same lease: no generation of its own, the whole pool mapped.
        assert lease["generation"] == said[0]["lease"]["generation"] == 1
        assert lease["companion_of"] == engine and pool.nbytes == 8 * MiB
        assert bytes(pool.view(100, 5)) == b"rank0"
        status = _status(hostpool_bin, name)
        assert status["lease"]["companions"] == [{"pid": os.getpid(), "uid": os.getuid()}]
        for p in ranks:
            p.stdin.write("\n")
            p.stdin.flush()
        assert [p.wait(timeout=10) for p in ranks] == [0, 0]
        # The ranks released; the lease lasts while the companion maps the pool.
        assert _status(hostpool_bin, name)["state"] == "leased"
        pool.view(200, 4)[:] = b"kept"
        pool.close()
        deadline = time.monotonic() + 10
        while _status(hostpool_bin, name)["state"] != "idle":
            assert time.monotonic() < deadline, _status(hostpool_bin, name)
            time.sleep(0.05)
        with hostpool.Pool(keeper=name) as again:
            assert again.report["keeper"]["generation"] == 2
            assert again.report["keeper"]["previous"]["how"] == "closed"
            assert bytes(again.view(200, 4)) == b"kept"
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
