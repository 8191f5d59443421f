"""The node's CPU tier through its keeper's stall and restart (issue 48), from one run:

1. **A stopped keeper.** Two engines (vLLM's manager over the shared tier,
   ``SharedTierManager``, each its own lease) do rounds of a scheduler step
   (``shared_tier.round_of``: a store of 16 new blocks, their 16 lookups,
   their load) while the keeper is SIGSTOPped for ``--stop`` seconds: the
   longest any one manager call took meanwhile, against the bound
   (``hostpool._vllm_tier.WAIT``).
2. **A killed keeper, started again.** The keeper is SIGKILLed while the
   engines run and started again with the same config (its pool back from
   its persist directory, or from the engines with ``--source tenants``):
   the seconds from the kill until a block one engine stores is the other's
   hit (the engines rejoin by themselves), and the blocks the restarted
   keeper's index came back with against those recorded before the kill.

Run in the vLLM environment, as root, nothing else running:

    HOSTPOOL_BIN=target/release/hostpool \\
        ~/.cache/hostpool/engine-vllm-0.34.0-*/bin/python crates/hostpool-py/bench/keeper_restart.py

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import hostpool  # noqa: E402
from hostpool._vllm_tier import WAIT, SharedTier, SharedTierManager  # noqa: E402
from shared_tier import CHUNK, FP, round_of  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402

CALLS = ("lookup", "prepare_store", "complete_store", "prepare_load", "complete_load", "on_schedule_end")


class Timed:
    """A manager whose calls are timed: the longest of each kind since reset."""

    def __init__(self, manager: SharedTierManager) -> None:
        self.m = manager
        self.slowest: dict[str, float] = {}

    def __getattr__(self, name: str):
        inner = getattr(self.m, name)
        if name not in CALLS:
            return inner

        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                dt = time.perf_counter() - t
                self.slowest[name] = max(self.slowest.get(name, 0.0), dt)

        return call


def keep(name: str, chunks: int, argv: list[str]) -> subprocess.Popen:
    size = chunks * CHUNK + hostpool.index_bytes(chunks)
    proc = subprocess.Popen(
        [os.environ.get("HOSTPOOL_BIN", "hostpool"), "keep", "--name", name, "--size", str(size),
         "--backing", "shm-segmented", "--tenants", "3", "--content", "keep", "--json", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    return proc


def ready(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=4096)
    ap.add_argument("--stop", type=float, default=5.0, help="seconds the keeper is SIGSTOPped")
    ap.add_argument("--source", choices=["persist", "tenants"], default="persist")
    ap.add_argument("--pace", type=float, default=0.002)
    a = ap.parse_args()
    name = f"bench-restart-{uuid.uuid4().hex[:8]}"
    persist = f"/dev/shm/{name}"
    os.mkdir(persist, 0o700)
    argv = ["--persist", persist] if a.source == "persist" else ["--adopt-within", "30"]
    proc = keep(name, a.chunks, argv)
    ready(proc)
    managers = [
        Timed(SharedTierManager(tier=SharedTier(hostpool.Pool(keeper=name), a.chunks, CHUNK, FP)))
        for _ in range(2)
    ]
    out: dict = {"wait_bound_seconds": WAIT, "source": a.source, "chunks": a.chunks}
    try:
        i = 0

        def rounds(seconds: float) -> int:
            nonlocal i
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                i += 1
                for k, m in enumerate(managers):
                    round_of(m, k, i, None)
                n += 1
                time.sleep(a.pace)
            return n

        rounds(1.0)
        for m in managers:
            m.slowest.clear()
        # 1. Stopped.
        proc.send_signal(signal.SIGSTOP)
        n = rounds(a.stop)
        proc.send_signal(signal.SIGCONT)
        slowest = {c: max(m.slowest.get(c, 0.0) for m in managers) for c in CALLS}
        out["stopped"] = {"seconds": a.stop, "rounds": n, "slowest_call_seconds": slowest,
                          "slowest_seconds": max(slowest.values())}
        rounds(2.0)  # back
        # 2. Killed and started again.
        status = hostpool.keeper_status(name)
        recorded = (status.get("index") or {}).get("records", 0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        for k, m in enumerate(managers):
            round_of(m, k, 10**6, None)  # each finds its tier lost
        proc = keep(name, a.chunks, argv)
        status = ready(proc)
        restarted = time.monotonic() - killed
        # Sharing again: a block the first stores is the second's hit.
        j = 0
        while True:
            j += 1
            key = b"restart-%d" % j
            ctx = ReqContext(req_id=f"s{j}")
            got = managers[0].prepare_store([key], ctx)
            if got is not None and got.keys_to_store:
                managers[0].complete_store(got.keys_to_store, ctx)
            managers[1].on_schedule_end(None)
            hit = managers[1].lookup(key, ctx) is LookupResult.HIT
            managers[1].on_schedule_end(None)
            if hit:
                break
            assert time.monotonic() - killed < 120, "the engines never shared again"
            time.sleep(0.005)
        out["restart"] = {
            "came_back": status["came_back"],
            "seconds_to_ready": round(restarted, 3),
            "seconds_to_sharing_again": round(time.monotonic() - killed, 3),
            "blocks_recorded_before_kill": recorded,
            "blocks_came_back": status.get("came_back_blocks"),
        }
    finally:
        for m in managers:
            m.m.shutdown()
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        shutil.rmtree(persist, ignore_errors=True)
    out["cpus"] = os.cpu_count()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
