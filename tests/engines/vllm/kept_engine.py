"""One generation of a vLLM engine on a kept pool, as its own process(es).

    python kept_engine.py '{"engine": ..., "model": ..., "table": {"lease": {"keeper": ...}}, ...}'

Steps, from the JSON argument (each prints one JSON line on stdout):

* ``probe``: token sequences whose prefix hits are asked for in the first
  scheduling step (``{"event": "probed", "hits": {seq: tokens}, "good":
  blocks whose loaded bytes are the stored ones, "bad": [...]}``), then run
  until loaded and checked;
* ``store``: token sequences run through the engine, so the connector
  stores their blocks (``{"event": "stored", ...}``);
* then ``{"event": "idle"}``, and the process waits for its stdin to close
  (the test SIGKILLs it, or closes stdin for a clean exit).

``tp`` > 1 runs the workers in processes of their own (spawned, one per
rank, each leasing its rank of the kept pool) and this process is the
scheduler alone, mapping the kept pool as their companion.

``kill_at`` (``"copying:N"``, ``"copied:N"``, ``"completed:N"``; one
process, ``tp`` = 1) SIGKILLs the process at the N-th event of that kind
once it probed, while it stores: a worker about
to copy a block into the pool, a store's copy done (before vLLM's
``complete_store``), ``complete_store`` returned.

A sequence is ``[seed, length]``: tokens ``seed * 1000 + i``.

``vllm_logging`` leaves logging to vLLM's own setup, applied as vLLM's engine
core process applies it (``vllm.logger.configure_logging`` of the config's
``logging_config``; ``VLLM_CONFIGURE_LOGGING=1`` in the environment): nothing
else configures it.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vllm_engine as E  # noqa: E402

E.install()


def tokens(seq: list[int]) -> list[int]:
    seed, length = seq
    return [(seed * 1000 + i) % 997 + 1 for i in range(length)] if seed >= 0 else []


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def arm_kill(kill_at: str | None) -> None:
    """SIGKILL this process at the N-th event of a kind (``kind:N``)."""
    if not kill_at:
        return
    kind, n = kill_at.split(":")
    seen = {"n": 0}

    def hook(event: str, _job: object) -> None:
        if event == kind:
            seen["n"] += 1
            if seen["n"] >= int(n):
                os.kill(os.getpid(), signal.SIGKILL)

    E.STORE_HOOK = hook


def observe(sched: E.Scheduler) -> tuple[dict[str, int], dict[str, list[int]]]:
    """What the connector's scheduler reports: external hit tokens per request
    (``get_num_new_matched_tokens``) and the GPU blocks it loads them into."""
    hits: dict[str, int] = {}
    loads: dict[str, list[int]] = {}
    connector = sched.sched.connector
    matched = connector.get_num_new_matched_tokens
    after_alloc = connector.update_state_after_alloc

    def get_num_new_matched_tokens(request: Any, num_computed_tokens: int) -> Any:
        out = matched(request, num_computed_tokens)
        hits.setdefault(request.request_id, out[0] or 0)
        return out

    def update_state_after_alloc(request: Any, blocks: Any, num_external_tokens: int) -> Any:
        if num_external_tokens:
            block = sched.config.cache_config.block_size
            first = request.num_computed_tokens // block
            ids = blocks.get_block_ids()[0]
            loads[request.request_id] = list(ids[first : first + num_external_tokens // block])
        return after_alloc(request, blocks, num_external_tokens)

    connector.get_num_new_matched_tokens = get_num_new_matched_tokens
    connector.update_state_after_alloc = update_state_after_alloc
    return hits, loads


class RemoteWorkers:
    """TP workers in processes of their own, driven over pipes."""

    def __init__(self, args: dict[str, Any], tp: int) -> None:
        ctx = mp.get_context("spawn")
        self.pipes = []
        self.procs = []
        for rank in range(tp):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=({**args, "rank": rank}, theirs), daemon=True)
            p.start()
            self.pipes.append(mine)
            self.procs.append(p)
        for pipe in self.pipes:
            reply = pipe.recv()
            if reply[0] != "ready":
                raise RuntimeError(f"a worker failed: {reply}")
        say(event="workers", pids=[p.pid for p in self.procs])

    def step(self, out: Any, forward: list[tuple[int, bytes]]) -> list[Any]:
        for pipe in self.pipes:
            pipe.send(("step", out, forward))
        return [pipe.recv()[1] for pipe in self.pipes]

    def blocks(self, block_ids: list[int]) -> list[dict[int, bytes]]:
        for pipe in self.pipes:
            pipe.send(("blocks", block_ids))
        return [pipe.recv()[1] for pipe in self.pipes]


def worker_main(args: dict[str, Any], pipe: Any) -> None:
    """One TP rank: vLLM's worker connector over its rank of the kept pool."""
    try:
        config = E.vllm_config(args)
        worker = E.Worker(config, E.kv_cache_config(config, args.get("gpu_blocks", 128)))
    except BaseException as e:
        pipe.send(("error", f"{type(e).__name__}: {e}"))
        raise
    pipe.send(("ready", os.getpid()))
    while True:
        try:
            msg = pipe.recv()
        except EOFError:
            return
        if msg[0] == "step":
            pipe.send(("out", worker.step(msg[1], msg[2])))
        elif msg[0] == "blocks":
            pipe.send(("blocks", {b: worker.block_bytes(b) for b in msg[1]}))


def expected_block(worker_rank: int, block_hash: bytes, n_per_layer: int) -> bytes:
    return b"".join(E.expected(block_hash, i, worker_rank, n_per_layer) for i in range(len(E.LAYERS)))


def vllm_logging(config: Any) -> None:
    """As vLLM's engine core process starts: its own logging config, applied by vLLM."""
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    configure_logging(getattr(config, "logging_config", None) or LoggingConfig())


def main() -> None:
    args = json.loads(sys.argv[1])
    if not args.get("vllm_logging"):
        # The tests read hostpool's records by name; with ``vllm_logging`` vLLM's
        # own setup (VLLM_CONFIGURE_LOGGING) is the process's only one.
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    tp = args.get("tp", 1)
    config = E.vllm_config(args)
    if args.get("vllm_logging"):
        vllm_logging(config)
    kcc = E.kv_cache_config(config, args.get("gpu_blocks", 128))
    # vLLM builds the workers before the scheduler.
    workers: Any = E.LocalWorkers([E.Worker(config, kcc)]) if tp == 1 else RemoteWorkers(args, tp)
    sched = E.Scheduler(config, kcc)
    manager = sched.manager
    if args.get("kill_at", "").startswith("completed"):
        complete = manager.complete_store

        def complete_store(keys: Any, req_context: Any, success: bool = True) -> None:
            complete(keys, req_context, success)
            if E.STORE_HOOK is not None:
                E.STORE_HOOK("completed", None)

        manager.complete_store = complete_store
    hits, loads = observe(sched)
    engine = E.Engine(sched, workers, tp)

    say(
        event="started",
        manager=type(manager).__name__,
        chunks=manager._num_chunks,
        pid=os.getpid(),
    )
    block = config.cache_config.block_size
    probes = args.get("probe", [])
    if probes:
        for seq in probes:
            sched.add(f"probe-{seq[0]}", tokens(seq))
        # The first scheduling step: what the connector reports, before any load.
        out, forward = sched.schedule()
        first = dict(hits)
        index = manager.kept_index() if hasattr(manager, "kept_index") else None
        records_at_first_step = None if index is None else len(index)
        engine.finish(out, forward)
        engine.run()
        good, bad = 0, []
        for seq in probes:
            req_id = f"probe-{seq[0]}"
            req = sched.requests[req_id]
            ids = loads.get(req_id, [])
            per_rank = workers.blocks(ids)
            for i, b in enumerate(ids):
                for rank, got in enumerate(per_rank):
                    data = got[b]
                    want = expected_block(rank, bytes(req.block_hashes[i]), len(data) // len(E.LAYERS))
                    if data == want:
                        good += 1
                    else:
                        bad.append([seq[0], i, rank])
        restored = getattr(manager, "restored_blocks", None)
        say(
            event="probed",
            first_step_hits={str(s[0]): first.get(f"probe-{s[0]}", 0) for s in probes},
            hits={str(s[0]): hits.get(f"probe-{s[0]}", 0) for s in probes},
            good=good,
            bad=bad,
            restored=restored,
            records_at_first_step=records_at_first_step,
            block=block,
        )
    stores = args.get("store", [])
    if tp == 1:
        arm_kill(args.get("kill_at"))  # while storing, not while probing
    if stores:
        # One after the other: a store that finds no evictable chunk is skipped
        # (vLLM's), and stores in flight are not evictable.
        for seq in stores:
            sched.add(f"store-{seq[0]}-{len(sched.requests)}", tokens(seq))
            engine.run()
        say(event="stored", sequences=[s[0] for s in stores])
    say(event="idle")
    sys.stdin.read()


if __name__ == "__main__":
    main()
