"""LMCache's names that hostpool's LMCache adapter reaches, and the check that they are there.

LMCache's CPU buffers all come from ``memory_management._allocate_cpu_memory``
and go back through ``_free_cpu_memory``, which the adapter replaces (and the
copies other modules import); its Mooncake store connector's
``_register_cpu_buffer`` and ``_unregister_cpu_buffer`` where that module
loads. :func:`check` runs where the adapter is installed
(``hostpool.lmcache.install``, or the ``vllm.general_plugins`` entry point).

Where they are, the adapter also uses ``memory_management.torch_dev`` (without: no
device sync before a free) and the connector's two methods (without: its
registration is left to LMCache).
"""

from __future__ import annotations

from hostpool import _engines

__all__ = ["ENGINE", "REQUIRED", "check"]

ENGINE = "lmcache"

MEMORY = "lmcache.v1.memory_management"
CONNECTOR = "lmcache.v1.storage_backend.connector.mooncakestore_connector"

REQUIRED: tuple[str, ...] = (
    f"{MEMORY}._allocate_cpu_memory",
    f"{MEMORY}._free_cpu_memory",
)
"""Every name the adapter needs."""


def check() -> None:
    """Raise :class:`hostpool.EngineVersionError` naming every name of :data:`REQUIRED`
    the installed LMCache lacks."""
    _engines.check(ENGINE, REQUIRED)
