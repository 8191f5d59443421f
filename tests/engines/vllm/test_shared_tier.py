"""Issue 41: the vLLM engines of a node share one CPU tier, a keeper's of `--tenants N`.

Each engine is its own process(es) (``tier_engine.py``): vLLM's ``Scheduler``
with its ``OffloadingConnector`` and our ``HostPoolOffloadingSpec``, the
connector's worker role over CPU tensors in place of the GPU KV cache, and a
real ``hostpool keep --tenants N``. Every engine names the tier's size in
``cpu_bytes_to_use`` and the keeper is exactly that size. The engines'
GPU prefix cache is off (``enable_prefix_caching``), so every request asks
the CPU tier. Every block's bytes are a function of its block hash, layer and
rank, so a block one engine loads is checked byte for byte against what
another stored.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid

import pytest

import hostpool

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "tier_engine.py")
sys.path.insert(0, HERE)

from test_kept_tier import BLOCK, Generation, Keeper  # noqa: E402

CHUNK = 4096  # a block's bytes per rank: 2 layers of (K, V) x 16 tokens x 2 heads x 16 x fp16
CPU = 96 * CHUNK  # cpu_bytes_to_use, and the keeper's size


@pytest.fixture
def name():
    return f"st-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def model(tmp_path):
    import vllm_engine

    return vllm_engine.model_dir(str(tmp_path))


class Engine(Generation):
    """One engine process (``tier_engine.py``), driven by commands, each answered by one event."""

    def __init__(self, name: str, model: str, engine: str, env: dict | None = None, **kw) -> None:
        table = {"lease": {"keeper": name}, "threads": 1}
        args = {
            "engine": engine,
            "model": model,
            "cpu_bytes": kw.pop("cpu_bytes", CPU),
            "table": table,
            "prefix_caching": False,
            **kw,
        }
        super().__init__(args, env=env, script=ENGINE)

    def ask(self, op: str, reply: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.until(reply)

    def run(self, seqs: list[list[int]]) -> dict:
        out = self.ask("run", "ran", seqs=seqs)
        assert out["bad"] == [], out
        return out

    def close(self) -> str:
        """A clean exit, or the exit of an engine that was refused (3)."""
        return super().close(codes=(0, 3))


def full(seed: int, blocks: int = 4) -> list[int]:
    """A prompt of ``blocks`` full blocks (and a token of the next)."""
    return [seed, blocks * BLOCK + 1]


def share_again(a: "Engine", b: "Engine", seed: int, since: float, within: float = 60) -> int:
    """Run new blocks on A, then on B, until B's first step hits all A stored,
    byte for byte (within ``within`` seconds of ``since``): the two share
    again. The seed whose blocks did."""
    while True:
        seed += 1
        a.run([full(seed)])
        ran = b.run([full(seed)])
        if ran["first_step_hits"] == {str(seed): 4 * BLOCK}:
            assert ran["good"] == 4, ran
            return seed
        assert time.monotonic() - since < within, ran


def wait_recorded(keeper: "Keeper", n: int, timeout: float = 30) -> None:
    """Until the keeper's index records ``n`` blocks: a completion is told
    without waiting, so the keeper may not have read it yet (a keeper killed
    before it does loses the record, never the bytes of another block)."""
    deadline = time.monotonic() + timeout
    while (keeper.status()["index"] or {}).get("records", 0) < n:
        assert time.monotonic() < deadline, keeper.status()["index"]
        time.sleep(0.02)


def wait_tenants(name: str, n: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = hostpool.keeper_status(name)
        if len(s["tenants"]) == n or time.monotonic() > deadline:
            assert len(s["tenants"]) == n, s["tenants"]
            return s
        time.sleep(0.02)


@pytest.mark.parametrize("events", [False, True], ids=["events-off", "events-on"])
def test_two_engines_hit_what_the_other_stored_byte_for_byte(name, model, events):
    keeper = Keeper(name, size=CPU, tenants=2)
    a = b = None
    try:
        a = Engine(name, model, "replica_dp0", events=events)
        started = a.until("started")
        assert started["manager"] == "SharedTierManager", started
        # A keeper of exactly cpu_bytes_to_use holds the tier and its index.
        chunks = started["chunks"]
        assert 0 < chunks < CPU // CHUNK and chunks * CHUNK + hostpool.index_bytes(chunks) <= CPU, started
        first = [full(s) for s in (1, 2, 3)]
        assert set(a.run(first)["first_step_hits"].values()) == {0}
        # B, a DP replica of the same model: its first step hits every block A stored.
        b = Engine(name, model, "replica_dp1", dp_index=1, events=events)
        b.until("started")
        ran = b.run(first)
        assert ran["first_step_hits"] == {str(s[0]): 4 * BLOCK for s in first}, ran
        assert ran["good"] == 12, ran
        if events:
            # What vLLM's scheduler publishes for a router, as for its own
            # manager: A's stores; B stored nothing (it hit A's blocks), so B
            # publishes none of them (docs/engines.md).
            assert a.ask("events", "events") == {"event": "events", "stored": 12, "removed": 0}
            assert b.ask("events", "events")["stored"] == 0
        # A, still running, hits what B stored after A started.
        later = [full(s) for s in (7, 8)]
        b.run(later)
        ran = a.run(later)
        assert ran["first_step_hits"] == {"7": 4 * BLOCK, "8": 4 * BLOCK} and ran["good"] == 8, ran
        status = keeper.status()
        assert status["index"]["slots"] == chunks, status["index"]
        tenants = {t["engine"]: t for t in status["tenants"]}
        assert set(tenants) == {"vllm-replica_dp0", "vllm-replica_dp1"}, tenants
    finally:
        for e in (a, b):
            if e is not None:
                e.close()
        keeper.stop()


def test_overlapping_keys_for_many_rounds_one_record_each_and_every_hit_exact(name, model):
    rng = random.Random(int(os.environ.get("HOSTPOOL_KILL_SEED", "41")))
    keeper = Keeper(name, size=CPU, tenants=2)
    engines = []
    try:
        engines = [Engine(name, model, "over_a"), Engine(name, model, "over_b", dp_index=1)]
        for e in engines:
            e.until("started")
        hits = 0
        for _ in range(24):
            for e in engines:
                # Sequences of one family share prefixes: overlapping keys.
                seqs = [[rng.randint(1, 8), rng.choice([2, 3, 5]) * BLOCK + 1] for _ in range(3)]
                ran = e.run(seqs)
                hits += ran["good"]
        assert hits > 50, f"{hits} blocks loaded: the rounds overlapped too little to prove anything"
        entries = engines[0].ask("entries", "entries")["entries"]
        keys = [k for _, k in entries]
        assert len(keys) == len(set(keys)), "a key recorded twice"
        slots = [s for s, _ in entries]
        assert len(slots) == len(set(slots))
    finally:
        for e in engines:
            e.close()
        keeper.stop()


def test_a_load_held_by_one_engine_survives_another_flooding_the_tier(name, model):
    keeper = Keeper(name, size=CPU, tenants=2)
    a = b = None
    try:
        a = Engine(name, model, "flood_a")
        chunks = a.until("started")["chunks"]
        b = Engine(name, model, "held_b", dp_index=1)
        b.until("started")
        held = [full(s) for s in (1, 2)]
        a.run(held)
        # B's step prepared its loads (held in the tier), not yet read.
        scheduled = b.ask("schedule", "scheduled", seqs=held)
        assert scheduled["first_step_hits"] == {"1": 4 * BLOCK, "2": 4 * BLOCK}, scheduled
        # A stores three times the tier's capacity of new blocks meanwhile.
        for i in range(0, 3 * chunks // 4, 4):
            a.run([full(1000 + i + j) for j in range(4)])
        stats = a.ask("stats", "stats")
        assert stats["evicted"] >= chunks - 8, stats
        finished = b.ask("finish", "finished")
        assert finished["bad"] == [] and finished["good"] == 8, finished
    finally:
        for e in (a, b):
            if e is not None:
                e.close()
        keeper.stop()


def test_two_engines_of_tp_2_share_rank_by_rank(name, model):
    keeper = Keeper(name, size=2 * CPU, tenants=2)
    a = b = None
    try:
        a = Engine(name, model, "tp_a", tp=2, cpu_bytes=2 * CPU)
        a.until("workers")
        assert a.until("started")["manager"] == "SharedTierManager"
        seqs = [full(s) for s in (4, 5, 6)]
        a.run(seqs)
        b = Engine(name, model, "tp_b", tp=2, cpu_bytes=2 * CPU, dp_index=1)
        b.until("workers")
        b.until("started")
        ran = b.run(seqs)
        assert ran["first_step_hits"] == {str(s[0]): 4 * BLOCK for s in seqs}, ran
        # Both ranks' halves of every block: each rank read what the same rank of A wrote.
        assert ran["good"] == 12 * 2, ran
        status = keeper.status()
        assert [len(t["ranks"]) for t in status["tenants"]] == [2, 2], status["tenants"]
    finally:
        for e in (a, b):
            if e is not None:
                e.close()
        keeper.stop()


def test_an_engine_beyond_the_limit_and_another_identity_are_refused_naming_why(name, model):
    keeper = Keeper(name, size=CPU, tenants=2)
    a = b = None
    try:
        a = Engine(name, model, "first")
        a.until("started")
        a.run([full(3)])
        # Another identity (another dtype) while A holds the tier: refused, naming it.
        other = Engine(name, model, "other", dtype="bfloat16")
        refused = other.until("refused", "started")
        assert refused["event"] == "refused", refused
        assert "dtype" in refused["error"] and "float16" in refused["error"] and "bfloat16" in refused["error"], refused
        assert "first" in refused["error"], refused
        other.close()
        # A's blocks are intact.
        b = Engine(name, model, "second", dp_index=1)
        b.until("started")
        assert b.run([full(3)])["good"] == 4
        # A third engine of the same identity is beyond --tenants 2: refused at once.
        t0 = time.monotonic()
        third = Engine(name, model, "third")
        refused = third.until("refused", "started")
        assert refused["event"] == "refused" and "--tenants 2" in refused["error"], refused
        assert time.monotonic() - t0 < 60
        third.close()
        # Once no engine holds it, the other identity starts cold (as a kept tier does).
        a.close()
        b.close()
        a = b = None
        wait_tenants(name, 0)
        other = Engine(name, model, "other", dtype="bfloat16")
        assert other.until("started", "refused")["event"] == "started"
        assert other.run([full(3)])["first_step_hits"] == {"3": 0}
        log = other.close()
        assert "dtype" in log and "starts cold" in log, log[-3000:]
    finally:
        for e in (a, b):
            if e is not None:
                e.close()
        keeper.stop()


KINDS = ["held", "loading", "granted", "copying", "copied", "completed"]


@pytest.mark.newest_only  # 100 tenants killed: the slow fault test runs on the newest vLLM alone
def test_a_tenant_sigkilled_at_random_points_100_times_leaves_no_torn_block_and_no_lost_chunk(name, model):
    """A tenant forked 100 times, each SIGKILLed at a random event of its rounds (a hold
    taken, a load prepared, chunks granted, a worker copying or done, a store
    completed), while another engine keeps storing and loading, every hit checked
    byte for byte."""
    rng = random.Random(int(os.environ.get("HOSTPOOL_KILL_SEED", "41")))
    keeper = Keeper(name, size=CPU, tenants=2)
    survivor = server = None
    seen: list[int] = []
    try:
        survivor = Engine(name, model, "survivor")
        chunks = survivor.until("started")["chunks"]
        server = Engine(name, model, "victim", fork_server=True)
        server.until("started")
        killed, loaded = 0, 0
        for i in range(100):
            fresh = [2000 + 3 * i + j for j in range(3)]
            old = rng.sample(seen, min(3, len(seen)))
            rounds = [[full(s, rng.choice([1, 2, 3])) for s in old + fresh[:1]], [full(s) for s in fresh]]
            kill_at = f"{rng.choice(KINDS)}:{rng.randint(1, 4)}"
            server.proc.stdin.write(json.dumps({"op": "spawn", "args": {
                "engine": "victim", "model": model, "cpu_bytes": CPU, "prefix_caching": False,
                "table": {"lease": {"keeper": name}, "threads": 1}, "rounds": rounds,
            }, "kill_at": kill_at}) + "\n")
            server.proc.stdin.flush()
            reaped = server.until("reaped", timeout=120)
            torn = [e for e in server.events if e["event"] in ("torn", "child_error")]
            assert not torn, (i, kill_at, torn)
            killed += reaped["signal"] == 9
            # The keeper sees the victim gone and drops what it wrote or held.
            wait_tenants(name, 1)
            ran = survivor.run([full(s, rng.choice([2, 4])) for s in rng.sample(seen + fresh, 2)] + [full(5000 + i)])
            loaded += ran["good"]
            seen.extend(fresh)
        assert killed >= 60, f"only {killed} of 100 tenants died at their event"
        assert loaded > 50, "the survivor hardly ever hit: the test proves nothing"
        survivor.close()
        server.close()
        survivor = server = None
        s = wait_tenants(name, 0)
        assert s["index"]["records"] <= chunks
        # No chunk lost: a new tenant is granted every chunk of the tier (none is
        # left written or held by the dead).
        with hostpool.Pool(keeper=name) as pool:
            puts = pool.tier_store([b"fresh-%d" % k for k in range(chunks)])
            assert [p[0] for p in puts] == ["granted"] * chunks, puts
            assert sorted(p[1] for p in puts) == list(range(chunks))
            pool.tier_abort([p[1] for p in puts])
    finally:
        for e in (survivor, server):
            if e is not None:
                e.kill()
        keeper.stop()


# --- the keeper stopped or killed under running engines (issue 48) ---------------

WAIT = 0.010  # hostpool._vllm_tier.WAIT
SLACK = 0.5  # what a loaded two-core machine may add to one call


def _stopped(pid: int) -> bool:
    tasks = os.listdir(f"/proc/{pid}/task")
    states = []
    for t in tasks:
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return all(s == "T" for s in states)


def test_a_keeper_stopped_for_10_s_costs_each_engine_call_at_most_its_bound(name, model):
    import signal as sig

    keeper = Keeper(name, size=CPU, tenants=2)
    a = b = None
    try:
        a = Engine(name, model, "stop_a")
        a.until("started")
        b = Engine(name, model, "stop_b", dp_index=1)
        b.until("started")
        before = [full(s) for s in (1, 2)]
        a.run(before)
        for e in (a, b):
            e.ask("slowest", "slowest")
        keeper.proc.send_signal(sig.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            deadline = time.monotonic() + 30
            while not _stopped(keeper.proc.pid):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            rounds = 0
            seed = 100
            while time.monotonic() - stopped_at < 10:
                for e in (a, b):
                    seed += 1
                    # New blocks (their stores declined) and blocks stored
                    # before (misses while the keeper is away: computed).
                    ran = e.run([full(seed), full(1)])
                    assert ran["bad"] == [], ran
                rounds += 1
            assert rounds >= 5, rounds
            for e in (a, b):
                slowest = e.ask("slowest", "slowest")
                calls = {k: v for k, v in slowest.items() if k != "event"}
                assert calls and max(calls.values()) < WAIT + SLACK, slowest
                assert e.proc.poll() is None
        finally:
            keeper.proc.send_signal(sig.SIGCONT)
        # Back: they share again. A's new blocks are B's hits.
        share_again(a, b, 5000, time.monotonic(), within=30)
        for e in (a, b):
            log = e.stderr()
            assert log.count("is away") == 1, log[-3000:]
            assert log.count("is back") == 1, log[-3000:]
    finally:
        for e in (a, b):
            if e is not None:
                e.close()
        keeper.stop()


def test_a_keeper_killed_under_two_engines_stops_neither_and_they_read_what_is_stored(name, model):
    keeper = Keeper(name, size=CPU, tenants=2)
    a = b = None
    try:
        a = Engine(name, model, "dead_a")
        a.until("started")
        # B under vLLM's own logging (as `vllm serve` has it): what the
        # operator must read reaches vLLM's handler and stream, in its format.
        env = {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_LOGGING_LEVEL": "INFO"}
        b = Engine(name, model, "dead_b", dp_index=1, env=env, vllm_logging=True)
        b.until("started")
        before = [full(s) for s in (1, 2, 3)]
        a.run(before)
        wait_recorded(keeper, 12)
        keeper.kill()
        # B's first step after the death: hits what A stored, read in place
        # (no keeper is left to grant a chunk to a writer), byte for byte.
        ran = b.run(before)
        assert ran["first_step_hits"] == {str(s[0]): 4 * BLOCK for s in before}, ran
        assert ran["good"] == 12, ran
        # New blocks: stores declined, the engines go on.
        for e in (a, b):
            for seed in range(40, 46):
                assert e.run([full(seed)])["bad"] == []
            stats = e.ask("stats", "stats")
            assert stats["declined"] > 0, stats
            assert e.proc.poll() is None
            log = e.stderr()
            lost = [line for line in log.splitlines() if "is lost" in line]
            assert len(lost) == 1, log[-3000:]
            assert f"kept pool `{name}`" in lost[0], lost[0]
        # vLLM's format: "(pid) LEVEL date [file.py:line] message".
        assert " WARNING " in f" {lost[0].split('[')[0]} " and "[_vllm_tier.py:" in lost[0], lost[0]
    finally:
        for e in (a, b):
            if e is not None:
                e.close()
        keeper.kill()


@pytest.mark.parametrize("source", ["persist", "tenants"])
def test_engines_rejoin_a_restarted_keeper_and_share_again(name, model, source):
    """The keeper SIGKILLed under two engines and started again, its pool back
    from its persist directory, or handed back by the engines that lived
    through the death (adopt_within_secs): the engines lease again by
    themselves (the same memory), tell what they were writing and holding,
    and share again; a new engine hits what was stored before the death."""
    import shutil

    persist = f"/dev/shm/st-persist-{uuid.uuid4().hex[:8]}"
    os.mkdir(persist, 0o700)
    argv = ["--persist", persist] if source == "persist" else ["--adopt-within", "30"]
    keeper = Keeper(name, size=CPU, tenants=3, extra=argv)
    engines = []
    try:
        a = Engine(name, model, "rejoin_a")
        a.until("started")
        b = Engine(name, model, "rejoin_b", dp_index=1)
        b.until("started")
        engines = [a, b]
        before = [full(s) for s in (1, 2, 3)]
        a.run(before)
        wait_recorded(keeper, 12)
        keeper.kill()
        killed = time.monotonic()
        # The engines go on, and find their tier lost (their rejoin begins).
        for e, seed in ((a, 500), (b, 501)):
            assert e.run([full(seed)])["bad"] == []
        keeper = Keeper(name, size=CPU, tenants=3, extra=argv)
        assert keeper.ready["came_back"] == source, keeper.ready
        assert keeper.ready["came_back_blocks"] >= 12, keeper.ready
        # They share again by themselves: what A stores after the restart is
        # B's hit (stores are declined until each rejoined).
        share_again(a, b, 300, killed)
        sharing_again = time.monotonic() - killed
        # A new engine hits what was stored before the death, byte for byte.
        c = Engine(name, model, "rejoin_c", dp_index=2)
        engines.append(c)
        c.until("started")
        ran = c.run(before)
        assert ran["first_step_hits"] == {str(s[0]): 4 * BLOCK for s in before}, ran
        assert ran["good"] == 12, ran
        for e in (a, b):
            log = e.stderr()
            assert log.count("rejoined its restarted keeper") == 1, log[-3000:]
        print(f"sharing again {sharing_again:.2f} s after the keeper's SIGKILL")
    finally:
        for e in engines:
            e.close()
        keeper.stop()
        shutil.rmtree(persist, ignore_errors=True)


KEEPER_KILLS = int(os.environ.get("HOSTPOOL_KEEPER_KILLS", "40"))


@pytest.mark.newest_only  # the keeper killed many times: on the newest vLLM alone
def test_the_keeper_sigkilled_at_random_moments_under_two_busy_engines_loses_nothing(name, model):
    """Two engines store and load the whole time (a thread each) while the
    keeper is SIGKILLed at a random moment of its work and started again on
    its persist directory, KEEPER_KILLS times: no engine raises or stops, every
    block loaded has exactly the bytes stored (no torn block), the engines
    share again after each restart, and a new engine hits what was stored
    before the last death."""
    import shutil
    import threading

    rng = random.Random(int(os.environ.get("HOSTPOOL_KILL_SEED", "48")))
    persist = f"/dev/shm/st-kills-{uuid.uuid4().hex[:8]}"
    os.mkdir(persist, 0o700)
    argv = ["--persist", persist]
    keeper = Keeper(name, size=CPU, tenants=3, extra=argv)
    engines = []
    stop = threading.Event()
    errors: list[str] = []
    loaded = {"good": 0}

    def busy(e: Engine, base: int) -> None:
        n = 0
        try:
            while not stop.is_set():
                n += 1
                # New blocks, and blocks of a few seeds both engines use.
                seqs = [full(base + n), full(rng.randint(1, 6), rng.choice([2, 3]))]
                out = e.ask("run", "ran", seqs=seqs)
                if out["bad"]:
                    errors.append(f"engine pid {e.proc.pid}: torn {out['bad']}")
                loaded["good"] += out["good"]
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(f"engine pid {e.proc.pid}: {type(exc).__name__}: {exc}")

    try:
        a = Engine(name, model, "kills_a")
        a.until("started")
        b = Engine(name, model, "kills_b", dp_index=1)
        b.until("started")
        engines = [a, b]
        first = [full(s) for s in (101, 102)]
        a.run(first)
        threads = [threading.Thread(target=busy, args=(e, 10_000 * (i + 1)), daemon=True) for i, e in enumerate(engines)]
        for t in threads:
            t.start()
        for _ in range(KEEPER_KILLS):
            time.sleep(rng.uniform(0.0, 0.4))
            keeper.kill()
            time.sleep(rng.uniform(0.0, 0.2))
            keeper = Keeper(name, size=CPU, tenants=3, extra=argv)
            assert keeper.ready["came_back"] == "persist", keeper.ready
            assert not errors, errors
        stop.set()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert all(e.proc.poll() is None for e in engines)
        assert loaded["good"] > 0
        # Sharing again: what A stores now is B's hit.
        seed = share_again(a, b, 90_000, time.monotonic())
        # A new engine hits what was stored before the keeper's last death,
        # exactly.
        keeper.kill()
        keeper = Keeper(name, size=CPU, tenants=3, extra=argv)
        c = Engine(name, model, "kills_c", dp_index=2)
        engines.append(c)
        c.until("started")
        ran = c.run([full(seed)])
        assert ran["first_step_hits"] == {str(seed): 4 * BLOCK} and ran["good"] == 4, ran
    finally:
        stop.set()
        for e in engines:
            e.close()
        keeper.stop()
        shutil.rmtree(persist, ignore_errors=True)
