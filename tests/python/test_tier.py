"""Pool.tier_*: the CPU tier a keeper of `--tenants N` writes for its engines
(issue 41): a block one engine stored is the other's hit, read in place from the
same memory; two stores of one key end with one record; a held block survives a
flood; an engine SIGKILLed mid-store and holding a load leaves no write and no hold.
Pool.tier_open: the keeper formats the index for an engine's identity, and refuses
another identity while an engine of the first is in the tier; keep status counts
each engine's stores and hits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import hostpool

SLOTS = 16
BLOCK = 64 * 1024
FP = {"model": "m", "block_size": "16"}


def _kept(keeper, tag, tenants=2):
    name = f"py-tier-{tag}-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    keeper(name, "--size", str(size), "--content", "keep", "--tenants", str(tenants))
    return name


def _granted(puts):
    assert all(p[0] == "granted" for p in puts), puts
    return [p[1] for p in puts]


def test_a_block_one_engine_stores_is_the_others_hit_read_in_place(keeper):
    name = _kept(keeper, "hit")
    with hostpool.Pool(keeper=name) as a, hostpool.Pool(keeper=name) as b:
        assert a.report["keeper"]["instance"] == b.report["keeper"]["instance"]
        ia, ib = a.index(SLOTS, FP), b.index(SLOTS, FP)
        assert ib.warm, ib.cold_reason
        slots = _granted(a.tier_store([b"k1", b"k2"]))
        for slot, byte in zip(slots, (1, 2)):
            a.view(slot * BLOCK, BLOCK)[:] = bytes([byte]) * BLOCK
        # Being written: no hit for anyone, and a second store is told so.
        assert ib.find(b"k1") is None
        assert b.tier_store([b"k1"]) == [("in_flight", None, None)]
        assert b.tier_load([b"k1"]) == [None]
        assert a.tier_stored(slots) == 2
        assert ib.find(b"k1") == slots[0]
        assert b.tier_store([b"k1"]) == [("stored", slots[0], None)]
        held = b.tier_load([b"k1", b"k2", b"missing"])
        assert held == [slots[0], slots[1], None]
        assert bytes(b.view(slots[1] * BLOCK, BLOCK)) == bytes([2]) * BLOCK
        assert b.tier_loaded(held[:2]) == 2
        # Not a's to complete twice, nor b's to release again.
        assert a.tier_stored(slots) == 0 and b.tier_loaded(held[:2]) == 0
        assert len(ia) == 2


def test_a_held_block_survives_another_engine_flooding_the_tier(keeper):
    name = _kept(keeper, "flood")
    with hostpool.Pool(keeper=name) as a, hostpool.Pool(keeper=name) as b:
        a.index(SLOTS, FP)
        [slot] = _granted(b.tier_store([b"held"]))
        b.view(slot * BLOCK, 4)[:] = b"held"
        b.tier_stored([slot])
        assert b.tier_load([b"held"]) == [slot]
        for i in range(SLOTS * 4):
            key = i.to_bytes(4, "little")
            [put] = a.tier_store([key])
            assert put[0] == "granted" and put[1] != slot, put
            a.tier_stored([put[1]])
        assert bytes(b.view(slot * BLOCK, 4)) == b"held"
        assert b.tier_loaded([slot]) == 1


DIES = """
import os, sys, time, hostpool
pool = hostpool.Pool(keeper=sys.argv[1])
[put] = pool.tier_store([b"torn"])
pool.view(put[1] * int(sys.argv[2]), 4)[:] = b"torn"
assert pool.tier_load([b"kept"]) != [None]
print("ready", flush=True)
time.sleep(60)
"""


def test_an_engine_killed_mid_store_and_holding_a_load_leaves_nothing(keeper):
    name = _kept(keeper, "killed")
    with hostpool.Pool(keeper=name) as a:
        a.index(SLOTS, FP)
        [kept] = _granted(a.tier_store([b"kept"]))
        a.tier_stored([kept])
        child = subprocess.Popen(
            [sys.executable, "-c", DIES, name, str(BLOCK)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            assert a.tier_store([b"torn"]) == [("in_flight", None, None)]
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        # The keeper saw it die: its write in flight is dropped (never a
        # hit), so the key can be stored again; its hold is released, so
        # the flood below may evict `kept`.
        deadline = 30
        t = time.monotonic()
        while True:
            put = a.tier_store([b"torn"])[0]
            if put[0] == "granted":
                break
            assert put[0] == "in_flight" and time.monotonic() - t < deadline, put
            time.sleep(0.05)
        assert a.index(SLOTS, FP).find(b"torn") is None
        a.tier_abort([put[1]])
        evicted = set()
        for i in range(SLOTS * 2):
            [p] = a.tier_store([i.to_bytes(4, "little")])
            assert p[0] == "granted", p
            evicted.add(p[2])
            a.tier_stored([p[1]])
        assert b"kept" in evicted, "a dead engine's hold was never released"


def test_a_pool_not_leased_has_no_tier():
    with hostpool.Pool(1 << 20) as pool:
        with pytest.raises(hostpool.ConfigError, match="the tier is a keeper's"):
            pool.tier_store([b"k"])


OTHER = {"model": "other", "block_size": "16"}


def _keep_status(hostpool_bin, name):
    out = subprocess.run(
        [str(hostpool_bin), "keep", "status", "--name", name, "--json"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]


def _store(pool, keys, byte):
    """Store `keys` through the tier, each slot's bytes `byte`: their slots."""
    slots = _granted(pool.tier_store(keys))
    for slot in slots:
        pool.view(slot * BLOCK, BLOCK)[:] = bytes([byte]) * BLOCK
    assert pool.tier_stored(slots) == len(slots)
    return slots


def test_the_keeper_opens_the_tier_for_one_identity_and_refuses_another_until_its_holders_go(keeper):
    name = _kept(keeper, "open", tenants=3)
    a = hostpool.Pool(keeper=name)
    b = hostpool.Pool(keeper=name)
    c = hostpool.Pool(keeper=name)
    try:
        assert a.report["keeper"]["tenants"] == 3, a.report["keeper"]
        # (a) One identity: the first open formats the index (cold), the
        # second finds it warm; both read the same records in place.
        ia = a.tier_open(SLOTS, FP)
        assert not ia.warm and ia.cold_reason == "the kept pool holds no index (new, or cleared)"
        assert ia.cold_field is None
        slots = _store(a, [b"k1", b"k2"], 7)
        ib = b.tier_open(SLOTS, FP)
        assert ib.warm and ib.cold_reason is None and ib.cold_field is None, ib.cold_reason
        assert [ib.find(b"k1"), ib.find(b"k2")] == slots == [ia.find(b"k1"), ia.find(b"k2")]
        assert ib.get(slots[0]) == b"k1" and len(ib) == len(ia) == 2
        assert b.tier_load([b"k2"]) == [slots[1]]
        assert bytes(b.view(slots[1] * BLOCK, BLOCK)) == bytes([7]) * BLOCK
        b.tier_loaded([slots[1]])
        # The engine reads the keeper's index; it never writes it.
        with pytest.raises(hostpool.ConfigError, match="the keeper's CPU tier"):
            ib.record(0, b"mine")
        with pytest.raises(hostpool.ConfigError, match="KvIndex.clear"):
            ib.clear()
        # (b) Another identity, while a and b are in the tier: refused,
        # naming the field, both values and the engines that hold it; the
        # index is untouched.
        with pytest.raises(hostpool.KeeperError) as refused:
            c.tier_open(SLOTS, OTHER)
        message = str(refused.value)
        assert message.startswith(f"kept pool `{name}`'s CPU tier is shared by an engine without an id (pid "), message
        assert f'(pid {os.getpid()}, since ' in message and message.count("an engine without an id") == 2, message
        assert '`model` is "m" there, "other" here' in message, message
        assert "start this engine with the same config, or on another keeper" in message, message
        assert refused.value.keeper == name
        with pytest.raises(hostpool.KeeperError, match="`slots` is 16 there, 8 here"):
            c.tier_open(SLOTS // 2, FP)
        assert [ia.find(b"k1"), ia.find(b"k2")] == slots and len(ia) == 2, "a's records are intact"
        assert b.tier_load([b"k1"]) == [slots[0]]
        b.tier_loaded([slots[0]])
    finally:
        a.close()
        b.close()
    try:
        # (c) Its holders gone (the keeper reaps each lease as it ends), the
        # other identity opens cold, naming the field.
        deadline = time.monotonic() + 30
        while True:
            try:
                ic = c.tier_open(SLOTS, OTHER)
                break
            except hostpool.KeeperError as e:
                assert "for another identity" in str(e) and time.monotonic() < deadline, e
                time.sleep(0.05)
        assert not ic.warm and ic.cold_field == ("model", "m", "other"), ic.cold_reason
        assert ic.cold_reason == "`model` differs: stored m, now other"
        assert ic.find(b"k1") is None and len(ic) == 0
        assert c.tier_load([b"k1"]) == [None]
        # The keeper counts the opens: a's and c's cold, b's warm (a restore);
        # the refused ones are none.
        assert hostpool.keeper_status(name)["tier"]["opens"] == {"warm": 1, "cold": 2}
    finally:
        c.close()


def test_keep_status_counts_each_engines_stores_and_hits(keeper, hostpool_bin):
    name = _kept(keeper, "figures")
    with hostpool.Pool(keeper=name) as a, hostpool.Pool(keeper=name) as b:
        a.tier_open(SLOTS, FP)
        b.tier_open(SLOTS, FP)
        stored = _store(a, [b"s1", b"s2", b"s3"], 1)
        assert b.tier_load([b"s1", b"s2", b"missing"]) == [stored[0], stored[1], None]
        b.tier_loaded(stored[:2])
        [own] = _store(b, [b"b1"], 2)
        assert b.tier_load([b"b1"]) == [own]
        b.tier_loaded([own])
        assert a.tier_load([b"b1", b"s3"]) == [own, stored[2]]
        a.tier_loaded([own, stored[2]])
        st = _keep_status(hostpool_bin, name)
        figures = {
            t["generation"]: (t["stored"], t["hits"], t["hits_from_others"]) for t in st["tenants"]
        }
        gen = (a.report["keeper"]["generation"], b.report["keeper"]["generation"])
        assert figures == {gen[0]: (3, 2, 1), gen[1]: (1, 3, 2)}, st["tenants"]
        text = subprocess.run(
            [str(hostpool_bin), "keep", "status", "--name", name], capture_output=True, text=True, timeout=30
        ).stdout
        assert "tier: 3 stored, 2 hit(s) (1 stored by others)" in text, text
        assert "tier: 1 stored, 3 hit(s) (2 stored by others)" in text, text


def test_a_hold_takes_the_prefix_stored_after_a_key_in_one_call(keeper):
    name = _kept(keeper, "hold")
    with hostpool.Pool(keeper=name) as a, hostpool.Pool(keeper=name) as b:
        index = a.tier_open(SLOTS, FP)
        slots = _granted(a.tier_store([b"c0", b"c1", b"c2"]))
        a.tier_stored(slots)
        assert b.tier_hold(b"missing", 8) == []
        held = b.tier_hold(b"c0", 8)
        assert held == [(b"c0", slots[0]), (b"c1", slots[1]), (b"c2", slots[2])]
        assert b.tier_hold(b"c1") == [(b"c1", slots[1])], "ahead = 0: the key alone"
        # Held: a flood of stores never takes them.
        for i in range(SLOTS * 2):
            [p] = a.tier_store([b"f%d" % i])
            if p[0] == "granted":
                assert p[1] not in slots, p
                a.tier_stored([p[1]])
        assert [index.find(k) for k in (b"c0", b"c1", b"c2")] == slots
        # Read: counted as b's hits from another's blocks; released unread: not.
        assert b.tier_loaded([slots[0]]) == 1
        assert b.tier_release([slots[1], slots[1], slots[2]]) == 3
        [mine] = [t for t in hostpool.keeper_status(name)["tenants"] if b.report["keeper"]["generation"] == t["generation"]]
        assert (mine["hits"], mine["hits_from_others"]) == (1, 1), mine


# --- a keeper that stops, or dies, never fails or stalls its engines (issue 48) ---

BOUND = 0.010
"""The bound the engines' manager waits for the keeper (`_vllm_tier.WAIT`)."""

SLACK = 0.5
"""What a loaded two-core machine may add to a bounded call (it is still far
below the 30 s a request waited before)."""


def _timed(call):
    t = time.monotonic()
    try:
        return call(), time.monotonic() - t
    except hostpool.KeeperError as e:
        return e, time.monotonic() - t


def _stopped(pid):
    """Whether every thread of process `pid` is stopped (a SIGSTOP took)."""
    tasks = os.listdir(f"/proc/{pid}/task")
    states = []
    for t in tasks:
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return all(s == "T" for s in states)


def _until(check, what, deadline=30.0):
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def test_a_stopped_keeper_costs_a_tenant_its_bound_and_a_late_grant_is_given_back(keeper):
    name = _kept(keeper, "stopped")
    with hostpool.Pool(keeper=name) as a, hostpool.Pool(keeper=name) as b:
        a.index(SLOTS, FP)
        assert a.tier_link == ("none", None)
        [kept] = _granted(a.tier_store([b"kept"]))
        a.tier_stored([kept])
        assert a.tier_link == ("up", None)
        pid = a.report["keeper"]["keeper_pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            _until(lambda: _stopped(pid), "the keeper stops")
            # An ask waits its bound and no more, and says the keeper is away.
            got, took = _timed(lambda: a.tier_store([b"late"], timeout=BOUND))
            assert isinstance(got, hostpool.KeeperError) and not got.absent, got
            assert "did not answer within 10.0 ms" in str(got), got
            assert BOUND <= took < BOUND + SLACK, took
            assert a.tier_link[0] == "away", a.tier_link
            # While away, asks fail at once and tells are kept, never waited for.
            for call in (
                lambda: a.tier_hold(b"kept", 4, timeout=5.0),
                lambda: a.tier_stored([kept], wait=False),
                lambda: a.tier_release([kept], wait=False),
                lambda: a.tier_touch([b"kept"], wait=False),
            ):
                got, took = _timed(call)
                assert took < SLACK, (call, took)
            # Another tenant's process is not held up by a's link either.
            got, took = _timed(lambda: b.tier_store([b"other"], timeout=BOUND))
            assert isinstance(got, hostpool.KeeperError) and took < BOUND + SLACK, (got, took)
        finally:
            os.kill(pid, signal.SIGCONT)
        # The keeper answers the asks it had: the link is back by itself, and
        # the chunk it granted `late` after a had stopped waiting was given
        # back (not left in flight, which would refuse every store of it).
        _until(lambda: a.tier_link == ("up", None), "a's link comes back once the keeper answers")
        _until(lambda: b.tier_link == ("up", None), "b's link comes back once the keeper answers")
        for pool in (a, b):
            puts = pool.tier_store([b"late" if pool is a else b"other"])
            assert puts[0][0] == "granted", puts
            pool.tier_abort([puts[0][1]])
        assert a.tier_load([b"kept"]) == [kept]
        assert a.tier_loaded([kept]) == 1


def test_a_keeper_that_dies_loses_the_link_at_once_and_its_engine_goes_on(hostpool_bin):
    name = f"py-tier-dies-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    proc = subprocess.Popen(
        [str(hostpool_bin), "keep", "--name", name, "--json", "--backing", "shm-segmented", "--size", str(size),
         "--content", "keep", "--tenants", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline(), proc.stderr.read()
        with hostpool.Pool(keeper=name) as a:
            index = a.index(SLOTS, FP)
            [kept] = _granted(a.tier_store([b"kept"]))
            a.view(kept * BLOCK, 4)[:] = b"kept"
            a.tier_stored([kept])
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
            got, took = _timed(lambda: a.tier_hold(b"kept", 0, timeout=5.0))
            assert isinstance(got, hostpool.KeeperError) and got.absent, got
            assert took < SLACK, took
            assert a.tier_link[0] == "lost", a.tier_link
            got, took = _timed(lambda: a.tier_stored([kept], wait=False))
            assert isinstance(got, hostpool.KeeperError) and got.absent and took < SLACK, got
            # The memory and the index stay, read in place.
            assert index.find(b"kept") == kept
            assert bytes(a.view(kept * BLOCK, 4)) == b"kept"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
