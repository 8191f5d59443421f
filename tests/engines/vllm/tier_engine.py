"""A vLLM engine on a keeper's shared CPU tier, as its own process(es), driven by
commands on stdin (one JSON object a line), each answered by one JSON line:

    python tier_engine.py '{"engine": ..., "model": ..., "table": {"lease": {"keeper": ...}}, ...}'

* ``{"op": "run", "seqs": [[seed, length], ...]}``: the sequences as requests
  of one step, run until done: the first step's external hits per sequence
  (what vLLM's connector found in the tier), then every block loaded is
  checked byte for byte against what the engine that stored it wrote
  (``{"event": "ran", "first_step_hits": {...}, "good": n, "bad": [...]}``);
  blocks computed are stored into the tier by vLLM's connector;
* ``{"op": "schedule", "seqs": [...]}``: the first step only (its loads are
  prepared: held in the tier, not yet read): ``{"event": "scheduled", ...}``;
* ``{"op": "finish"}``: the rest of that step and the run, checked as ``run``;
* ``{"op": "stats"}``: the manager's counts;
* ``{"op": "entries"}``: the tier's records, ``[[chunk, key hex], ...]``.

Every block's bytes are a function of its block hash, layer and rank
(``vllm_engine.expected``): a block stored by any engine on the same model
is checked by any other.

``fork_server``: this process builds nothing; each ``{"op": "spawn",
"args": {...}, "kill_at": "kind:N"}`` forks a child that builds the engine
of ``args`` (vLLM already imported: a child starts in a fraction of a
second), runs ``args["rounds"]`` (lists of sequences) one after the other, and
SIGKILLs itself at the N-th event of a kind: ``held`` (a lookup's hold
taken), ``granted`` (a store's chunks granted, not yet written),
``copying``/``copied`` (a worker about to copy a block into the tier / done),
``completed`` (``complete_store`` returned), ``loading`` (a load prepared,
not read). The server answers ``{"event": "spawned", "pid": ...}`` and, once
the child is gone, ``{"event": "reaped", "pid": ..., "status": ...}``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kept_engine as K  # noqa: E402  (installs vLLM's test platform)
import vllm_engine as E  # noqa: E402

say = K.say
tokens = K.tokens


class Tenant:
    """One engine: vLLM's scheduler and connector, its workers, and the checks."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.tp = args.get("tp", 1)
        config = E.vllm_config(args)
        kcc = E.kv_cache_config(config, args.get("gpu_blocks", 128))
        # vLLM builds the workers before the scheduler.
        self.workers: Any = E.LocalWorkers([E.Worker(config, kcc)]) if self.tp == 1 else K.RemoteWorkers(args, self.tp)
        self.sched = E.Scheduler(config, kcc)
        self.manager = self.sched.manager
        self.hits, self.loads = K.observe(self.sched)
        self.engine = E.Engine(self.sched, self.workers, self.tp)
        self.pending: tuple[Any, Any] | None = None
        self.batch: list[str] = []
        self.n = 0
        self.published: dict[str, int] = {"stored": 0, "removed": 0}
        """With KV cache events on: the blocks the scheduler published as stored
        and removed (what a KV-aware router reads)."""
        if args.get("events"):
            self.watch_events()

    def watch_events(self) -> None:
        """Count what vLLM's scheduler publishes (its own publisher, wrapped)."""
        from vllm.distributed.kv_events import BlockRemoved, BlockStored

        publisher = self.sched.sched.kv_event_publisher
        inner = publisher.publish

        def publish(batch: Any) -> Any:
            for e in batch.events:
                if isinstance(e, BlockStored):
                    self.published["stored"] += len(e.block_hashes)
                elif isinstance(e, BlockRemoved):
                    self.published["removed"] += len(e.block_hashes)
            return inner(batch)

        publisher.publish = publish

    def schedule(self, seqs: list[list[int]]) -> dict[str, int]:
        self.batch = []
        for seq in seqs:
            self.n += 1
            req_id = f"r{self.n}-{seq[0]}"
            self.batch.append(req_id)
            self.sched.add(req_id, tokens(seq))
        self.pending = self.sched.schedule()
        return {r.split("-", 1)[1]: self.hits.get(r, 0) for r in self.batch}

    def finish(self) -> tuple[int, list[list[Any]]]:
        assert self.pending is not None
        self.engine.finish(*self.pending)
        self.pending = None
        self.engine.run()
        good, bad = 0, []
        for req_id in self.batch:
            req = self.sched.requests[req_id]
            ids = self.loads.get(req_id, [])
            per_rank = self.workers.blocks(ids)
            for i, b in enumerate(ids):
                for rank, got in enumerate(per_rank):
                    data = got[b]
                    want = K.expected_block(rank, bytes(req.block_hashes[i]), len(data) // len(E.LAYERS))
                    if data == want:
                        good += 1
                    else:
                        bad.append([req_id, i, rank])
        return good, bad


def hook_manager(manager: Any) -> None:
    """Call ``E.STORE_HOOK`` at the tier's events of this engine's manager."""

    def wrap(name: str, event: str, when: Any) -> None:
        inner = getattr(manager, name)

        def call(*a: Any, **kw: Any) -> Any:
            out = inner(*a, **kw)
            if when(out) and E.STORE_HOOK is not None:
                E.STORE_HOOK(event, None)
            return out

        setattr(manager, name, call)

    from vllm.v1.kv_offload.base import LookupResult

    wrap("lookup", "held", lambda out: out is LookupResult.HIT)
    wrap("prepare_store", "granted", lambda out: out is not None and bool(out.keys_to_store))
    wrap("complete_store", "completed", lambda out: True)
    wrap("prepare_load", "loading", lambda out: True)


MANAGER_CALLS = ("lookup", "prepare_store", "complete_store", "prepare_load", "complete_load", "touch", "on_schedule_end")


def time_manager(manager: Any) -> dict[str, float]:
    """The longest each of the manager's calls took so far (seconds), as vLLM's
    scheduler makes them: the slowest of each kind, kept in the dict returned."""
    import time

    slowest: dict[str, float] = {}

    def wrap(name: str) -> None:
        inner = getattr(manager, name)

        def call(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                dt = time.perf_counter() - t
                if dt > slowest.get(name, 0.0):
                    slowest[name] = dt

        setattr(manager, name, call)

    for name in MANAGER_CALLS:
        wrap(name)
    return slowest


def serve(tenant: Tenant) -> None:
    say(
        event="started",
        manager=type(tenant.manager).__name__,
        chunks=tenant.manager._num_chunks,
        pid=os.getpid(),
    )
    slowest = time_manager(tenant.manager)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "slowest":
            say(event="slowest", **slowest)
            slowest.clear()
        elif op == "run":
            first = tenant.schedule(cmd["seqs"])
            good, bad = tenant.finish()
            say(event="ran", first_step_hits=first, good=good, bad=bad)
        elif op == "schedule":
            say(event="scheduled", first_step_hits=tenant.schedule(cmd["seqs"]))
        elif op == "finish":
            good, bad = tenant.finish()
            say(event="finished", good=good, bad=bad)
        elif op == "entries":
            entries = tenant.manager.tier.index.entries()
            say(event="entries", entries=[[slot, key.hex()] for slot, key in entries])
        elif op == "stats":
            say(event="stats", **getattr(tenant.manager, "stats", {}))
        elif op == "events":
            say(event="events", **tenant.published)


def child(args: dict[str, Any], kill_at: str) -> None:
    """A forked tenant: rounds of its sequences until it SIGKILLs itself."""
    K.arm_kill(kill_at)
    tenant = Tenant(args)
    hook_manager(tenant.manager)
    say(event="child", pid=os.getpid())
    for seqs in args["rounds"]:
        tenant.schedule(seqs)
        good, bad = tenant.finish()
        if bad:
            say(event="torn", bad=bad)
    # Never killed: the event never came (a clean end says so).
    say(event="unkilled", pid=os.getpid())


def fork_server() -> None:
    say(event="started", pid=os.getpid())
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] != "spawn":
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                child(cmd["args"], cmd["kill_at"])
            except BaseException as e:  # noqa: BLE001 - reported, then exit
                say(event="child_error", error=f"{type(e).__name__}: {e}")
                code = 1
            finally:
                sys.stdout.flush()
                os._exit(code)
        say(event="spawned", pid=pid)
        _, status = os.waitpid(pid, 0)
        say(
            event="reaped",
            pid=pid,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        )


def main() -> None:
    args = json.loads(sys.argv[1])
    if args.get("vllm_logging"):
        # vLLM's own setup (VLLM_CONFIGURE_LOGGING) is the process's only one.
        K.vllm_logging(E.vllm_config(args))
    else:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    if args.get("fork_server"):
        fork_server()
        return
    try:
        tenant = Tenant(args)
    except Exception as e:  # noqa: BLE001 - the test reads why
        say(event="refused", error=f"{type(e).__name__}: {e}")
        sys.exit(3)
    serve(tenant)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
