"""vLLM HiSparse's host pool from hostpool, turned on from HiSparse's own config.

vLLM's HiSparse connector keeps sparse-MLA KV in a host pool of hundreds of
GiB (``host_pool_gib``). As released (vLLM 0.33, 0.34) ``HiSparseHostPool``
makes it with ``torch.empty`` on 4 KiB pages and ``cudaHostRegister``
(TP 1), or, for the TP ranks of one node, with vLLM's ``SharedOffloadRegion``
of ``/dev/shm`` files, every rank registering the whole of it; and it refuses
a pool that ``psutil``'s MemAvailable cannot hold, which reserved huge pages
never count toward. With a ``hostpool`` table beside ``host_pool_gib``::

    --kv-transfer-config '{"kv_connector": "HiSparseConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"host_pool_gib": 480,
            "hostpool": {"dir": "/dev/hugepages-1Gi", "numa_node": "gpu"}}}'

the pool is a hostpool pool built from the table (any key of a pool config:
``dir``, ``backing``, ``page_size``, ``numa_node``, ``threads``,
``prefault``, ``pin``, ``register``, a plugin's table, ...):

* the size is HiSparse's (from ``host_pool_gib``); a ``size`` in the table
  is refused, as are ``lease`` and a ``sharing`` ``name``/``world``/``rank``
  (vLLM decides them);
* TP 1 (HiSparse's private pool): one private pool, of the exact size
  HiSparse asks for, its registered range rounded to 4 KiB as HiSparse's;
* the local TP ranks (HiSparse's shared pool): one hostpool shared pool
  through the socket rendezvous, named after the engine's instance and DP
  index: nothing in any directory, each rank prefaults its shard (rounded to
  the huge page), a rank that dies mid-setup is named by the others;
* hostpool pins the pool (``pin``, default ``{kind = "cuda", required =
  true}``) in chunks that never split one of HiSparse's host blocks, as
  HiSparse's own registration ranges do not; HiSparse pins nothing of it.
  In a shared pool every rank registers the whole pool in its own process,
  since HiSparse's kernels on each rank's GPU read any row of it (a
  registration serves only the process that made it); so ``pin.scope =
  "shard"`` is refused;
* HiSparse's MemAvailable check gives way to hostpool's capacity checks
  (free huge pages from sysfs, cgroup limits, the memlock bound), whose
  errors name the remedy, at allocation: never a SIGBUS later;
* teardown is HiSparse's own ``release_pinned_state`` and
  ``drop_hisparse_host_pool``: the pool is unpinned and unmapped, and its
  huge pages go back, once the last view of it goes.

Without the table HiSparse is exactly as released: the only hook in place
(``HiSparseHostPool.allocate``) calls vLLM's own. The wheel's
``vllm.general_plugins`` entry point installs it in every vLLM process
(:func:`install` does it by hand); HiSparse's names that are not public are
reached only through :mod:`hostpool._engines.vllm`.
"""

from __future__ import annotations

import importlib
import logging
import math
import mmap
import sys
from collections.abc import Mapping
from typing import Any

import hostpool
from hostpool._adapter import Adapter
from hostpool._engines import vllm as _names

__all__ = ["HisparseAdapter", "ADAPTER", "EXTRA_CONFIG_KEY", "install", "installed", "table_of", "pool_config_of"]

_log = logging.getLogger("hostpool.hisparse")

EXTRA_CONFIG_KEY = "hostpool"
"""The table of the HiSparseConnector's ``kv_connector_extra_config`` that holds the pool config."""

_CONNECTOR = "HiSparseConnector"
_DEFAULT_PIN = {"kind": "cuda", "required": True}


def _connector_extra(vllm_config: Any) -> Mapping[str, Any] | None:
    """The HiSparseConnector's ``kv_connector_extra_config`` (alone, or inside a
    MultiConnector, as vLLM finds ``host_pool_gib``), or ``None``."""
    kv = getattr(vllm_config, "kv_transfer_config", None)
    if kv is None:
        return None
    extra = kv.kv_connector_extra_config or {}
    if kv.kv_connector == "MultiConnector":
        connectors = extra.get("connectors", [])
    else:
        connectors = [{"kv_connector": kv.kv_connector, "kv_connector_extra_config": extra}]
    for connector in connectors:
        if isinstance(connector, Mapping) and connector.get("kv_connector") == _CONNECTOR:
            return connector.get("kv_connector_extra_config") or {}
    return None


def table_of(vllm_config: Any) -> Mapping[str, Any] | None:
    """The ``hostpool`` table of the engine's HiSparseConnector, or ``None`` (HiSparse as released)."""
    extra = _connector_extra(vllm_config)
    if extra is None or extra.get(EXTRA_CONFIG_KEY) is None:
        return None
    return extra


def pool_config_of(vllm_config: Any) -> dict[str, Any] | None:
    """The pool config of the table, checked; ``None`` without one.

    Raises :class:`hostpool.ConfigError` naming the key for a table that is not
    one, a ``size`` (the size is ``host_pool_gib``'s), a ``lease``, a sharing
    ``name``/``world``/``rank``, a pin HiSparse cannot use, or anything
    :func:`hostpool.check_config` refuses.
    """
    extra = table_of(vllm_config)
    if extra is None:
        return None
    from hostpool.vllm import pool_config_from

    config = pool_config_from(extra, size_from="the HiSparseConnector's host_pool_gib")
    where = f"kv_connector_extra_config.{EXTRA_CONFIG_KEY}"
    if "lease" in config:
        raise hostpool.ConfigError(
            f"{where} has `lease`: HiSparse's host pool is the engine's own and is not "
            "leased from a keeper; remove it"
        )
    pin = config.get("pin", dict(_DEFAULT_PIN))
    if isinstance(pin, str):
        pin = {"kind": pin}
    if not isinstance(pin, Mapping):
        raise hostpool.ConfigError(f"{where}.pin must be a table such as {{kind = \"cuda\"}}, not {pin!r}")
    pin = dict(pin)
    if pin.get("kind", "cuda") != "cuda":
        raise hostpool.ConfigError(
            f"{where}.pin.kind = {pin.get('kind')!r}: HiSparse's kernels read the host pool from the "
            "GPU, so it must be registered with CUDA: use pin.kind = \"cuda\" (or leave pin out)"
        )
    if pin.get("scope", "pool") != "pool":
        raise hostpool.ConfigError(
            f"{where}.pin.scope = {pin.get('scope')!r}: every TP rank's GPU reads the whole shared "
            "pool, and a registration serves only the process that made it, so each rank pins "
            "the whole pool; remove pin.scope"
        )
    pin.setdefault("kind", "cuda")
    config["pin"] = pin
    return config


def _host_tensor_sizes(kv_cache_config: Any) -> list[int]:
    """The host-resident layers' sizes in address order, as HiSparse computes them."""
    return [
        size
        for _, size in sorted(
            (tensor.offset + i * tensor.layer_stride, tensor.layer_stride)
            for tensor in kv_cache_config.kv_cache_tensors
            if tensor.host_resident
            for i in range(len(tensor.layers))
        )
    ]


def _pin_block(tensor_sizes: list[int], num_blocks: int | None) -> int | None:
    """The ``block_size`` whose multiples are host block boundaries of every layer
    (so no pinned chunk splits one of HiSparse's blocks), or ``None`` (none known)."""
    if not num_blocks or not tensor_sizes or any(s % num_blocks for s in tensor_sizes):
        return None
    blocks = [s // num_blocks for s in tensor_sizes]
    start = 0
    for size, block in zip(tensor_sizes, blocks):
        if start % block:
            return None
        start += size
    return math.lcm(*blocks)


def _with_block(config: dict[str, Any], block: int | None, total: int) -> dict[str, Any]:
    """``config`` with ``block_size`` = ``block`` where a registration unit of it
    (``lcm(block, page size)``) fits the pool; else the whole pool, rounded to its
    pages, is one unit (one registration, as HiSparse's private pool is)."""
    if "block_size" in config:
        return config
    page = hostpool.plan({**{k: v for k, v in config.items() if k != "sharing"}, "size": total})["page_size"]
    if block is None or math.lcm(block, page) > _round_up(total, page):
        block = _round_up(total, page)
    return {**config, "block_size": block}


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class HisparseAdapter(Adapter):
    """hostpool's hooks into vLLM's HiSparse: ``HiSparseHostPool.allocate`` (always:
    HiSparse's own without the table) and, once a table is used,
    ``release_pinned_state`` where HiSparse calls it (hostpool unpins its pools)."""

    engine = "vllm"
    log_target = "vllm"
    names = _names.HISPARSE

    def __init__(self) -> None:
        super().__init__()
        self._regions: dict[int, Any] = {}
        """Private pools' regions by pool address (a shared pool's is HiSparse's ``shared_region``)."""

    def hooks(self) -> None:
        runtime = importlib.import_module(_names.HISPARSE_MODULES[0])
        self.patch(runtime.HiSparseHostPool, "allocate", _allocate)

    def hook_teardown(self) -> None:
        """Put ``release_pinned_state`` in place in every HiSparse module that calls it."""
        with self._lock:
            runtime = importlib.import_module(_names.HISPARSE_MODULES[0])
            theirs = self.theirs(runtime, "release_pinned_state")
            for name in _names.HISPARSE_MODULES:
                module = importlib.import_module(name)
                if vars(module).get("release_pinned_state") is theirs:
                    self.patch(module, "release_pinned_state", _release_pinned_state)

    def keep(self, region: Any) -> None:
        with self._lock:
            self._regions[region.pool.addr] = region
        self.track(region.pool)

    def region_of(self, tensor: Any) -> Any:
        """The private region hostpool made that holds ``tensor``'s bytes, or ``None``."""
        try:
            ptr, nbytes = tensor.data_ptr(), tensor.nbytes
        except (AttributeError, RuntimeError):
            return None
        pool = self.pool_of(ptr, max(nbytes, 1))
        if pool is None:
            return None
        with self._lock:
            return self._regions.get(pool.addr)

    def forget(self, region: Any) -> None:
        with self._lock:
            for addr, r in list(self._regions.items()):
                if r is region:
                    del self._regions[addr]


ADAPTER = HisparseAdapter()
"""The process's HiSparse adapter."""


def installed() -> bool:
    """Whether HiSparse's hook is in place in this process."""
    return ADAPTER.installed


def install() -> None:
    """Put HiSparse's hook in place (idempotent): HiSparse pools whose connector has a
    ``hostpool`` table are hostpool pools from then on. Raises
    :class:`hostpool.EngineVersionError` (nothing patched) when this vLLM lacks a
    name the hook needs, ``ImportError`` without vLLM's HiSparse."""
    ADAPTER.install()


def _theirs_allocate() -> Any:
    runtime = sys.modules[_names.HISPARSE_MODULES[0]]
    return ADAPTER.theirs(runtime.HiSparseHostPool, "allocate")


def _allocate(self: Any, size: int) -> Any:
    """``HiSparseHostPool.allocate``: with the connector's ``hostpool`` table, the pool
    is hostpool's; without it, vLLM's own."""
    if self.backing is not None:  # allocated already: HiSparse's own check of the size
        return _theirs_allocate()(self, size)
    config = pool_config_of(self.vllm_config)
    if config is None:
        return _theirs_allocate()(self, size)
    from hostpool._vllm_region import HostPoolRegion

    ADAPTER.hook_teardown()
    kv = self.kv_cache_config
    sizes = _host_tensor_sizes(kv)
    block = _pin_block(sizes, kv.hisparse_host_num_blocks)
    if kv.hisparse_shared_host_pool:
        from vllm.distributed import get_tp_group

        tp = get_tp_group()
        num_blocks, stride = kv.hisparse_host_num_blocks, kv.hisparse_host_block_stride
        total = num_blocks * stride
        config["sharing"] = dict(config.get("sharing") or {})
        region = HostPoolRegion(
            engine_id=f"hisparse_{self.vllm_config.instance_id}_dp{self.vllm_config.parallel_config.data_parallel_index}",
            num_chunks=1,
            rank=0,
            kv_bytes_per_chunk=total,
            cpu_page_size=sum(sizes),
            populate_shard=(tp.rank_in_group, tp.world_size),
            pool_config=_with_block(config, block, total),
        )
        self.shared_region = region
        self.registered = region.base_tensor
        self.backing = self.registered[:size]
        if _names.hisparse_keeps_pinned():
            self.pinned = []  # hostpool pinned it: HiSparse unpins nothing
    else:
        config.pop("sharing", None)
        total = _round_up(size, mmap.PAGESIZE)
        region = HostPoolRegion(
            engine_id=f"hisparse_{self.vllm_config.instance_id}",
            num_chunks=1,
            rank=None,
            kv_bytes_per_chunk=total,
            cpu_page_size=total,
            pool_config=_with_block(config, block, total),
        )
        ADAPTER.keep(region)
        self.registered = region.base_tensor
        self.backing = self.registered[:size]
        if _names.hisparse_keeps_pinned():
            self.pinned = [self.registered]  # release_pinned_state hands it back to hostpool
    pool = region.pool
    try:
        pool.wait_pinned()  # a background pin: HiSparse binds the pool at once
    except BaseException:
        if region is not self.shared_region:
            ADAPTER.forget(region)
        self.backing = self.registered = self.shared_region = None
        region.cleanup()
        raise
    _log.info(
        "HiSparse host pool of %d bytes on hostpool (%s, %d-byte pages, %s, pinned: %s)",
        size,
        pool.backing,
        pool.page_size,
        "shared" if kv.hisparse_shared_host_pool else "private",
        pool.pinned,
    )
    return self.backing


def _release_pinned_state(*args: Any, **kwargs: Any) -> Any:
    """HiSparse's ``release_pinned_state``, except for hostpool's pools: hostpool
    unpins and frees those (after the device is synchronized); the rest is HiSparse's."""
    import inspect

    runtime = sys.modules[_names.HISPARSE_MODULES[0]]
    theirs = ADAPTER.theirs(runtime, "release_pinned_state")
    bound = inspect.signature(theirs).bind(*args, **kwargs)
    pinned = bound.arguments.get("pinned_host_pools") or []
    ours = []
    for tensor in list(pinned):
        region = ADAPTER.region_of(tensor)
        if region is not None:
            # Identity, not ==: tensors compare elementwise.
            del pinned[next(i for i, t in enumerate(pinned) if t is tensor)]
            if all(r is not region for r in ours):
                ours.append(region)
    result = theirs(*args, **kwargs)
    if ours:
        import torch

        if torch.accelerator.is_available():
            try:
                torch.accelerator.synchronize()
            except RuntimeError as e:
                _log.warning(
                    "HiSparse: device context unusable at teardown (%s); hostpool's host pool "
                    "stays pinned until the process exits",
                    e,
                )
                return result
        for region in ours:
            ADAPTER.forget(region)
            region.cleanup()
    return result


def _vllm_general_plugin() -> None:
    """The ``vllm.general_plugins`` entry point's HiSparse half: :func:`install` where
    this vLLM has HiSparse. Never raises (vLLM does not catch a plugin's error)."""
    if not _names.hisparse_available():
        _log.debug("this vLLM has no HiSparse: nothing to install")
        return
    try:
        install()
    except hostpool.EngineVersionError as e:
        _log.warning(
            "hostpool cannot hook this vLLM's HiSparse: a `hostpool` table in the "
            "HiSparseConnector's config would be ignored: %s",
            e,
        )
    except Exception:  # never raise into vLLM
        _log.warning("hostpool.hisparse.install() failed", exc_info=True)
