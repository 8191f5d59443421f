"""vLLM's names that hostpool's vLLM adapter reaches, and the check that they are there.

vLLM's public door for a CPU tier is its offloading spec
(``kv_connector_extra_config.spec_module_path``): hostpool's spec subclasses
vLLM's own ``CPUOffloadingSpec``, lays its worker's region over a hostpool
pool, and (for a kept tier) subclasses its ``CPUOffloadingManager`` and wraps
its cache policy. Those classes, and some of their private members, change
from release to release: 0.34 moved ``_REGION_SEGMENTS`` into
``shared_offload_region.REGION_SEGMENTS`` and removed
``OffloadingManager.touch`` and ``CachePolicy.touch`` (recency comes from
``on_request_finished``). Every such name is written here, once, with where
each release keeps it; :func:`check` runs where vLLM builds hostpool's spec
and raises one :class:`hostpool.EngineVersionError` naming the version found
and every name missing, never an ``AttributeError`` in a worker later.

HiSparse's host pool (:mod:`hostpool.hisparse`) has its own list,
:data:`HISPARSE_REQUIRED`, checked where its hook installs; 0.34 added the
pool's ``pinned`` list and dropped the runtimes from ``release_pinned_state``.
"""

from __future__ import annotations

import importlib
from typing import Any

from hostpool import _engines

__all__ = [
    "ENGINE",
    "REQUIRED",
    "check",
    "missing",
    "region_segments",
    "has_touch",
    "none_hash",
    "version",
    "HISPARSE_REQUIRED",
    "HISPARSE",
    "hisparse_available",
    "hisparse_keeps_pinned",
    "hisparse_registration_ranges",
]

ENGINE = "vllm"

_SPEC = "vllm.v1.kv_offload.cpu.spec"
_REGION = "vllm.v1.kv_offload.cpu.shared_offload_region"
_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"
_MANAGER = "vllm.v1.kv_offload.cpu.manager"
_POLICIES = "vllm.v1.kv_offload.cpu.policies.base"
_BASE = "vllm.v1.kv_offload.base"
_COMMON = "vllm.v1.kv_offload.cpu.common"
_UTILS = "vllm.v1.core.kv_cache_utils"

# Members of an instance that its class's __init__ (or a base's) assigns.
_SPEC_ATTRS = (
    "num_chunks",
    "kv_bytes_per_chunk",
    "cpu_page_size_per_worker",
    "replicated_layout",
    "blocks_per_chunk",
    "extra_config",
    "eviction_policy",
    "cache_policy_module_path",
    "kv_events_config",
    "cpu_info",
    "config",
    "_manager",
)
_MANAGER_ATTRS = ("_policy", "_num_evictable_cache_chunks", "_num_allocated_chunks", "_num_chunks", "_free_list")

REQUIRED: tuple[str, ...] = (
    f"{_SPEC}.CPUOffloadingSpec",
    *(f"{_SPEC}.CPUOffloadingSpec.{a}" for a in _SPEC_ATTRS),
    f"{_SPEC}.CPUOffloadingSpec._uses_shared_region",
    f"{_SPEC}.CPUOffloadingSpec.create_worker",
    f"{_SPEC}.CPUOffloadingSpec.get_manager",
    f"{_WORKER}.CPUOffloadingWorker",
    f"{_WORKER}.pin_mmap_region",
    f"{_MANAGER}.CPUOffloadingManager",
    *(
        f"{_MANAGER}.CPUOffloadingManager.{m}"
        for m in (
            "_allocate_chunks",
            "_free_chunk",
            "_get_num_free_chunks",
            "complete_store",
            "prepare_load",
            "get_stats",
            "reset_cache",
            "on_request_finished",
        )
    ),
    *(f"{_MANAGER}.CPUOffloadingManager.{a}" for a in _MANAGER_ATTRS),
    f"{_POLICIES}.CachePolicy",
    f"{_POLICIES}.CachePolicy.on_request_finished",
    f"{_POLICIES}.ChunkStatus",
    f"{_BASE}.OffloadKey",
    f"{_BASE}.ReqContext",
    f"{_BASE}.OffloadingManager",
    f"{_BASE}.OffloadingManager.on_schedule_end",
    f"{_BASE}.OffloadingSpec",
    # The manager of a tier shared by the engines of a node (hostpool._vllm_tier).
    f"{_BASE}.LookupResult",
    f"{_BASE}.Medium",
    f"{_BASE}.OffloadingEvent",
    f"{_BASE}.PrepareStoreOutput",
    f"{_BASE}.RequestOffloadingContext",
    f"{_COMMON}.CPULoadStoreSpec",
    f"{_COMMON}.CPUOffloadingInfo.from_config",
    "vllm.v1.metrics.cache_hit_source.CacheHitSource",
)
"""Every name the adapter needs, whatever the release."""

_SEGMENTS = (f"{_REGION}.REGION_SEGMENTS", f"{_SPEC}._REGION_SEGMENTS")
"""Where a release keeps the count of a region's segments (0.34, 0.33): one of them."""


# HiSparse's host pool (hostpool.hisparse). 0.33 and 0.34 keep it in the same
# places; 0.34 added the pool's list of pinned ranges (``pinned``), dropped the
# runtimes from ``release_pinned_state``'s arguments, and moved the registration
# ranges to ``vllm.utils.host_memory.host_registration_ranges``.
_HS_RUNTIME = "vllm.v1.hisparse.runtime"
_HS_BINDING = "vllm.v1.hisparse.binding"
_HS_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.hisparse.worker"
HISPARSE_MODULES = (_HS_RUNTIME, _HS_BINDING, _HS_WORKER)
"""The modules that call ``release_pinned_state`` (each imported it by name)."""

HISPARSE_REQUIRED: tuple[str, ...] = (
    f"{_HS_RUNTIME}.HiSparseHostPool",
    f"{_HS_RUNTIME}.HiSparseHostPool.allocate",
    *(
        f"{_HS_RUNTIME}.HiSparseHostPool.{a}"
        for a in ("vllm_config", "kv_cache_config", "backing", "registered", "shared_region")
    ),
    *(f"{m}.release_pinned_state" for m in HISPARSE_MODULES),
)
"""Every name hostpool's HiSparse adapter needs, whatever the release."""

_HS_RANGES = (
    "vllm.utils.host_memory.host_registration_ranges",  # 0.34: (sizes, blocks, total)
    f"{_HS_RUNTIME}._hisparse_registration_ranges",  # 0.33: (sizes, blocks, stride)
)


def hisparse_available() -> bool:
    """Whether this vLLM has HiSparse at all (its runtime module)."""
    import importlib.util

    try:
        return importlib.util.find_spec(_HS_RUNTIME) is not None
    except ImportError:
        return False


def hisparse_missing() -> list[str]:
    """The names of :data:`HISPARSE_REQUIRED` the installed vLLM lacks."""
    return _engines.absent(HISPARSE_REQUIRED)


def check_hisparse() -> None:
    """Raise :class:`hostpool.EngineVersionError` naming every name of
    :data:`HISPARSE_REQUIRED` the installed vLLM lacks."""
    _engines.require(ENGINE, version(), hisparse_missing())


class _Hisparse:
    """What :class:`hostpool._adapter.Adapter` checks before HiSparse's hooks go in."""

    check = staticmethod(check_hisparse)


HISPARSE = _Hisparse()


def hisparse_keeps_pinned() -> bool:
    """Whether ``HiSparseHostPool`` keeps the list of ranges it pinned (``pinned``,
    0.34), which ``release_pinned_state`` unpins; 0.33 unpins ``registered``."""
    return _engines.present(f"{_HS_RUNTIME}.HiSparseHostPool.pinned")


def hisparse_registration_ranges(tensor_sizes: list[int], num_blocks: int, total: int) -> tuple[tuple[int, int], ...]:
    """HiSparse's own split of a shared pool of ``total`` bytes into the ranges it
    registers (never bisecting a tensor's host block), from where the release keeps it."""
    for dotted in _HS_RANGES:
        try:
            split = _engines.resolve(dotted)
        except LookupError:
            continue
        if dotted.endswith("host_registration_ranges"):
            return tuple(split(tensor_sizes, num_blocks, total))
        return tuple(split(tensor_sizes, num_blocks, total // num_blocks))
    _engines.require(ENGINE, version(), [" or ".join(_HS_RANGES)])
    raise AssertionError("unreachable")


def version() -> str | None:
    """The installed vLLM's version."""
    return _engines.version_of(ENGINE)


def missing() -> list[str]:
    """The names of :data:`REQUIRED` the installed vLLM lacks, and the segment count
    when no release's place of it is there."""
    out = _engines.absent(REQUIRED)
    if not any(_engines.present(d) for d in _SEGMENTS):
        out.append(" or ".join(_SEGMENTS))
    return out


def check() -> None:
    """Raise :class:`hostpool.EngineVersionError` when the installed vLLM lacks any name
    the adapter needs, naming all of them."""
    _engines.require(ENGINE, version(), missing())


def region_segments() -> int:
    """How many files vLLM splits its region into (hostpool keeps its slot order)."""
    for dotted in _SEGMENTS:
        try:
            return int(_engines.resolve(dotted))
        except LookupError:
            continue
    _engines.require(ENGINE, version(), [" or ".join(_SEGMENTS)])
    raise AssertionError("unreachable")


def has_touch() -> bool:
    """Whether this vLLM's manager and policies still have ``touch`` (0.33; recency
    also comes through ``on_request_finished`` in every release)."""
    return _engines.present(f"{_MANAGER}.CPUOffloadingManager.touch") and _engines.present(
        f"{_POLICIES}.CachePolicy.touch"
    )


def none_hash() -> tuple[Any, Any]:
    """vLLM's ``NONE_HASH`` and the seed it was made from (``_NONE_HASH_SEED``), each
    ``None`` where this release lacks it: optional, the kept tier's fingerprint then
    takes the hash algorithm from the engine's config alone."""
    utils = importlib.import_module(_UTILS)
    return getattr(utils, "NONE_HASH", None), getattr(utils, "_NONE_HASH_SEED", None)
