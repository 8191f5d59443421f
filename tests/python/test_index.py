"""Pool.index: the crash-consistent index of what a kept pool's slots hold,
read back by the next engine (issue 29's index)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import hostpool

MiB = 1 << 20
SLOTS = 256
BLOCK = 16 * 1024
FP = {"model": "Qwen/Qwen3-0.6B", "dtype": "bfloat16", "block_size": "16", "tp": "1"}


def test_an_index_records_and_gives_back_its_slots_oldest_first():
    nbytes = hostpool.index_bytes(SLOTS)
    assert nbytes % 4096 == 0 and nbytes >= SLOTS * 8
    with hostpool.Pool(4 * MiB + nbytes) as pool:
        idx = pool.index(SLOTS, FP)
        assert not idx.warm and "no index" in idx.cold_reason and idx.cold_field is None
        assert idx.extent == (pool.mapped_bytes - nbytes, nbytes)
        assert idx.capacity == SLOTS and idx.fingerprint == FP and len(idx.digest) == 32
        idx.record(3, b"three")
        idx.record(1, b"one")
        idx.record_many([7, 8], [b"seven", b"eight"])
        idx.touch(3)
        assert idx.entries() == [(1, b"one"), (7, b"seven"), (8, b"eight"), (3, b"three")]
        idx.unrecord_many([7, 8])
        idx.unrecord(1)
        assert len(idx) == 1 and idx.get(1) is None and idx.get(3) == b"three"
        again = pool.index(SLOTS, FP)
        assert again.warm and again.restored == 1 and again.cold_reason is None
        other = pool.index(SLOTS, {**FP, "block_size": "32"})
        assert not other.warm and other.cold_field == ("block_size", "16", "32")
        assert "`block_size` differs: stored 16, now 32" in other.cold_reason
        assert len(other) == 0, "a cold start empties the index"
        with pytest.raises(ValueError, match="outside the index of 256"):
            other.record(SLOTS, b"k")
        with pytest.raises(ValueError, match="longer than the index's 64"):
            other.record(0, b"k" * 65)
        with pytest.raises(ValueError, match="2 slots for 1 keys"):
            other.record_many([0, 1], [b"k"])
    with pytest.raises(hostpool.Error, match="closed"):
        other.record(0, b"k")
    with hostpool.Pool(4 * MiB) as pool:
        with pytest.raises(hostpool.ConfigError, match="page-aligned offset inside the pool"):
            pool.index(SLOTS, FP, offset=5)
        with pytest.raises(hostpool.ConfigError, match="fingerprint"):
            pool.index(SLOTS, {"a=b": "c"})


def test_find_survey_and_touch_many_answer_from_the_key_table():
    nbytes = hostpool.index_bytes(SLOTS)
    with hostpool.Pool(4 * MiB + nbytes) as pool:
        idx = pool.index(SLOTS, FP)
        assert idx.find(b"k") is None
        assert idx.survey() == (list(range(SLOTS)), [])
        keys = [bytes([i]) * 36 for i in range(6)]
        idx.record_many([10, 3, 7, 0, 200, 5], keys)
        assert idx.find(keys[1]) == 3 and idx.find(b"") is None
        assert idx.find(b"k" * 65) is None, "too long: never recorded"
        assert idx.find_many([keys[4], b"absent", keys[0]]) == [200, None, 10]
        assert idx.find_many([]) == []
        idx.touch_many([10, 3])
        free, recorded = idx.survey()
        assert recorded == [7, 0, 200, 5, 10, 3], "oldest use first"
        assert free == sorted(set(range(SLOTS)) - set(recorded))
        assert recorded == [slot for slot, _ in idx.entries()]
        idx.unrecord(7)
        idx.record(3, b"another")
        assert idx.find_many([keys[2], keys[1], b"another"]) == [None, None, 3]
        with pytest.raises(ValueError, match="outside the index of 256"):
            idx.touch_many([1, SLOTS])
        with pytest.raises(TypeError):
            idx.find_many(["str is no key"])
        again = pool.index(SLOTS, FP)
        assert again.warm and again.find(b"another") == 3
        idx.clear()
        assert idx.find(keys[0]) is None and idx.survey()[1] == []
    with pytest.raises(hostpool.Error, match="closed"):
        idx.find(b"k")


def test_the_next_lease_finds_the_recorded_slots_without_reading_them(keeper):
    name = f"py-index-find-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    keeper(name, "--size", str(size), "--content", "keep")
    keys = [i.to_bytes(4, "little") * 9 for i in range(SLOTS)]
    with hostpool.Pool(keeper=name) as pool:
        idx = pool.index(SLOTS, FP)
        idx.record_many(list(range(SLOTS)), keys)
        idx.unrecord_many(list(range(0, SLOTS, 4)))
        idx.touch_many([1, 2])
    with hostpool.Pool(keeper=name) as pool:
        idx = pool.index(SLOTS, FP)
        assert idx.warm, idx.cold_reason
        found = idx.find_many(keys)
        assert found == [None if s % 4 == 0 else s for s in range(SLOTS)]
        free, recorded = idx.survey()
        assert free == list(range(0, SLOTS, 4))
        assert recorded[-2:] == [1, 2] and sorted(recorded) == [s for s in range(SLOTS) if s % 4]
        idx.record(0, b"new in lease two")
    with hostpool.Pool(keeper=name) as pool:
        assert pool.index(SLOTS, FP).find(b"new in lease two") == 0


WRITER = """
import sys, hostpool
name, slots, block, fp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), eval(sys.argv[4])
pool = hostpool.Pool(keeper=name)
idx = pool.index(slots, fp)
print("warm" if idx.warm else "cold", idx.restored, flush=True)
n = int(sys.argv[5])
start = n
while True:
    slot = n % slots
    key = n.to_bytes(8, "little") + slot.to_bytes(4, "little")
    idx.unrecord(slot)                                   # before the bytes are overwritten
    pool.view(slot * block, block)[:] = key[:8] * (block // 8)
    idx.record(slot, key)                                # after they were written whole
    if n == start + 2 * slots:
        print("writing", flush=True)
    n += 1
"""


def entries_hold_their_bytes(pool, idx):
    """Every recorded slot holds the bytes written for its key, whole."""
    bad = []
    for slot, key in idx.entries():
        n = int.from_bytes(key[:8], "little")
        if int.from_bytes(key[8:], "little") != slot or n % SLOTS != slot:
            bad.append((slot, key))
        elif bytes(pool.view(slot * BLOCK, BLOCK)) != key[:8] * (BLOCK // 8):
            bad.append((slot, n))
    return bad


def test_a_kept_pools_index_survives_engines_killed_mid_store(keeper):
    """An engine stores blocks into a kept pool and records them, and is
    SIGKILLed at a random moment, 20 times: every slot the next engine's
    index names holds exactly the bytes stored for its key."""
    name = f"py-index-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    keeper(name, "--size", str(size), "--content", "keep")
    first = True
    for round_ in range(20):
        w = subprocess.Popen(
            [sys.executable, "-c", WRITER, name, str(SLOTS), str(BLOCK), repr(FP), str(round_ * 100_003)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started = w.stdout.readline().split()
        assert started, w.stderr.read()
        assert started[0] == ("cold" if first else "warm"), started
        first = False
        assert w.stdout.readline().strip() == "writing", w.stderr.read()
        time.sleep((time.monotonic_ns() % 3000) / 1e6)  # a random moment of the stores
        w.kill()
        w.wait(timeout=10)
        w.stdout.close()
        w.stderr.close()
        with hostpool.Pool(keeper=name) as pool:
            idx = pool.index(SLOTS, FP)
            assert idx.warm, idx.cold_reason
            assert idx.restored >= SLOTS - 1, "every slot but the one cut short is recorded"
            assert entries_hold_their_bytes(pool, idx) == []
            entries = idx.entries()
            found = idx.find_many([key for _, key in entries])
            wrong = [(s, f) for (s, _), f in zip(entries, found) if f not in (s, None)]
            assert wrong == [], "find names only a slot that holds its key"
            assert found.count(None) <= 1, "only the record whose bucket was cut short is missed"


def keep_status(hostpool_bin, name):
    out = subprocess.run(
        [str(hostpool_bin), "keep", "status", "--name", name, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]


def test_keep_status_shows_the_index_records_and_identity(keeper, hostpool_bin):
    name = f"py-index-status-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    keeper(name, "--size", str(size), "--content", "keep")
    assert keep_status(hostpool_bin, name)["index"] is None, "no index yet"
    with hostpool.Pool(keeper=name) as pool:
        idx = pool.index(SLOTS, FP)
        idx.record_many(list(range(10)), [bytes([i]) * 36 for i in range(10)])
        idx.unrecord(3)
        digest = idx.digest
    st = keep_status(hostpool_bin, name)["index"]
    assert st == {"slots": SLOTS, "records": 9, "digest": digest, "model": FP["model"]}, st
    text = subprocess.run(
        [str(hostpool_bin), "keep", "status", "--name", name], capture_output=True, text=True, timeout=30
    ).stdout
    assert f"index: 9 of {SLOTS} slots recorded, model {FP['model']}, fingerprint {digest}" in text, text


def test_a_cleared_kept_pool_or_another_identity_starts_cold(keeper):
    name = f"py-index-zero-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    keeper(name, "--size", str(size))
    with hostpool.Pool(keeper=name) as pool:
        idx = pool.index(SLOTS, FP)
        idx.record(0, b"k")
    with hostpool.Pool(keeper=name) as pool:
        assert pool.report["keeper"]["content"] == "zero"
        idx = pool.index(SLOTS, FP)
        assert not idx.warm and "no index" in idx.cold_reason
    name = f"py-index-tp-{os.getpid()}"
    keeper(name, "--size", str(size), "--content", "keep")
    with hostpool.Pool(keeper=name) as pool:
        pool.index(SLOTS, FP).record(5, b"k")
    with hostpool.Pool(keeper=name) as pool:
        idx = pool.index(SLOTS, {**FP, "tp": "2"})
        assert idx.cold_field == ("tp", "1", "2") and len(idx) == 0
    with hostpool.Pool(keeper=name) as pool:
        idx = pool.index(SLOTS, FP)
        assert not idx.warm, "the other identity's cold start emptied it"
