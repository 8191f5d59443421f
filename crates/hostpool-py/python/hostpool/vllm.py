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
  kept from registering it a second time.

Importing this module imports vLLM and torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import hostpool
from hostpool._vllm_region import HostPoolRegion, install_pin_guard, pool_name

from vllm.v1.kv_offload.cpu import gpu_worker as _gpu_worker
from vllm.v1.kv_offload.cpu import spec as _cpu_spec
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

__all__ = ["HostPoolOffloadingSpec", "HostPoolRegion", "EXTRA_CONFIG_KEY", "pool_config_from"]

_log = logging.getLogger("hostpool.vllm")

EXTRA_CONFIG_KEY = "hostpool"
"""The table of ``kv_connector_extra_config`` that holds the pool config."""

# What vLLM decides in a sharing table, not the pool config.
_SHARING_FROM_VLLM = ("name", "world", "rank")


def pool_config_from(extra_config: Mapping[str, Any], size: int | None = None) -> dict[str, Any]:
    """The pool config in ``extra_config["hostpool"]``, checked (an empty one when absent).

    ``size`` is the region's size when known (it checks ``block_size``
    against it); the config is planned, not built.

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
            "kv_connector_extra_config's cpu_bytes_to_use; remove it"
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


class HostPoolOffloadingSpec(CPUOffloadingSpec):
    """vLLM's ``CPUOffloadingSpec`` with its region in a hostpool pool.

    Sizing (``cpu_bytes_to_use``), the manager and the worker are vLLM's; only
    the worker's region is a :class:`~hostpool.torch.HostPoolRegion` built
    from the ``hostpool`` table, shared by the engine's ``world_size``
    workers (rank ``config.parallel.rank``) when there is more than one.
    """

    def __init__(self, config: Any) -> None:
        """vLLM's spec, plus the ``hostpool`` table checked at once."""
        super().__init__(config)
        self.pool_config: dict[str, Any] = pool_config_from(
            self.extra_config, self.num_chunks * self.kv_bytes_per_chunk
        )
        """The ``hostpool`` table, as given (checked)."""

    def region_pool_config(self) -> dict[str, Any]:
        """The pool config of this worker's region: the table plus the sharing vLLM decides."""
        config = dict(self.pool_config)
        world = self.config.parallel.world_size
        if world > 1:
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
            barrier=_cpu_spec._all_workers_barrier,
            num_segments=_cpu_spec._REGION_SEGMENTS,
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
            return _gpu_worker.CPUOffloadingWorker(
                kv_caches=kv_caches,
                blocks_per_chunk=self.blocks_per_chunk,
                num_cpu_chunks=self.num_chunks,
                mmap_region=region,
            )
        except Exception:
            region.cleanup()
            raise


# vLLM's worker module is imported above: guard its pin_mmap_region now.
install_pin_guard()
