"""Issue 29: a restarted vLLM finds its CPU tier warm, against vLLM 0.33.0 as released.

Each generation of the engine is its own process (``kept_engine.py``): vLLM's
``Scheduler`` with its ``OffloadingConnector`` and our ``HostPoolOffloadingSpec``,
the connector's worker role over CPU tensors in place of the GPU KV cache, and
the pool leased from a real ``hostpool keep``. Only what cannot run here is
replaced: the platform check and the CUDA copy (a CPU copy of the same
sub-blocks). Every block's bytes are a function of its block hash, its layer
and its rank, so a loaded block is checked byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

import hostpool

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "kept_engine.py")
BLOCK = 16
MiB = 1 << 20


def _hostpool_bin() -> str:
    path = os.environ.get("HOSTPOOL_BIN")
    assert path, "HOSTPOOL_BIN names the hostpool CLI (cargo xtask test sets it)"
    return path


class Keeper:
    """A real ``hostpool keep`` of one pool, stopped (or SIGKILLed) by the test."""

    def __init__(
        self, name: str, size: int = 8 * MiB, content: str = "keep", tenants: int = 1, extra: list[str] | None = None
    ) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [_hostpool_bin(), "keep", "--name", name, "--size", str(size), "--content", content,
             "--backing", "shm-segmented", "--tenants", str(tenants), "--json", *(extra or [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        ready = json.loads(self.proc.stdout.readline() or "null")
        assert ready and ready["name"] == name, self.proc.stderr.read()
        self.ready = ready

    def status(self) -> dict:
        out = subprocess.run([_hostpool_bin(), "keep", "status", "--name", self.name, "--json"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        [status] = json.loads(out.stdout)
        return status

    def wait_idle(self, timeout: float = 30) -> dict:
        """The keeper's status once the lease ended (every rank and companion gone)."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            if s["state"] == "idle" or time.monotonic() > deadline:
                assert s["state"] == "idle", s
                return s
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=30) == 0, self.proc.stderr.read()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def name():
    return f"kt-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def model(tmp_path):
    sys.path.insert(0, HERE)
    import vllm_engine

    return vllm_engine.model_dir(str(tmp_path))


class Generation:
    """One engine process (``script``, ``kept_engine.py`` by default): its events
    as they come, its log in a file (a long run's log would fill a pipe nobody
    reads until the end, and stop the engine mid-write)."""

    def __init__(self, args: dict, env: dict | None = None, script: str = ENGINE) -> None:
        full_env = {**os.environ, **(env or {})}
        for key in [k for k, v in full_env.items() if v is None]:
            del full_env[key]
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, script, json.dumps(args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=full_env,
        )
        self.events: list[dict] = []

    def stderr(self) -> str:
        """The log so far."""
        self.log.seek(0)
        return self.log.read()

    def until(self, *events: str, timeout: float = 240) -> dict:
        """The next event named one of ``events`` (each line is read when it comes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if not line.startswith("{"):
                continue
            e = json.loads(line)
            self.events.append(e)
            if e["event"] in events:
                return e
        self.proc.kill()
        self.proc.wait(timeout=30)
        raise AssertionError(f"no {events} from the engine: {self.events}\n{self.stderr()[-6000:]}")

    def kill(self) -> str:
        self.proc.kill()
        self.proc.wait(timeout=30)
        return self.stderr()

    def close(self, codes: tuple[int, ...] = (0,)) -> str:
        """A clean exit: stdin closed, the process ends (with one of ``codes``)."""
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=60)
        log = self.stderr()
        assert rc in codes, log[-6000:]
        return log


def args_for(name: str, model: str, **kw) -> dict:
    table = {"lease": {"keeper": name}, "threads": 1}
    table.update(kw.pop("table", {}))
    return {"engine": name, "model": model, "cpu_bytes": kw.pop("cpu_bytes", 1 * MiB), "table": table, **kw}


SEQS = [[s, 4 * BLOCK + 1] for s in range(1, 5)]  # four prompts of four full blocks each


def test_a_restarted_engine_serves_its_kept_blocks_in_its_first_step(name, model):
    keeper = Keeper(name)
    try:
        gen1 = Generation(args_for(name, model, store=SEQS))
        started = gen1.until("started")
        assert started["manager"] == "HostPoolOffloadingManager", started
        gen1.until("stored")
        gen1.until("idle")
        gen1.kill()  # SIGKILL: nothing is released cleanly
        s = keeper.wait_idle()
        assert s["previous"]["how"] == "died"
        assert s["index"]["records"] == 16, s["index"]  # 4 prompts x 4 blocks, one block a chunk
        assert s["index"]["model"] == model

        gen2 = Generation(args_for(name, model, probe=SEQS))
        probed = gen2.until("probed")
        log = gen2.close()
        # The connector's scheduler reports every stored block as a hit in its first step.
        assert probed["first_step_hits"] == {str(s[0]): 4 * BLOCK for s in SEQS}, probed
        # And the worker loaded the bytes generation 1 stored: 16 blocks, 2 layers each.
        assert probed["bad"] == [] and probed["good"] == 16, probed
        assert "16 blocks" in log and "restored" in log, log[-3000:]
        # A prompt never stored is a miss.
        gen3 = Generation(args_for(name, model, probe=[[77, 4 * BLOCK + 1]]))
        assert gen3.until("probed")["first_step_hits"] == {"77": 0}
        gen3.close()
    finally:
        keeper.stop()


def test_a_keeper_of_exactly_cpu_bytes_to_use_keeps_the_tier_and_its_index(name, model):
    """Sized as vLLM sizes its own region, the kept pool has no room for the
    index beside every chunk: the spec uses as many chunks as fit beside it,
    and the tier is kept (it started cold, logging the size to give, before)."""
    keeper = Keeper(name, size=1 * MiB)
    try:
        gen1 = Generation(args_for(name, model, store=SEQS))
        started = gen1.until("started")
        chunks = started["chunks"]
        assert chunks < MiB // 4096 and chunks * 4096 + hostpool.index_bytes(chunks) <= MiB, started
        assert started["manager"] == "HostPoolOffloadingManager", started
        gen1.until("idle")
        log1 = gen1.kill()
        assert f"{chunks} chunks" in log1 and "fit" in log1, log1[-3000:]
        assert keeper.wait_idle()["index"]["records"] == 16
        gen2 = Generation(args_for(name, model, probe=SEQS))
        probed = gen2.until("probed")
        gen2.close()
        assert probed["first_step_hits"] == {str(s[0]): 4 * BLOCK for s in SEQS}, probed
        assert probed["bad"] == [] and probed["good"] == 16, probed
    finally:
        keeper.stop()


def test_two_tp_workers_and_a_scheduler_in_a_third_process(name, model):
    keeper = Keeper(name)
    try:
        gen1 = Generation(args_for(name, model, tp=2, store=SEQS[:3]))
        gen1.until("workers")
        assert gen1.until("started")["manager"] == "HostPoolOffloadingManager"
        gen1.until("stored")
        gen1.until("idle")
        status = keeper.status()
        assert len(status["lease"]["ranks"]) == 2 and len(status["lease"]["companions"]) == 1, status["lease"]
        assert status["lease"]["companions"][0]["pid"] == gen1.proc.pid
        gen1.kill()
        # The workers die with their parent's pipes; the lease ends once all three went.
        s = keeper.wait_idle()
        assert s["index"]["records"] == 12

        gen2 = Generation(args_for(name, model, tp=2, probe=SEQS[:3]))
        probed = gen2.until("probed")
        gen2.close()
        assert probed["first_step_hits"] == {str(s[0]): 4 * BLOCK for s in SEQS[:3]}, probed
        # Both ranks' halves of every block are the bytes each stored.
        assert probed["bad"] == [] and probed["good"] == 12 * 2, probed
    finally:
        keeper.stop()


def test_eviction_under_pressure_survives_the_restart(name, model):
    """Eight chunks: the first two prompts' blocks are evicted by the last two."""
    keeper = Keeper(name)
    try:
        gen1 = Generation(args_for(name, model, cpu_bytes=8 * 4096, store=SEQS))
        assert gen1.until("started")["chunks"] == 8
        gen1.until("idle")
        gen1.kill()
        keeper.wait_idle()
        gen2 = Generation(args_for(name, model, cpu_bytes=8 * 4096, probe=SEQS))
        probed = gen2.until("probed")
        gen2.close()
        hits = probed["first_step_hits"]
        assert hits["1"] == 0 and hits["2"] == 0, "an evicted key is a miss"
        assert hits["3"] == 4 * BLOCK and hits["4"] == 4 * BLOCK, probed
        # The evicted keys' chunks now hold the new keys' bytes, and those load.
        assert probed["bad"] == [] and probed["good"] == 8, probed
    finally:
        keeper.stop()


def test_a_restarted_engine_evicts_in_the_order_of_last_use(name, model):
    """Sixteen chunks hold prompts 1..4; prompt 1 is asked for again last, so its
    blocks are the most recently used. After the restart, two new prompts need
    eight chunks: vLLM's policy learnt the use order through ``on_request_finished``
    (every release) or ``touch`` (0.33), hostpool stamped it in the index, and the
    restarted engine evicts prompts 2 and 3, the least recently used, not 1."""
    keeper = Keeper(name)
    try:
        gen1 = Generation(args_for(name, model, cpu_bytes=16 * 4096, store=SEQS))
        assert gen1.until("started")["chunks"] == 16
        gen1.until("idle")
        gen1.close()
        # Prompt 1 again, in a new engine (no GPU prefix cache): an offloaded hit, loaded.
        gen2 = Generation(args_for(name, model, cpu_bytes=16 * 4096, probe=SEQS[:1]))
        assert gen2.until("probed")["first_step_hits"] == {"1": 4 * BLOCK}
        gen2.close()
        new = [[s, 4 * BLOCK + 1] for s in (5, 6)]
        gen3 = Generation(args_for(name, model, cpu_bytes=16 * 4096, store=new))
        gen3.until("idle")
        gen3.close()
        gen4 = Generation(args_for(name, model, cpu_bytes=16 * 4096, probe=SEQS + new))
        probed = gen4.until("probed")
        gen4.close()
        hits = probed["first_step_hits"]
        assert hits == {"1": 4 * BLOCK, "2": 0, "3": 0, "4": 4 * BLOCK, "5": 4 * BLOCK, "6": 4 * BLOCK}, probed
        assert probed["bad"] == [], probed
    finally:
        keeper.stop()


def test_a_cold_start_is_said_where_vllms_own_logging_says_its_records(name, model, tmp_path):
    """vLLM configures its own `vllm` logger (VLLM_CONFIGURE_LOGGING, as `vllm serve`
    has it) and nothing else: the cold start's warning on `hostpool.vllm` comes out on
    vLLM's handler, its stream (stderr here) and its format, and on no other."""
    import vllm_engine

    keeper = Keeper(name)
    try:
        gen1 = Generation(args_for(name, model, store=SEQS[:1]))
        gen1.until("idle")
        gen1.close()
        env = {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_LOGGING_LEVEL": "INFO"}
        other = vllm_engine.model_dir(str(tmp_path), "other-llama")
        gen2 = Generation({**args_for(name, model, probe=SEQS[:1]), "model": other, "vllm_logging": True}, env)
        gen2.until("probed")
        log = gen2.close()
        stdout = gen2.proc.stdout.read()
        cold = [l for l in log.splitlines() if "CPU offload tier starts cold" in l]
        assert len(cold) == 1, log[-4000:]
        # vLLM's format: "(pid) LEVEL date [file.py:line] message", as its own lines beside it.
        assert cold[0].startswith("WARNING ") or " WARNING " in cold[0].split("[")[0], cold[0]
        assert "[_vllm_kept.py:" in cold[0] and "stored for model = " in cold[0], cold[0]
        assert any("[factory.py:" in l for l in log.splitlines()), "vLLM's own records are elsewhere"
        assert "starts cold" not in stdout
        # hostpool's info lines come at vLLM's level (INFO) too.
        assert any("CPU offload region of" in l and "[vllm.py:" in l for l in log.splitlines()), log[-4000:]
    finally:
        keeper.stop()


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("block_size", {"block": 32}),
        ("dtype", {"dtype": "bfloat16"}),
        ("model", {"model_name": "other-llama"}),
        ("tp", {"tp": 2}),
    ],
)
def test_another_identity_starts_cold_naming_the_field(name, model, tmp_path, field, change):
    keeper = Keeper(name)
    try:
        gen1 = Generation(args_for(name, model, store=SEQS[:2]))
        gen1.until("idle")
        gen1.kill()
        assert keeper.wait_idle()["index"]["records"] == 8
        change = dict(change)
        if "model_name" in change:
            import vllm_engine

            change["model"] = vllm_engine.model_dir(str(tmp_path), change.pop("model_name"))
        gen2 = Generation({**args_for(name, model, probe=SEQS[:2]), **change})
        probed = gen2.until("probed")
        log = gen2.close()
        assert set(probed["first_step_hits"].values()) == {0}, probed
        warnings = [l for l in log.splitlines() if l.startswith("hostpool.vllm WARNING") and "starts cold" in l]
        assert len(warnings) == 1, log[-3000:]
        assert f"stored for {field} = " in warnings[0], warnings[0]
        # The index was cleared: nothing of generation 1 was left in it when the
        # engine first looked (what it stores itself afterwards is its own).
        assert probed["records_at_first_step"] == 0, probed
    finally:
        keeper.stop()


def test_a_hash_that_is_not_reproducible_starts_cold_with_the_remedy(name, model):
    keeper = Keeper(name)
    try:
        gen1 = Generation(args_for(name, model, store=SEQS[:1], hash="xxhash"), {"PYTHONHASHSEED": None})
        gen1.until("idle")
        log1 = gen1.close()
        cold = [l for l in log1.splitlines() if "starts cold" in l]
        assert len(cold) == 1 and "not reproducible" in cold[0], log1[-3000:]
        assert "PYTHONHASHSEED" in cold[0] and "sha256" in cold[0], cold[0]
        assert keeper.wait_idle()["index"]["records"] == 0, "nothing is recorded that no start could find"
        # With PYTHONHASHSEED, the same hash is kept across the restart.
        seeded = {"PYTHONHASHSEED": "29"}
        gen2 = Generation(args_for(name, model, store=SEQS[:1], hash="xxhash"), seeded)
        gen2.until("idle")
        gen2.kill()
        keeper.wait_idle()
        gen3 = Generation(args_for(name, model, probe=SEQS[:1], hash="xxhash"), seeded)
        probed = gen3.until("probed")
        gen3.close()
        assert probed["first_step_hits"] == {"1": 4 * BLOCK} and probed["good"] == 4, probed
    finally:
        keeper.stop()


@pytest.mark.parametrize("how", ["keeper-killed", "content-zero"])
def test_a_lost_or_cleared_pool_starts_cold_without_error(name, model, how):
    keeper = Keeper(name, content="zero" if how == "content-zero" else "keep")
    try:
        gen1 = Generation(args_for(name, model, store=SEQS[:2]))
        started = gen1.until("started")
        assert started["manager"] == ("CPUOffloadingManager" if how == "content-zero" else "HostPoolOffloadingManager")
        gen1.until("idle")
        gen1.kill()
        if how == "keeper-killed":
            keeper.kill()
            keeper = Keeper(name)
        else:
            keeper.wait_idle()
        gen2 = Generation(args_for(name, model, probe=SEQS[:2]))
        probed = gen2.until("probed")
        log = gen2.close()
        assert set(probed["first_step_hits"].values()) == {0}, probed
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    finally:
        keeper.stop()


@pytest.mark.newest_only  # 50 generations: the slow fault test runs on the newest vLLM alone
def test_sigkill_at_random_points_of_a_store_leaves_no_torn_block(name, model):
    """50 generations, each SIGKILLed at a random point of its stores (a worker about
    to copy a block, a store copied but not completed, completed), each first
    checking every hit of everything stored so far byte for byte."""
    rng = random.Random(int(os.environ.get("HOSTPOOL_KILL_SEED", "29")))
    keeper = Keeper(name)
    seen: list[list[int]] = []
    kinds = ["copying", "copied", "completed"]
    total_hits = 0
    try:
        for gen in range(50):
            new = [[100 + gen * 3 + j, rng.choice([2, 3, 4]) * BLOCK + 1] for j in range(3)]
            kill_at = f"{rng.choice(kinds)}:{rng.randint(1, 6)}"
            g = Generation(args_for(name, model, cpu_bytes=48 * 4096, probe=seen[-12:], store=new, kill_at=kill_at))
            if seen[-12:]:
                probed = g.until("probed")
                assert probed["bad"] == [], (gen, kill_at, probed)
                total_hits += probed["good"]
            # Killed while storing, or finished (then killed while idle).
            while True:
                line = g.proc.stdout.readline()
                if not line or '"idle"' in line:
                    break
            g.kill()
            keeper.wait_idle()
            seen.extend(new)
        assert total_hits > 0, "the fault test never loaded a kept block: it proves nothing"
    finally:
        keeper.stop()
