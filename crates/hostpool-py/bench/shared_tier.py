"""One CPU tier for the vLLM engines of a node (issue 41): two figures.

1. **Hit rate** of one synthetic multi-tenant trace (shared system prompts,
   multi-turn conversations, requests routed round-robin over K replicas),
   run through the managers, no GPU: K engines sharing one tier of K x X
   chunks (:class:`hostpool._vllm_tier.SharedTierManager` over a real
   ``hostpool keep --tenants K``), K engines with private tiers of X chunks
   each (vLLM's ``CPUOffloadingManager``, LRU), and one engine with a tier of
   K x X serving the whole trace (the same). For K = 2, 4, 8.
2. **Cost per call** of the shared tier's manager against vLLM's own
   ``CPUOffloadingManager`` doing the same work in the same run (issue 48):
   rounds of ``prepare_store`` + ``complete_store`` of 16 new blocks, the 16
   ``lookup``s of them and ``prepare_load`` + ``complete_load`` of the hits,
   vLLM's manager's round and the shared tier's interleaved, one every
   ``--pace`` seconds, with 0, 1 and 3 other tenants (each its own process)
   busy with the same rounds at the same pace. Medians per call kind of the
   rounds whose lookups found all 16, and their ratio.

Each request of the trace: the blocks of its prompt are looked up in order
until the first miss (vLLM's prefix lookup), the hits loaded (prepare_load,
complete_load), the rest stored (prepare_store, complete_store). The hit
rate is hit blocks over all blocks asked for.

Run in the vLLM environment, as root, nothing else running:

    HOSTPOOL_BIN=target/release/hostpool \\
        ~/.cache/hostpool/engine-vllm-0.34.0-*/bin/python crates/hostpool-py/bench/shared_tier.py

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import time
import uuid

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import hostpool  # noqa: E402
from hostpool._vllm_tier import SharedTier, SharedTierManager  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

CHUNK = 4096
FP = {"format": "bench/1", "model": "synthetic"}


class Keeper:
    """A real ``hostpool keep`` of ``chunks`` chunks and their index, ``tenants`` at once."""

    def __init__(self, chunks: int, tenants: int) -> None:
        self.name = f"bench-tier-{uuid.uuid4().hex[:8]}"
        size = chunks * CHUNK + hostpool.index_bytes(chunks)
        self.proc = subprocess.Popen(
            [os.environ.get("HOSTPOOL_BIN", "hostpool"), "keep", "--name", self.name, "--size", str(size),
             "--backing", "shm-segmented", "--tenants", str(tenants), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        ready = json.loads(self.proc.stdout.readline() or "null")
        assert ready, self.proc.stderr.read()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def shared_managers(keeper: Keeper, k: int, chunks: int) -> list[SharedTierManager]:
    managers = []
    for _ in range(k):
        pool = hostpool.Pool(keeper=keeper.name)
        managers.append(SharedTierManager(tier=SharedTier(pool, chunks, CHUNK, FP)))
    return managers


# --- the trace ---------------------------------------------------------------


def trace(seed: int, conversations: int, turns: int) -> list[list[bytes]]:
    """Requests, each the chained block keys of its prompt: one of 8 system
    prompts (8 blocks), then the conversation so far (3 blocks a turn: the
    user's 2, the answer's 1), conversations interleaved at random."""
    rng = random.Random(seed)

    def chain(parent: bytes, label: str) -> bytes:
        return hashlib.sha256(parent + label.encode()).digest()

    systems = []
    for s in range(8):
        keys, h = [], b""
        for b in range(8):
            h = chain(h, f"sys{s}.{b}")
            keys.append(h)
        systems.append(keys)
    convs = [{"keys": list(systems[rng.randrange(8)]), "id": c, "turn": 0} for c in range(conversations)]
    requests = []
    live = list(convs)
    while live:
        conv = rng.choice(live)
        keys = conv["keys"]
        h = keys[-1]
        for b in range(2):
            h = chain(h, f"c{conv['id']}.t{conv['turn']}.u{b}")
            keys.append(h)
        requests.append(list(keys))
        h = chain(h, f"c{conv['id']}.t{conv['turn']}.a")
        keys.append(h)
        conv["turn"] += 1
        if conv["turn"] == turns:
            live.remove(conv)
    return requests


def serve(manager, keys: list[bytes], ctx: ReqContext) -> int:
    """One request through a manager: the prefix looked up, its hits loaded, the rest stored."""
    manager.on_new_request(ctx)
    hits = 0
    for key in keys:
        if manager.lookup(key, ctx) is not LookupResult.HIT:
            break
        hits += 1
    if hits:
        manager.prepare_load(keys[:hits], ctx)
        manager.complete_load(keys[:hits], ctx)
    rest = keys[hits:]
    if rest:
        out = manager.prepare_store(rest, ctx)
        if out is not None:
            manager.complete_store(out.keys_to_store, ctx)
    # As vLLM's scheduler: the request's end (vLLM 0.34's LRU learns recency
    # here), then the step's.
    manager.on_request_finished(ctx)
    manager.on_schedule_end(None)
    return hits


def hit_rate(requests: list[list[bytes]], managers: list, route) -> float:
    hits = total = 0
    for i, keys in enumerate(requests):
        ctx = ReqContext(req_id=f"r{i}")
        hits += serve(managers[route(i)], keys, ctx)
        total += len(keys)
    return hits / total


def hit_rates(k: int, per_engine: int, requests: list[list[bytes]]) -> dict:
    private = [CPUOffloadingManager(num_chunks=per_engine) for _ in range(k)]
    big = CPUOffloadingManager(num_chunks=k * per_engine)
    keeper = Keeper(k * per_engine, k)
    try:
        shared = shared_managers(keeper, k, k * per_engine)
        out = {
            "k": k,
            "chunks_per_engine": per_engine,
            "shared": hit_rate(requests, shared, lambda i: i % k),
            "private": hit_rate(requests, private, lambda i: i % k),
            "one_engine": hit_rate(requests, [big], lambda i: 0),
        }
        for m in shared:
            m.shutdown()
        return out
    finally:
        keeper.stop()


# --- cost per call, against vLLM's own manager ---------------------------------

CALLS = ("prepare_store", "complete_store", "lookup", "prepare_load", "complete_load")


def round_of(manager, seed: int, i: int, times: dict[str, list[float]] | None) -> None:
    """One round of a scheduler's calls for one request of 16 new blocks:
    prepare_store + complete_store of them, the 16 lookups (the time of all
    16), prepare_load + complete_load of the hits, the step's end; the seconds
    of each call kind added to ``times``."""
    ctx = ReqContext(req_id=f"t{seed}.{i}")
    keys = [hashlib.sha256(b"%d.%d.%d" % (seed, i, b)).digest() for b in range(16)]
    clock = time.perf_counter
    t0 = clock()
    got = manager.prepare_store(keys, ctx)
    t1 = clock()
    manager.complete_store(got.keys_to_store if got is not None else [], ctx)
    t2 = clock()
    hits = 0
    for key in keys:
        if manager.lookup(key, ctx) is not LookupResult.HIT:
            break
        hits += 1
    t3 = clock()
    manager.prepare_load(keys[:hits], ctx)
    t4 = clock()
    manager.complete_load(keys[:hits], ctx)
    t5 = clock()
    manager.on_schedule_end(None)
    if times is not None and hits == 16:
        for call, dt in zip(CALLS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            times[call].append(dt)


def busy_tenant(name: str, chunks: int, seed: int, pace: float) -> None:
    """Another engine on the tier: rounds at an engine's pace until terminated."""
    pool = hostpool.Pool(keeper=name)
    manager = SharedTierManager(tier=SharedTier(pool, chunks, CHUNK, FP))
    i = 0
    while True:
        i += 1
        round_of(manager, seed, i, None)
        time.sleep(pace)


def call_costs(tenants: int, chunks: int, rounds: int, pace: float) -> dict:
    """Per call kind, the median seconds of vLLM's own ``CPUOffloadingManager``
    (in this process) and of this engine's shared tier manager (over a real
    keeper, with ``tenants - 1`` other engines, each its own process, busy at
    an engine's pace), their rounds interleaved so both see the same machine."""
    keeper = Keeper(chunks, tenants)
    ctx = mp.get_context("spawn")
    busy = [ctx.Process(target=busy_tenant, args=(keeper.name, chunks, 100 + t, pace), daemon=True)
            for t in range(tenants - 1)]
    try:
        for p in busy:
            p.start()
        while len(hostpool.keeper_status(keeper.name)["tenants"]) < tenants - 1:
            time.sleep(0.01)
        shared = SharedTierManager(tier=SharedTier(hostpool.Pool(keeper=keeper.name), chunks, CHUNK, FP))
        own = CPUOffloadingManager(num_chunks=chunks)
        times = {m: {c: [] for c in CALLS} for m in ("vllm", "hostpool")}
        for i in range(rounds):
            round_of(own, 1, i, times["vllm"] if i >= rounds // 10 else None)
            round_of(shared, 1, i, times["hostpool"] if i >= rounds // 10 else None)
            time.sleep(pace)
        shared.shutdown()
        med = {m: {c: statistics.median(v) for c, v in t.items()} for m, t in times.items()}
        med["ratio"] = {c: med["hostpool"][c] / med["vllm"][c] for c in CALLS}
        med["rounds"] = len(times["hostpool"]["lookup"])
        return med
    finally:
        for p in busy:
            p.terminate()
            p.join()
        keeper.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--per-engine", type=int, default=256, help="X: chunks of one engine's tier")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--pace", type=float, default=0.002, help="seconds between an engine's rounds")
    ap.add_argument("--costs-only", action="store_true", help="the cost per call alone (no hit rates)")
    a = ap.parse_args()
    out: dict = {}
    if not a.costs_only:
        requests = trace(41, a.conversations, a.turns)
        out.update({"requests": len(requests), "blocks": sum(len(r) for r in requests), "hit_rate": []})
        for k in (2, 4, 8):
            out["hit_rate"].append(hit_rates(k, a.per_engine, requests))
    chunks = 4096
    out["calls"] = {str(t): call_costs(t, chunks, a.rounds, a.pace) for t in (1, 2, 4)}
    out["pace_seconds"] = a.pace
    out["cpus"] = os.cpu_count()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
