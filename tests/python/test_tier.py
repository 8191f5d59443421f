"""Pool.tier_*: the CPU tier a keeper of `--tenants N` writes for its engines
(issue 41): a block one engine stored is the other's hit, read in place from the
same memory; two stores of one key end with one record; a held block survives a
flood; an engine SIGKILLed mid-store and holding a load leaves no write and no hold."""

from __future__ import annotations

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


def _kept(keeper, tag):
    name = f"py-tier-{tag}-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    keeper(name, "--size", str(size), "--content", "keep", "--tenants", "2")
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
