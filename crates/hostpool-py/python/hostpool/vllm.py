"""hostpool as vLLM's CPU KV offload memory, loaded from vLLM's own config.

Turn it on with vLLM's out-of-tree offloading spec door::

    vllm serve MODEL --kv-transfer-config '{
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "HostPoolOffloadingSpec", "spec_module_path": "hostpool.vllm",
            "cpu_bytes_to_use": 68719476736,
            "hostpool": {"dir": "/dev/hugepages1G", "pin": {"kind": "cuda", "background": true}}}}'

:class:`HostPoolOffloadingSpec` is vLLM's ``CPUOffloadingSpec`` (same sizing,
manager and worker) whose workers lay their region over a hostpool pool
(:class:`hostpool.torch.HostPoolRegion`) instead of ``/dev/shm`` files:

* the ``hostpool`` table takes a pool config's keys (``dir``, ``backing``,
  ``page_size``, ``numa_node``, ``threads``, ``prefault``, ``pin`` with
  ``background``, ``block_size``, a plugin's table, ...); the size comes from
  ``cpu_bytes_to_use`` and the sharing from vLLM's parallel config; an
  unknown key is a :class:`hostpool.ConfigError` naming it, raised when vLLM
  builds the spec;
* the workers of one engine share one pool through hostpool's socket
  rendezvous named after ``engine_id``: nothing is ever in ``/dev/shm``, a
  worker that dies mid-setup is named by the others, and the kernel frees the
  memory with the last worker;
* hostpool pins the pool (``pin``), and vLLM's own ``pin_mmap_region`` is
  kept from registering it a second time;
* with a ``lease`` table naming a ``keeper`` (a pool kept by ``hostpool keep``) and that keeper's
  ``content = "keep"``, the CPU tier survives the engine: the manager
  (:class:`~hostpool._vllm_kept.HostPoolOffloadingManager`, vLLM's own,
  subclassed) records which chunk holds which block in an index at the kept
  pool's tail, and a restarted engine serves prefix hits from it at once.
  The kept pool must hold the region and the index:
  ``cpu_bytes_to_use`` rounded to chunks, plus
  ``hostpool.index_bytes(num_chunks, page_size)``
  (:meth:`HostPoolOffloadingSpec.kept_pool_bytes`). Without a keeper, or
  with ``content = "zero"``, the spec behaves as vLLM's.

Importing this module imports vLLM and torch, and patches nothing: vLLM's
worker is guarded against pinning hostpool's region a second time, and
hostpool's log records go to vLLM's handlers, from when vLLM builds the spec
(:data:`hostpool._vllm_region.ADAPTER`). vLLM's names that are not public are
reached only through :mod:`hostpool._engines.vllm`, which checks them all
when vLLM builds the spec: a vLLM without one raises
:class:`hostpool.EngineVersionError` there, naming them, the version found
and the versions hostpool was tested with.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import hostpool
from hostpool._engines import vllm as _names
from hostpool._vllm_region import ADAPTER, HostPoolRegion, pool_name

from vllm.v1.kv_offload.base import OffloadingManager, OffloadingSpec

try:
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec as _Base
except ImportError:  # checked where the spec is built: EngineVersionError names it
    _Base = OffloadingSpec  # type: ignore[misc,assignment]

__all__ = ["HostPoolOffloadingSpec", "HostPoolRegion", "EXTRA_CONFIG_KEY", "pool_config_from"]

_log = logging.getLogger("hostpool.vllm")

EXTRA_CONFIG_KEY = "hostpool"
"""The table of ``kv_connector_extra_config`` that holds the pool config."""

# What vLLM decides in a sharing table, not the pool config.
_SHARING_FROM_VLLM = ("name", "world", "rank")


def pool_config_from(
    extra_config: Mapping[str, Any],
    size: int | None = None,
    *,
    size_from: str = "kv_connector_extra_config's cpu_bytes_to_use",
) -> dict[str, Any]:
    """The pool config in ``extra_config["hostpool"]``, checked (an empty one when absent).

    ``size`` is the region's size when known (it checks ``block_size``
    against it); the config is planned, not built. ``size_from`` names,
    in the error for a ``size`` in the table, where the size comes from.

    Raises :class:`hostpool.ConfigError` for a table that is not one, a key
    vLLM decides (``size``, ``sharing.name``/``world``/``rank``), or anything
    :func:`hostpool.check_config` refuses (an unknown key, a bad value).
    """
    table = extra_config.get(EXTRA_CONFIG_KEY, {})
    if table is None:
        table = {}
    if not isinstance(table, Mapping):
        raise hostpool.ConfigError(
            f"kv_connector_extra_config's `{EXTRA_CONFIG_KEY}` must be a table of pool "
            f"config keys such as {{\"dir\": \"/dev/hugepages\"}}, not {table!r}"
        )
    config = dict(table)
    if "size" in config:
        raise hostpool.ConfigError(
            f"kv_connector_extra_config.{EXTRA_CONFIG_KEY} has `size`: the size comes from "
            f"{size_from}; remove it"
        )
    sharing = config.get("sharing")
    if sharing is not None:
        if not isinstance(sharing, Mapping):
            raise hostpool.ConfigError(
                f"kv_connector_extra_config.{EXTRA_CONFIG_KEY}.sharing must be a table "
                f"(attach_timeout_secs, barrier_timeout_secs, rendezvous), not {sharing!r}"
            )
        for key in _SHARING_FROM_VLLM:
            if key in sharing:
                raise hostpool.ConfigError(
                    f"kv_connector_extra_config.{EXTRA_CONFIG_KEY}.sharing has `{key}`: vLLM "
                    "sets the name from engine_id and the world and rank from its parallel "
                    "config; remove it"
                )
    # The whole table as a pool would read it (a placeholder sharing, since
    # vLLM fills that in per worker), so a typo fails where vLLM reads its
    # config rather than on a worker minutes later.
    probe = dict(config)
    if size:
        probe["size"] = size
    if sharing is not None:
        probe["sharing"] = {"name": "check", "world": 1, "rank": 0, **sharing}
    try:
        hostpool.check_config(probe)
    except hostpool.ConfigError as e:
        raise hostpool.ConfigError(f"kv_connector_extra_config.{EXTRA_CONFIG_KEY}: {e}") from e
    return config


class HostPoolOffloadingSpec(_Base):  # type: ignore[misc,valid-type]
    """vLLM's ``CPUOffloadingSpec`` with its region in a hostpool pool.

    Sizing (``cpu_bytes_to_use``), the manager and the worker are vLLM's; only
    the worker's region is a :class:`~hostpool.torch.HostPoolRegion` built
    from the ``hostpool`` table, shared by the engine's ``world_size``
    workers (rank ``config.parallel.rank``) when there is more than one.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> HostPoolOffloadingSpec:
        """Checks first that this vLLM has every name the adapter needs
        (:class:`hostpool.EngineVersionError` otherwise, naming them)."""
        _names.check()
        return super().__new__(cls)

    def __init__(self, config: Any) -> None:
        """vLLM's spec, plus the ``hostpool`` table checked at once."""
        super().__init__(config)
        ADAPTER.install()
        self.pool_config: dict[str, Any] = pool_config_from(
            self.extra_config, self.num_chunks * self.kv_bytes_per_chunk
        )
        """The ``hostpool`` table, as given (checked)."""
        self.vllm_config: Any = _engine_vllm_config()
        """The engine's ``VllmConfig`` when vLLM built this spec from one (its
        connector's), else ``None``: the kept tier's fingerprint reads the
        model's revision and dtype and the prefix-cache hash from it."""
        self.keeper_status: dict[str, Any] | None = self._fit_the_keeper()
        """The keeper's status when the ``lease`` table names one that answered
        (``hostpool.keeper_status``), else ``None``."""

    def _keeper(self) -> str | None:
        table = self.pool_config.get("lease")
        return table.get("keeper") if isinstance(table, Mapping) else None

    def _fit_the_keeper(self) -> dict[str, Any] | None:
        """Ask the keeper how large its pool is, and when vLLM's chunks
        (``cpu_bytes_to_use``) and their index do not fit in it, use as many
        chunks as do: a keeper of exactly ``cpu_bytes_to_use`` holds the tier
        and its index. The scheduler and every worker, of every engine on the
        keeper, work out the same number from the same status."""
        keeper = self._keeper()
        if keeper is None or self.num_chunks <= 0:
            return None
        try:
            status = hostpool.keeper_status(keeper)
        except hostpool.Error as e:
            # The workers' lease says what is wrong (or falls back, as the
            # table asks): sized as vLLM sizes it meanwhile.
            _log.info("kept pool `%s` did not answer its status (%s): the CPU tier is sized by cpu_bytes_to_use", keeper, e)
            return None
        from hostpool._vllm_tier import chunks_that_fit

        fit = chunks_that_fit(int(status["size"]), self.kv_bytes_per_chunk, int(status["page_size"]), self.num_chunks)
        if fit < self.num_chunks:
            _log.info(
                "CPU offload tier in kept pool `%s` of %d bytes: %d chunks of %d bytes and their index "
                "(%d bytes) fit in it, of the %d cpu_bytes_to_use asks for",
                keeper,
                status["size"],
                fit,
                self.kv_bytes_per_chunk,
                hostpool.index_bytes(max(fit, 1), int(status["page_size"])),
                self.num_chunks,
            )
            self.num_chunks = fit
            from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo

            self.cpu_info = CPUOffloadingInfo.from_config(self.config, fit, self.kv_bytes_per_chunk)
        return status

    def shared_tier(self) -> bool:
        """Whether this engine's CPU tier is the one its keeper shares between
        engines: a keeper of ``--tenants`` 2 or more."""
        return int((self.keeper_status or {}).get("max_tenants") or 1) > 1

    def kept_pool_bytes(self, page_size: int) -> int:
        """The bytes a kept pool of ``page_size``-byte pages needs for this engine's
        region and its index (what to give ``hostpool keep --size``)."""
        region = self.num_chunks * self.kv_bytes_per_chunk
        return region + hostpool.index_bytes(max(self.num_chunks, 1), page_size)

    def get_manager(self) -> OffloadingManager:
        """vLLM's manager; with a keeper that keeps content, one whose block map is kept."""
        if self._manager is None and self.shared_tier():
            from hostpool._vllm_tier import SharedTierManager

            self._manager = SharedTierManager(
                tier=self._shared_tier(),
                enable_events=self.kv_events_config.enable_kv_cache_events,
                info=self.cpu_info,
            )
        if self._manager is None:
            kept = self._kept_tier()
            if kept is None:
                return super().get_manager()
            from hostpool._vllm_kept import HostPoolOffloadingManager

            self._manager = HostPoolOffloadingManager(
                kept=kept,
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(self.extra_config.get("store_threshold", 0)),
                max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)),
                info=self.cpu_info,
            )
        return self._manager

    def _companion(self, keeper: str) -> hostpool.Pool:
        """The kept pool mapped beside this engine's workers' lease (as their companion)."""
        table = self.pool_config["lease"]
        lease: dict[str, Any] = {"keeper": keeper, "companion_of": pool_name(self.config.engine_id)}
        if "attach_timeout_secs" in table:
            lease["attach_timeout_secs"] = table["attach_timeout_secs"]
        return hostpool.Pool.from_config({"lease": lease})

    def _shared_tier(self) -> Any:
        """The keeper's tier, shared with the other engines of the node: raises
        when it cannot be (the keeper refused this engine's identity, say)."""
        from hostpool._vllm_tier import SharedTier, identity

        keeper = self._keeper()
        assert keeper is not None
        fingerprint = identity(self, self.vllm_config)
        pool = self._companion(keeper)
        try:
            return SharedTier(pool, self.num_chunks, self.kv_bytes_per_chunk, fingerprint)
        except BaseException:
            pool.close()
            raise

    def _kept_tier(self) -> Any:
        """The kept pool as this scheduler maps it, beside the lease its workers hold,
        or ``None`` (logged) when the tier is not kept: no keeper, ``content = "zero"``,
        no room for the index, or no lease of this engine to accompany."""
        keeper = self._keeper()
        if keeper is None or self.num_chunks <= 0:
            return None
        from hostpool._vllm_kept import KeptTier, identity

        try:
            pool = self._companion(keeper)
        except hostpool.Error as e:
            _log.warning(
                "CPU offload tier starts cold and is not kept across restarts: the scheduler "
                "could not map kept pool `%s` beside its workers: %s",
                keeper,
                e,
            )
            return None
        lease = pool.report.get("keeper") or {}
        if lease.get("content") != "keep":
            pool.close()
            _log.info(
                "kept pool `%s` has content = %r: the CPU offload tier starts empty on each "
                "lease (content = \"keep\" keeps it across restarts)",
                keeper,
                lease.get("content"),
            )
            return None
        need = self.kept_pool_bytes(pool.page_size)
        if pool.nbytes < need:
            have = pool.nbytes
            pool.close()
            _log.warning(
                "CPU offload tier starts cold and is not kept: kept pool `%s` is %d bytes, and the "
                "region (%d bytes) with its index needs %d; start the keeper with --size %d",
                keeper,
                have,
                self.num_chunks * self.kv_bytes_per_chunk,
                need,
                need,
            )
            return None
        vllm_config = self.vllm_config
        return KeptTier(
            pool,
            self.num_chunks,
            self.kv_bytes_per_chunk,
            lambda: identity(self, vllm_config),
        )

    def region_pool_config(self) -> dict[str, Any]:
        """The pool config of this worker's region: the table plus the sharing vLLM decides."""
        config = dict(self.pool_config)
        world = self.config.parallel.world_size
        # A lease names its engine even for one worker: the scheduler maps it
        # as that engine's companion.
        if world > 1 or "lease" in config:
            config["sharing"] = {
                **config.get("sharing", {}),
                "name": pool_name(self.config.engine_id),
                "world": world,
                "rank": self.config.parallel.rank,
            }
        else:
            config.pop("sharing", None)
        return config

    def create_worker(self, kv_caches: Any) -> Any:
        """vLLM's worker over a :class:`~hostpool.torch.HostPoolRegion`."""
        if not (self._uses_shared_region() and self.num_chunks > 0):
            return super().create_worker(kv_caches)
        world_size = self.config.parallel.world_size
        worker_index = self.config.parallel.rank
        region = HostPoolRegion(
            engine_id=self.config.engine_id,
            num_chunks=self.num_chunks,
            rank=0 if self.replicated_layout else worker_index,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
            # hostpool's rendezvous is the workers' barrier: vLLM's is not needed.
            num_segments=_names.region_segments(),
            populate_shard=(worker_index, world_size) if self.replicated_layout else None,
            pool_config=self.region_pool_config(),
        )
        pool = region.pool  # set: the region was just built
        _log.info(
            "CPU offload region of %d bytes on hostpool (%s, %d-byte pages, pinned: %s)",
            region.total_size_bytes,
            pool.backing,
            pool.page_size,
            region.is_pinned,
        )
        try:
            from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker

            return CPUOffloadingWorker(
                kv_caches=kv_caches,
                blocks_per_chunk=self.blocks_per_chunk,
                num_cpu_chunks=self.num_chunks,
                mmap_region=region,
            )
        except Exception:
            region.cleanup()
            raise


def _engine_vllm_config() -> Any:
    """The ``VllmConfig`` vLLM is building this spec from: the current one, or the
    ``vllm_config`` of the connector that called the spec's factory."""
    from vllm.config import VllmConfig

    try:
        from vllm.config import get_current_vllm_config_or_none

        current = get_current_vllm_config_or_none()
    except ImportError:  # pragma: no cover - other vLLM versions
        current = None
    if isinstance(current, VllmConfig):
        return current
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            break
        candidate = frame.f_locals.get("vllm_config")
        if isinstance(candidate, VllmConfig):
            return candidate
        frame = frame.f_back
    return None

