"""SGLang's names that hostpool's SGLang adapter reaches, and the check that they are there.

SGLang has no door for a host KV buffer's memory: the adapter replaces
``alloc_with_host_register`` (and its cached copies in ``ALLOC_MEMORY_FUNCS``)
and ``available_host_memory_bytes``, and, with HiCache's ``mooncake``
backend, ``MooncakeBaseStore.register_buffer``. :func:`check` runs where the
adapter is installed (``hostpool.sglang.install``, or SGLang's plug-in).

Where they are, the adapter also uses ``base.HICACHE_HOST_MEMORY_RESERVE_BYTES``
(without: SGLang's reserve is taken as 0) and ``MooncakeBaseStore.register_buffer``
(without: SGLang's Mooncake registration is left to SGLang).
"""

from __future__ import annotations

from hostpool import _engines

__all__ = ["ENGINE", "REQUIRED", "check"]

ENGINE = "sglang"

COMMON = "sglang.srt.mem_cache.pool_host.common"
BASE = "sglang.srt.mem_cache.pool_host.base"
MOONCAKE = "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store"

REQUIRED: tuple[str, ...] = (
    f"{COMMON}.alloc_with_host_register",
    f"{COMMON}.ALLOC_MEMORY_FUNCS",
    f"{BASE}.available_host_memory_bytes",
)
"""Every name the adapter needs."""


def check() -> None:
    """Raise :class:`hostpool.EngineVersionError` naming every name of :data:`REQUIRED`
    the installed SGLang lacks."""
    _engines.check(ENGINE, REQUIRED)
