"""One CPU tier for the vLLM engines of a node: the manager over a keeper's shared tier.

With a keeper started with ``--tenants N`` (``hostpool keep --tenants N``),
every engine that names it in its ``lease`` table is a tenant of one kept
pool, and :class:`SharedTierManager` (vLLM's ``OffloadingManager``) is each
engine's view of the one CPU tier the keeper writes for all of them (see
``docs/design.md``, "One CPU tier for the engines of a node"):

* ``lookup`` reads the index at the pool's tail in place (no message, no
  system call): a block any engine stored is a hit. A hit is then held by
  the keeper before ``lookup`` says so, so no other engine's store can
  evict it between vLLM's lookup and its load, and with it, in the same
  message (``Pool.tier_hold``), the blocks stored after it: the rest of the
  prefix, which vLLM asks for next, is held already. Holds a step did not
  load are released at the step's end (``on_schedule_end``), in one message;
* ``prepare_store`` asks the keeper for a chunk per key (``tier_store``):
  a free one, or the oldest in one order of last use across the engines
  that no engine holds or writes; ``complete_store`` records them for every
  engine (``tier_stored``) or gives them back (``tier_abort``);
* ``prepare_load`` / ``complete_load`` keep and release the holds;
* an engine that dies anywhere leaves nothing behind: the keeper sees its
  lease end and drops its writes in flight and its holds.

The workers write and read the chunks where vLLM's own manager would put
them (chunk ``i`` at ``i * kv_bytes_per_chunk`` of the pool), so a block one
engine stored is read in place by every other: no copy between engines.

The keeper never fails or stalls an engine. Every request waits at most
:data:`WAIT` for the keeper's answer, with the GIL released; completions,
releases and touches are sent without waiting at all. A keeper that does
not answer in time is *away*: stores are declined (``prepare_store``
answers ``None``), lookups of blocks this engine does not hold already are
misses, and one request a second looks for it again. A keeper that ended
is *lost*: stores are declined, and lookups go on from the index in place,
held by this engine alone (no keeper is left to grant a chunk to a writer,
so a block found stays as it is). Blocks held before either keep their
bytes until they are loaded. Once lost, a thread leases the kept pool again
in the background (backoff from 0.1 s to 2 s, never on the scheduler's
thread); when the restarted keeper serves the same memory (it adopted the
pool: systemd's file descriptor store, a persist directory), the next
manager call opens the tier again telling the keeper what this engine was
writing and holding (``Pool.tier_rejoin``), and the engine shares again. A
keeper that built other memory cannot be shared with this engine's workers:
it says so, once, and goes on without the tier. The engine's log says once that the tier is
away or lost, naming the keeper and why, and once that it is back.

Engines share when everything in the tier's fingerprint (:func:`identity`)
is the same: an engine of another model, dtype, layout, block size or
parallelism is refused by the keeper while engines of the current one hold
the tier, naming the field and both values.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import hostpool

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

__all__ = ["SharedTier", "SharedTierManager", "identity"]

_log = logging.getLogger("hostpool.vllm")

WAIT = 0.010
"""The longest (seconds) a manager call waits for the keeper's answer on the
scheduler's thread (a store's chunks, a lookup's hold); an answer that comes
later gives back what it granted by itself. A round trip to a keeper that is
running is tens of microseconds."""

REJOIN_FIRST = 0.1
"""Seconds before the first try to lease a lost keeper's pool again; doubled
after each failed try, up to :data:`REJOIN_MOST`."""

REJOIN_MOST = 2.0

AHEAD = 256
"""Blocks a lookup's hold takes beyond the one asked for, in the same message:
the blocks stored after it in one batch (those of one request, in order)."""

# What differs between the replicas of one model by design: not part of
# what the tier's chunks mean.
_PER_REPLICA = ("dp_index",)


_EVENT_FIELDS = frozenset(f.name for f in dataclasses.fields(OffloadingEvent))


def _event(keys: list[OffloadKey], medium: Medium, removed: bool, **extra: Any) -> OffloadingEvent:
    """An ``OffloadingEvent`` in this release's own shape, as vLLM's CPU manager
    makes it: ``extra`` fields this release's dataclass lacks are left out
    (``req_context``, ``removal_expected`` and ``metadata_only`` are not in
    every release)."""
    kept = {k: v for k, v in extra.items() if k in _EVENT_FIELDS}
    return OffloadingEvent(keys=keys, medium=medium, removed=removed, **kept)


def identity(spec: Any, vllm_config: Any = None) -> dict[str, str]:
    """The fingerprint the engines sharing a tier must agree on: the kept
    tier's (:func:`hostpool._vllm_kept.identity`) less what differs between
    the replicas of one model (the DP index; the engine id is in none).

    Raises :class:`hostpool.ConfigError` when vLLM's block hashes are not
    reproducible across processes: then no engine could ever find another's
    blocks, and storing them would only evict the blocks that can be found.
    """
    from hostpool._vllm_kept import identity as kept_identity

    fields, problem = kept_identity(spec, vllm_config)
    if problem is not None:
        raise hostpool.ConfigError(f"a CPU tier shared between engines needs reproducible block hashes: {problem}")
    return {k: v for k, v in fields.items() if k not in _PER_REPLICA}


class SharedTier:
    """The kept pool as this engine's scheduler maps it (a companion of its
    workers' lease), the tier opened on it (``Pool.tier_open``: the keeper
    checks the identity and formats or keeps the index), and the index read
    in place."""

    def __init__(self, pool: hostpool.Pool, slots: int, bytes_per_slot: int, fingerprint: dict[str, str]) -> None:
        self.pool = pool
        self.slots = slots
        self.bytes_per_slot = bytes_per_slot
        self.fingerprint = fingerprint
        self.index: hostpool.KvIndex = pool.tier_open(slots, fingerprint)
        """The index the keeper writes: read here only (``find``, ``get``)."""
        self.lease: dict[str, Any] = dict(pool.report.get("keeper") or {})
        if self.index.warm:
            _log.info(
                "CPU offload tier shared through kept pool `%s` (%d chunks of %d bytes): %d blocks "
                "stored by its engines are hits from the first step",
                self.lease.get("name"),
                slots,
                bytes_per_slot,
                len(self.index),
            )
        else:
            _log.info(
                "CPU offload tier shared through kept pool `%s` (%d chunks of %d bytes) starts cold: %s",
                self.lease.get("name"),
                slots,
                bytes_per_slot,
                self.index.cold_reason,
            )

    def close(self) -> None:
        """Unmap and release the companion lease (the keeper then drops what
        this engine was writing or holding, once its workers are gone too)."""
        if not self.pool.closed:
            self.pool.close()


def file_ids(pool: hostpool.Pool) -> list[tuple[int, int]]:
    """The identity (device, inode) of each file ``pool`` maps, in pool order:
    two pools of the same memory have the same."""
    ids = []
    for fd, _, _, _ in pool.files():
        st = os.fstat(fd)
        ids.append((st.st_dev, st.st_ino))
    return ids


@dataclass
class _Hold:
    """A block this engine holds in the tier: its chunk, and the loads of it
    in flight (0: held by a lookup of this step alone). ``local``: held here
    alone, found while the keeper was lost (nothing to release to it)."""

    slot: int
    loads: int = 0
    local: bool = False


class SharedTierManager(OffloadingManager):
    """vLLM's offloading manager over one CPU tier shared by the engines of a
    node (see the module's doc). One keeper message a batch (a store's keys,
    a completion, a step's unread holds) and one per run of stored blocks a
    lookup finds (their holds); none for a miss. Only a store's chunks and a
    lookup's holds wait for an answer, at most :data:`WAIT`."""

    def __init__(self, *, tier: SharedTier, enable_events: bool = False, info: Any = None) -> None:
        self.tier = tier
        self.medium: Medium = Medium.CPU
        self._num_chunks = tier.slots
        self._config_info = info.as_config_info() if info is not None else {}
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._writing: dict[OffloadKey, int] = {}
        """This engine's stores in flight: key -> the chunk granted."""
        self._holds: dict[OffloadKey, _Hold] = {}
        self._num_write_pending_chunks = 0
        self._down: tuple[str, str] | None = None
        """How the keeper is, when not answering: ("away" or "lost", why)."""
        self._rejoin: threading.Thread | None = None
        self._leased: hostpool.Pool | None = None
        """The kept pool leased again by the rejoin thread, for the scheduler's
        thread to open the tier on (handed over under ``_lock``)."""
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.stats = {"lookups": 0, "hits": 0, "stored": 0, "loaded": 0, "evicted": 0, "busy": 0, "declined": 0}
        """What this engine asked of the tier (hits: lookups that found a block;
        declined: stores declined while the keeper was away or lost)."""
        weakref.finalize(self, tier.close).atexit = True

    # --- the keeper: asked within WAIT, told without waiting ------------------

    def _ask(self, method: Any, *args: Any) -> Any:
        """``method``'s answer within :data:`WAIT`, or ``None`` when the keeper
        did not give one (away, lost, or refused: said once in the log)."""
        if self._lost():
            return None
        try:
            answer = method(*args, timeout=WAIT)
        except hostpool.KeeperError as e:
            self._went("lost" if e.absent else "away", str(e))
            return None
        except hostpool.Error as e:
            _log.warning("CPU offload tier of kept pool `%s`: a request was refused: %s", self._name(), e)
            return None
        if self._down is not None:
            _log.info(
                "CPU offload tier of kept pool `%s` is back (it was %s): sharing again", self._name(), self._down[0]
            )
            self._down = None
        return answer

    def _come_back(self) -> None:
        """On the scheduler's thread: when the rejoin thread leased the
        restarted keeper's pool (the same memory), open the tier on it telling
        what this engine was writing and holding, and share again."""
        if self._leased is None:
            return
        with self._lock:
            pool, self._leased = self._leased, None
        if pool is None:
            return
        writing = [(slot, bytes(key)) for key, slot in self._writing.items()]
        holding = [bytes(k) for k in self._holds]
        tier = self.tier
        try:
            index, claimed, held = pool.tier_rejoin(
                tier.slots, tier.fingerprint, writing, holding, timeout=max(WAIT, 0.5)
            )
        except hostpool.Error as e:
            _log.warning("CPU offload tier of kept pool `%s` could not be opened again: %s", self._name(), e)
            self._close_quietly(pool)
            self._start_rejoin()
            return
        # Stores the restarted keeper did not give back are not this engine's
        # to complete; holds it did are the keeper's again.
        for key, slot in list(self._writing.items()):
            if slot not in claimed:
                del self._writing[key]
                self._num_write_pending_chunks -= 1
        again = {bytes(k): slot for k, slot in held}
        for key, hold in self._holds.items():
            if again.get(bytes(key)) == hold.slot:
                hold.local = False
        old, tier.pool, tier.index = tier.pool, pool, index
        tier.lease = dict(pool.report.get("keeper") or {})
        self._close_quietly(old)
        _log.info(
            "CPU offload tier of kept pool `%s` is back: rejoined its restarted keeper (%s, %d "
            "blocks stored), %d store(s) in flight and %d hold(s) kept: sharing again",
            self._name(),
            "warm" if index.warm else f"cold: {index.cold_reason}",
            len(index),
            len(claimed),
            len(held),
        )
        self._down = None

    @staticmethod
    def _close_quietly(pool: hostpool.Pool) -> None:
        try:
            pool.close()
        except hostpool.Error:
            pass

    def _start_rejoin(self) -> None:
        if self._closing.is_set() or (self._rejoin is not None and self._rejoin.is_alive()):
            return
        self._rejoin = threading.Thread(target=self._rejoin_loop, name="hostpool-tier-rejoin", daemon=True)
        self._rejoin.start()

    def _rejoin_loop(self) -> None:
        """Off the scheduler's thread: lease the kept pool again until a keeper
        serves it; hand it over when it is the same memory this engine maps."""
        name = self._name()
        mine = file_ids(self.tier.pool)
        delay = REJOIN_FIRST
        while not self._closing.wait(delay):
            delay = min(delay * 2, REJOIN_MOST)
            # A keeper restarted with neither systemd's store nor a persist
            # directory takes the pool back from its tenants (one is enough).
            try:
                if self.tier.pool.hand_back(name):
                    _log.info("CPU offload tier of kept pool `%s`: handed the pool back to its restarted keeper", name)
            except hostpool.Error:
                pass
            try:
                pool = hostpool.Pool.from_config({"lease": {"keeper": name, "attach_timeout_secs": 2.0}})
            except hostpool.Error:
                continue
            if file_ids(pool) != mine:
                self._close_quietly(pool)
                _log.warning(
                    "CPU offload tier of kept pool `%s`: its restarted keeper built other memory, "
                    "which this engine's workers do not map: the engine goes on without the tier "
                    "(restart it to share again)",
                    name,
                )
                return
            with self._lock:
                self._leased = pool
            return

    def _tell(self, method: Any, items: list[Any]) -> None:
        """``method`` told ``items`` without waiting (queued while the keeper
        does not read; dropped once it is lost, which dropped them too)."""
        if not items or self._lost():
            return
        try:
            method(items, wait=False)
        except hostpool.KeeperError as e:
            self._went("lost" if e.absent else "away", str(e))

    def _went(self, how: str, why: str) -> None:
        if self._down is None or self._down[0] != how:
            link = self.tier.pool.tier_link
            _log.warning(
                "CPU offload tier of kept pool `%s` is %s (%s). The engine goes on: stores are declined%s",
                self._name(),
                how,
                link[1] if link[0] == how and link[1] else why,
                " and lookups read what is stored in place" if how == "lost" else ", lookups miss until it answers",
            )
        self._down = (how, why)
        if how == "lost":
            # What the keeper held for this engine went with it: the holds of
            # loads in flight stay here, until they are loaded.
            for hold in self._holds.values():
                hold.local = True
            self._start_rejoin()

    def _lost(self) -> bool:
        return self._down is not None and self._down[0] == "lost"

    def _name(self) -> Any:
        return self.tier.lease.get("name")

    # --- lookups: the index in place, then a hold ----------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._come_back()
        self.stats["lookups"] += 1
        if key in self._writing:
            return LookupResult.HIT_PENDING
        if key in self._holds:
            self.stats["hits"] += 1
            return LookupResult.HIT
        slot = self.tier.index.find(bytes(key))
        if slot is None:
            return LookupResult.MISS
        # Found: held before it is said to be, so no store of another engine
        # evicts it before vLLM loads it; with it, in the same message, the
        # blocks stored after it (the rest of the prefix vLLM goes on to ask for).
        held = self._ask(self.tier.pool.tier_hold, bytes(key), AHEAD)
        if held is None and self._lost():
            # No keeper is left to grant this chunk to a writer: it stays as
            # found, held here alone.
            self._holds[key] = _Hold(slot, local=True)
            self.stats["hits"] += 1
            return LookupResult.HIT
        if held is None:
            return LookupResult.MISS  # the keeper is away: nothing is held
        again = []
        for k, slot in held:
            if k in self._holds:
                again.append(slot)  # held already: one hold a block
            else:
                self._holds[OffloadKey(k)] = _Hold(slot)
        self._tell(self.tier.pool.tier_release, again)
        if key not in self._holds:
            return LookupResult.MISS  # evicted in between
        self.stats["hits"] += 1
        return LookupResult.HIT

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> Any:
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        missing = [k for k in keys if k not in self._holds]
        if missing:
            slots = self._ask(self.tier.pool.tier_load, [bytes(k) for k in missing])
            local = slots is None and self._lost()
            if local:
                # No keeper is left to grant a chunk to a writer: as found.
                slots = [self.tier.index.find(bytes(k)) for k in missing]
            for key, slot in zip(missing, slots or [None] * len(missing)):
                if slot is None:
                    raise RuntimeError(
                        f"CPU offload tier: block {bytes(key).hex()} was evicted between vLLM's lookup "
                        "and its load (a lookup holds what it finds: this is a bug, please report it)"
                    )
                self._holds[key] = _Hold(slot, local=local)
        chunks = []
        for key in keys:
            hold = self._holds[key]
            hold.loads += 1
            chunks.append(hold.slot)
        self.stats["loaded"] += len(keys)
        return CPULoadStoreSpec(chunks)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        done = []
        for key in keys:
            hold = self._holds.get(key)
            if hold is None or hold.loads == 0:
                continue
            hold.loads -= 1
            if hold.loads == 0:
                del self._holds[key]
                if not hold.local:
                    done.append(hold.slot)
        self._tell(self.tier.pool.tier_loaded, done)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext | None = None) -> None:
        """vLLM 0.33's recency: the newest in the tier's one order of last use."""
        self._tell(self.tier.pool.tier_touch, [bytes(k) for k in keys])

    def on_schedule_end(self, context: Any) -> None:
        """Release the holds of this step's lookups that no load took."""
        self._come_back()
        idle = [k for k, h in self._holds.items() if h.loads == 0]
        released = [self._holds.pop(k) for k in idle]
        self._tell(self.tier.pool.tier_release, [h.slot for h in released if not h.local])

    # --- stores: chunks granted by the keeper ---------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        self._come_back()
        candidates = [k for k in dict.fromkeys(keys) if k not in self._writing]
        # Stored already (by any engine): nothing to write.
        ask = [k for k in candidates if k not in self._holds and self.tier.index.find(bytes(k)) is None]
        to_store: list[OffloadKey] = []
        slots: list[int] = []
        evicted: list[OffloadKey] = []
        if ask:
            puts = self._ask(self.tier.pool.tier_store, [bytes(k) for k in ask])
            if puts is None:
                # The keeper is away or lost: no chunk can be granted.
                self.stats["declined"] += len(ask)
                return None
            for key, (what, slot, gone) in zip(ask, puts):
                if what == "granted":
                    assert slot is not None
                    to_store.append(key)
                    slots.append(slot)
                    self._writing[key] = slot
                    if gone is not None:
                        evicted.append(OffloadKey(gone))
                elif what == "no_room":
                    self.stats["busy"] += 1
        self._num_write_pending_chunks += len(to_store)
        self.stats["evicted"] += len(evicted)
        if evicted and self.events is not None:
            self.events.append(_event(evicted, self.medium, removed=True))
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=CPULoadStoreSpec(slots), evicted_keys=evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        mine = [(k, self._writing.pop(k)) for k in keys if k in self._writing]
        if not mine:
            return
        self._num_write_pending_chunks -= len(mine)
        slots = [s for _, s in mine]
        if success:
            self._tell(self.tier.pool.tier_stored, slots)
            self.stats["stored"] += len(mine)
            if self.events is not None:
                # As vLLM's CPU manager says it, in the release's own shape.
                keys = [k for k, _ in mine]
                self.events.append(
                    _event(keys, self.medium, removed=False, removal_expected=True, req_context=req_context)
                )
        else:
            self._tell(self.tier.pool.tier_abort, slots)
            if self.events is not None:
                keys = [k for k, _ in mine]
                self.events.append(_event(keys, self.medium, removed=True, metadata_only=True))

    # --- the rest of vLLM's manager ---------------------------------------------

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return
        events, self.events = self.events, []
        yield from events

    def reset_cache(self) -> None:
        """This engine's part only: its stores in flight given back, its holds
        released. The blocks stay, for the other engines."""
        self._tell(self.tier.pool.tier_abort, list(self._writing.values()))
        self._writing.clear()
        # One keeper hold per block, however many loads of it.
        self._tell(self.tier.pool.tier_release, [h.slot for h in self._holds.values() if not h.local])
        self._holds.clear()
        self._num_write_pending_chunks = 0

    def config_info(self) -> Sequence[Any]:
        return [self._config_info]

    def get_stats(self) -> Any:
        return None

    def shutdown(self) -> None:
        self._closing.set()
        with self._lock:
            pool, self._leased = self._leased, None
        if pool is not None:
            self._close_quietly(pool)
        self.tier.close()


def _bisect_fit(size: int, per_chunk: int, page: int, most: int) -> int:
    """The most chunks of ``per_chunk`` bytes (at most ``most``) that fit in a
    kept pool of ``size`` bytes beside the index of as many."""
    lo, hi = 0, min(most, size // max(per_chunk, 1))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid * per_chunk + hostpool.index_bytes(mid, page) <= size:
            lo = mid
        else:
            hi = mid - 1
    return lo


def chunks_that_fit(size: int, per_chunk: int, page: int, most: int) -> int:
    """Chunks of the tier in a kept pool of ``size`` bytes of ``page``-byte
    pages: vLLM's ``most`` (``cpu_bytes_to_use`` in chunks) when they and
    their index fit, else as many as fit beside their index."""
    if most <= 0 or most * per_chunk + hostpool.index_bytes(most, page) <= size:
        return most
    return _bisect_fit(size, per_chunk, page, most)

