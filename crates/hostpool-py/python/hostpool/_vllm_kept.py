"""vLLM's CPU tier kept across engine restarts: the manager that survives in the kept pool's index.

:class:`HostPoolOffloadingManager` is vLLM's ``CPUOffloadingManager``
(subclassed, never patched) whose block map (offload key -> chunk) has a
durable copy, the index at the tail of a kept pool (``hostpool keep`` with
``content = "keep"``; see ``docs/design.md``, "A kept pool's index"):

* a key is recorded in ``complete_store`` (after every worker wrote its
  bytes), a chunk is unrecorded when it is freed (evicted, or a failed
  store) and again when ``prepare_store`` hands it out, before any worker
  writes it: a chunk the index names always holds its key's bytes;
* a restarted engine's manager starts with every recorded block present,
  ready and evictable. It restores lazily: a key enters vLLM's cache policy
  when a lookup first asks for it (an O(1) probe of the index's key table),
  so the first hit does not wait for the records to be read; the first
  store (or stats, or eviction) surveys the index once, in Rust, to learn
  the free chunks and the order of last use, and the blocks no lookup asked
  for are evicted first, oldest use first;
* the order of last use is stamped in the index where vLLM's policy learns
  it: ``on_request_finished`` (every release), ``touch`` (0.33, which still
  has it) and ``prepare_load``;
* the index carries a fingerprint of everything that decides what a chunk's
  bytes mean (:func:`identity`): another one starts cold and empties it,
  with one warning naming the field.

The scheduler process maps the kept pool as its engine's *companion*
(``lease.companion_of``): the workers hold the lease; the scheduler maps
it beside them, in no barrier.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import hostpool

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

__all__ = ["HostPoolOffloadingManager", "KeptTier", "identity"]

_log = logging.getLogger("hostpool.vllm")

FORMAT = "hostpool.vllm/1"
"""What an index record's key is: vLLM's ``OffloadKey`` bytes, one slot per chunk."""

_NON_CRYPTO_HASHES = ("xxhash", "xxhash_cbor")


def _hash_state(vllm_config: Any) -> tuple[str, str, str | None]:
    """vLLM's prefix-cache hash: (algorithm, seed identity, why not reproducible)."""
    from hostpool._engines import vllm as names

    algorithm = None
    if vllm_config is not None:
        algorithm = getattr(getattr(vllm_config, "cache_config", None), "prefix_caching_hash_algo", None)
    none_hash, resolved = names.none_hash()
    if algorithm is None and none_hash is not None and resolved is not None:
        # The algorithm whose hash of the seed is vLLM's NONE_HASH.
        from vllm.utils.hashing import get_hash_fn_by_name

        for name in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
            try:
                if get_hash_fn_by_name(name)(resolved) == none_hash:
                    algorithm = name
                    break
            except Exception:  # an optional hash library missing
                continue
    algorithm = str(algorithm or "unknown")
    env_seed = os.getenv("PYTHONHASHSEED")
    if env_seed is not None:
        seed = "PYTHONHASHSEED:" + hashlib.sha256(env_seed.encode()).hexdigest()[:16]
        return algorithm, seed, None
    if algorithm in _NON_CRYPTO_HASHES:
        return (
            algorithm,
            "random",
            f"vLLM's block hashes ({algorithm}) are not reproducible across processes: without "
            "PYTHONHASHSEED each start draws a random seed, so no block stored before can be "
            "found again. Set PYTHONHASHSEED to the same value for every start of the engine, "
            "or use --prefix-caching-hash-algo sha256",
        )
    return algorithm, "default", None


def identity(spec: Any, vllm_config: Any = None) -> tuple[dict[str, str], str | None]:
    """The identity of what a kept CPU tier's chunks hold, as a fingerprint in order (the
    index compares it field by field and names the first that differs), and why vLLM's
    block hashes are not reproducible across processes (``None`` when they are).

    ``spec`` is the :class:`~hostpool.vllm.HostPoolOffloadingSpec`; ``vllm_config`` is
    the engine's ``VllmConfig`` when known (the model's revision and dtype, and the hash
    algorithm, come from it; ``"unknown"`` otherwise).
    """
    import vllm

    config = spec.config
    model_config = getattr(vllm_config, "model_config", None)
    algorithm, seed, problem = _hash_state(vllm_config)
    p = config.parallel
    groups = ";".join(
        f"{g.group_id}:{g.tokens_per_block}:{len(g.layer_names)}:{g.sliding_window_size_in_chunks}"
        for g in config.groups
    )
    fields = {
        "format": FORMAT,
        "model": str(config.model.name),
        "revision": "unknown" if model_config is None else str(model_config.revision or "default"),
        "dtype": "unknown" if model_config is None else str(model_config.dtype).removeprefix("torch."),
        "kv_cache_dtype": str(config.model.dtype),
        "block_size": ",".join(str(g.tokens_per_block) for g in config.groups),
        "tokens_per_hash": str(config.cache.tokens_per_hash),
        "blocks_per_chunk": str(config.cache.blocks_per_chunk),
        "tp": str(p.tp_size),
        "pp": str(p.pp_size),
        "dcp": str(p.dcp_size),
        "pcp": str(p.pcp_size),
        "dp_index": str(p.data_parallel_index),
        "world_size": str(p.world_size),
        "kv_layout": f"{config.kv_cache_layout};replicated={spec.replicated_layout};"
        f"canonical={config.canonical_layout};groups={groups}",
        "kv_bytes_per_block_per_worker": str(config.worker_kv_bytes_per_block),
        "kv_bytes_per_chunk": str(spec.kv_bytes_per_chunk),
        "hash_algorithm": algorithm,
        "hash_seed": seed,
        "vllm": str(vllm.__version__),
        "hostpool": str(hostpool.__version__),
    }
    return fields, problem


class KeptTier:
    """The kept pool as the scheduler maps it (a companion of the workers' lease), and
    its index, attached at the first use (vLLM sets its block hash's seed after it
    builds the scheduler, before the first lookup)."""

    def __init__(
        self,
        pool: hostpool.Pool,
        slots: int,
        bytes_per_slot: int,
        identity: Callable[[], tuple[dict[str, str], str | None]],
    ) -> None:
        self.pool = pool
        self.slots = slots
        self.bytes_per_slot = bytes_per_slot
        self._identity = identity
        self._attached = False
        self._index: hostpool.KvIndex | None = None
        self.lease: dict[str, Any] = dict(pool.report.get("keeper") or {})
        """The lease's report (generation, previous, ...)."""
        self.cold_reason: str | None = None
        """Why the tier started cold (``None`` when warm, or before the first use)."""

    def index(self) -> hostpool.KvIndex | None:
        """The index to record in (attached at the first call; ``None`` when the block
        hashes are not reproducible, so nothing recorded could be found again)."""
        if self._attached:
            return self._index
        self._attached = True
        fields, problem = self._identity()
        index = self.pool.index(self.slots, fields)
        generation = self.lease.get("generation")
        if problem is not None:
            # Formatted afresh for a random seed: empty, and nothing to keep.
            self.cold_reason = problem
            _log.warning("CPU offload tier starts cold and is not kept: %s", problem)
            return None
        self._index = index
        if index.warm:
            _log.info(
                "CPU offload tier: kept index found (lease generation %s, %d chunks of %d bytes); "
                "its blocks come back as lookups ask for them",
                generation,
                self.slots,
                self.bytes_per_slot,
            )
            return index
        field = index.cold_field
        if field is not None and field[1] is not None:
            name, before, now = field
            self.cold_reason = f"the kept blocks were stored for {name} {before!r}, this engine has {now!r}"
            _log.warning(
                "CPU offload tier starts cold: the kept index was stored for %s = %r, this engine "
                "has %s = %r; the index is cleared and the chunks are reused",
                name,
                before,
                name,
                now,
            )
        else:
            self.cold_reason = index.cold_reason or "no kept index"
            _log.info(
                "CPU offload tier starts cold (lease generation %s): %s", generation, self.cold_reason
            )
        return index

    def close(self) -> None:
        """Unmap and release the companion lease (also at exit)."""
        if not self.pool.closed:
            self.pool.close()


_RESTORE_CONTEXT = ReqContext(req_id="hostpool-restore")


class _RestoringPolicy(CachePolicy):
    """vLLM's cache policy, with the kept index's blocks behind it.

    A key the policy does not hold is looked up in the index (``get``); found, it
    is inserted as vLLM's ``complete_store`` would leave it (ready, evictable) and
    served. Blocks no lookup asked for are evicted first, oldest use first
    (``unpulled``, filled by the manager's survey); then the policy's own.
    """

    def __init__(self, inner: CachePolicy, manager: HostPoolOffloadingManager) -> None:
        super().__init__(inner.cache_capacity)
        self.inner = inner
        self._manager = weakref.ref(manager)
        self.pulled: set[int] = set()
        """Chunks of the index that a lookup brought into the policy."""
        self.unpulled: deque[int] = deque()
        """Recorded chunks, oldest use first, not brought in (some may be since)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        chunk = self.inner.get(key)
        if chunk is not None:
            return chunk
        manager = self._manager()
        index = None if manager is None else manager.kept_index()
        if index is None or not index.warm:
            return None
        slot = index.find(key)
        if slot is None or slot in self.pulled:
            return None
        chunk = ChunkStatus(slot)
        self.inner.insert(key, chunk, _RESTORE_CONTEXT)
        chunk.ref_cnt = 0
        self.inner.mark_evictable(key)
        self.pulled.add(slot)
        assert manager is not None
        manager._pulled(slot)
        return chunk

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.inner.insert(key, chunk, req_context)

    def remove(self, key: OffloadKey) -> None:
        self.inner.remove(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # vLLM 0.33's recency (0.34 has no touch: on_request_finished alone).
        keys = list(keys)
        self.inner.touch(keys, req_context)
        self.stamp(keys)

    def stamp(self, keys: Iterable[OffloadKey]) -> None:
        """Mark the ready chunks of ``keys`` as used now in the index, in that order:
        a restarted engine evicts in the order of last use."""
        manager = self._manager()
        index = None if manager is None else manager.kept_index()
        if index is None:
            return
        slots = []
        for key in keys:
            chunk = self.inner.get(key)
            if chunk is not None and chunk.is_ready:
                slots.append(chunk.chunk_id)
        if slots:
            index.touch_many(slots)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self.inner.on_store_miss(keys, req_context)

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self.inner.on_request_access(keys, req_context)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        self.inner.on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)
        # Recency in every release (0.34 has it from here alone).
        self.stamp(key for keys in key_groups for key in keys)

    def mark_evictable(self, key: OffloadKey) -> None:
        self.inner.mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.inner.mark_non_evictable(key)

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        manager = self._manager()
        index = None if manager is None else manager.kept_index()
        taken: list[tuple[OffloadKey, ChunkStatus]] = []
        kept: list[int] = []  # protected: they stay, in their order
        while len(taken) < n and self.unpulled and index is not None:
            slot = self.unpulled.popleft()
            if slot in self.pulled:
                continue
            key = index.get(slot)
            if key is None:
                continue
            if key in protected:
                kept.append(slot)
                continue
            chunk = ChunkStatus(slot)
            chunk.ref_cnt = 0
            taken.append((OffloadKey(key), chunk))
        more: list[tuple[OffloadKey, ChunkStatus]] | None = []
        if len(taken) < n:
            more = self.inner.evict(n - len(taken), protected)
        if more is None:
            # All or nothing: the blocks taken go back where they were.
            kept.extend(chunk.chunk_id for _, chunk in taken)
            taken = []
        self.unpulled.extendleft(reversed(kept))
        if more is None:
            return None
        taken.extend(more)
        return taken

    def clear(self) -> None:
        self.inner.clear()
        self.pulled.clear()
        self.unpulled.clear()


class HostPoolOffloadingManager(CPUOffloadingManager):
    """vLLM's ``CPUOffloadingManager`` whose block map is kept in the kept pool's index,
    so that a restarted engine finds its CPU tier warm (see the module's doc)."""

    def __init__(self, *, kept: KeptTier, **kwargs: Any) -> None:
        """vLLM's manager (``kwargs`` are its arguments) over the kept tier ``kept``."""
        super().__init__(**kwargs)
        self.kept = kept
        self._restoring = _RestoringPolicy(self._policy, self)
        self._policy = self._restoring
        self._surveyed = False
        self.restored_blocks: int | None = None
        """Blocks the survey found recorded (``None`` before it ran)."""
        # Released at exit too (a clean end of the lease, not a death).
        weakref.finalize(self, kept.close).atexit = True

    # --- the index -----------------------------------------------------------

    def kept_index(self) -> hostpool.KvIndex | None:
        """The kept index (attached at the first call), or ``None`` when not kept."""
        return self.kept.index()

    def _pulled(self, slot: int) -> None:
        # Before the survey, the block was counted nowhere; after it, as an
        # evictable block of the index already.
        if not self._surveyed:
            self._num_evictable_cache_chunks += 1

    def survey(self) -> None:
        """Account for every chunk of a warm index, once: free chunks to the free list,
        recorded ones as present and evictable (evicted first, oldest use first)."""
        if self._surveyed:
            return
        self._surveyed = True
        index = self.kept_index()
        if index is None or not index.warm:
            return
        t0 = time.perf_counter()
        free, recorded = index.survey()
        pulled = self._restoring.pulled
        # Every chunk is accounted for from now: no fresh ones.
        self._num_allocated_chunks = self._num_chunks
        free.reverse()  # list.pop() hands out the lowest chunk first
        self._free_list = free
        unpulled = deque(recorded) if not pulled else deque(s for s in recorded if s not in pulled)
        self._restoring.unpulled = unpulled
        self._num_evictable_cache_chunks += len(unpulled)
        self.restored_blocks = len(recorded)
        secs = time.perf_counter() - t0
        _log.info(
            "CPU offload tier kept across the restart: %d blocks (%d bytes) restored from lease "
            "generation %s's index in %.1f ms (%d free chunks)",
            len(recorded),
            len(recorded) * self.kept.bytes_per_slot,
            self.kept.lease.get("generation"),
            secs * 1e3,
            len(free),
        )

    # --- vLLM's manager, recording ----------------------------------------------

    def _get_num_free_chunks(self) -> int:
        self.survey()
        return super()._get_num_free_chunks()

    def _allocate_chunks(self, keys: list[OffloadKey]) -> list[ChunkStatus]:
        chunks = super()._allocate_chunks(keys)
        index = self.kept_index()
        if index is not None:
            # Before any worker writes them.
            index.unrecord_many([c.chunk_id for c in chunks])
        return chunks

    def _free_chunk(self, chunk: ChunkStatus) -> None:
        index = self.kept_index()
        if index is not None:
            index.unrecord(chunk.chunk_id)
        super()._free_chunk(chunk)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        stored: list[tuple[int, OffloadKey]] = []
        if success:
            for key in keys:
                chunk = self._policy.get(key)
                if chunk is not None and not chunk.is_ready:
                    stored.append((chunk.chunk_id, key))
        super().complete_store(keys, req_context, success)
        index = self.kept_index()
        if stored and index is not None:
            index.record_many([s for s, _ in stored], [bytes(k) for _, k in stored])

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Any:
        spec = super().prepare_load(keys, req_context)
        self._restoring.stamp(keys)
        return spec

    def get_stats(self) -> Any:
        self.survey()
        return super().get_stats()

    def reset_cache(self) -> None:
        super().reset_cache()
        self._surveyed = True  # nothing left to restore
        index = self.kept_index()
        if index is not None:
            index.clear()
