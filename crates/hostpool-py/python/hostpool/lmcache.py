"""LMCache-style ``alloc``/``free`` of pinned host memory, one pool per allocation.

LMCache's ``_allocate_cpu_memory(size, numa_mapping, shm_name, use_hugepages)``
picks one of its native ``alloc_{pinned,pinned_numa,hugepage_pinned,shm_pinned}_ptr``
(mmap, first touch, ``cudaHostRegister``), wraps the address with
``torch.frombuffer((ctypes.c_uint8 * size).from_address(ptr), dtype=torch.uint8)``
and later hands it to the matching ``free_*_ptr``. Here all of them are
:func:`alloc` and :func:`free`:

==============================================  ==========================================
LMCache                                         here
==============================================  ==========================================
``alloc_pinned_ptr(size, 0)``                   ``alloc(size)``
``alloc_pinned_numa_ptr(size, node)``           ``alloc(size, numa=node)``
``alloc_hugepage_pinned_ptr(size, 0)``          ``alloc(size, hugepages=True)``
``alloc_hugepage_pinned_numa_ptr(size, node)``  ``alloc(size, numa=node, hugepages=True)``
``alloc_shm_pinned_ptr(size, shm_name)``        ``alloc(size, shm_name=name)``
``free_*_ptr(ptr, ...)``                        ``free(ptr)``
==============================================  ==========================================

Pinning is ``pin="cuda"`` best effort: without a GPU driver the memory is
prefaulted but not pinned (``get_pool(addr).pinned`` says which). The module
keeps each pool alive in a dict keyed by its address until :func:`free`.
This module needs no torch.

:func:`install` goes further: it makes LMCache's own
``lmcache.v1.memory_management._allocate_cpu_memory`` and
``_free_cpu_memory`` (through which ``PinMemoryAllocator``,
``MixedMemoryAllocator`` and ``PagedCpuGpuMemoryAllocator`` get their
buffers, and the copies ``storage_backend/nixl_storage_backend.py`` imports)
build and release hostpool pools; :func:`uninstall` restores them. The
wheel's ``vllm.general_plugins`` entry point ``hostpool`` calls
:func:`install` in every vLLM process when ``HOSTPOOL_LMCACHE`` holds a pool
config, so a vLLM + LMCache deployment turns hostpool on with one variable.

With LMCache's Mooncake store connector (``mooncakestore://``), LMCache
registers its pinned CPU buffer with its ``MooncakeDistributedStore``
(``MooncakestoreConnector._register_cpu_buffer``) and unregisters it at
``close()`` (``_unregister_cpu_buffer``). :func:`install` patches both: a
buffer inside one of its pools has the pool registered by
:func:`hostpool.mooncake.register`, once per connector, in regions that never
split a page (``[mooncake] max_region`` of the config caps them), kept on
the connector for its ``_unregister_cpu_buffer``; the pool's close
unregisters it first too. Other buffers are LMCache's to register.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

import hostpool
import hostpool.mooncake
from hostpool._adapter import Adapter
from hostpool._engines import lmcache as _names

__all__ = [
    "alloc",
    "free",
    "get_pool",
    "allocations",
    "install",
    "uninstall",
    "installed",
    "registration",
    "ENV_VAR",
]

_log = logging.getLogger("hostpool.lmcache")

ENV_VAR = "HOSTPOOL_LMCACHE"
"""The variable whose pool config makes the vLLM plugin call :func:`install`."""

_pools: dict[int, hostpool.Pool] = {}
_lock = threading.Lock()


def alloc(
    size: int | str,
    numa: int | None = None,
    hugepages: bool = False,
    shm_name: str | None = None,
    *,
    world: int = 1,
    rank: int = 0,
    **pool_kwargs: Any,
) -> int:
    """Build a prefaulted, best-effort pinned pool of ``size`` bytes; return its address.

    * ``numa``: bind the pages to this NUMA node (``numa_node``).
    * ``hugepages``: ``backing="hugetlbfs"``; with no ``dir`` in ``pool_kwargs``
      the pool is a hugetlb memfd (no mount needed), with the system's default
      huge page size unless ``page_size`` is given (LMCache uses 2 MiB).
    * ``shm_name``: a shared pool, ``hostpool.Shared(shm_name, world, rank)``
      (a leading ``/`` is dropped). LMCache ``shm_open``s ``/dev/shm/<name>``
      so that other processes open it by name; a hostpool shared pool leaves no
      file anywhere, and the other processes join it by calling :func:`alloc`
      (or ``hostpool.Pool``) with the same name, their ``rank`` and the common
      ``world``. With the default ``world=1`` the pool has a name but no peers.
    * ``pool_kwargs``: any other :class:`hostpool.Pool` argument (``dir``,
      ``page_size``, ``pin``, ``pin_required``, ``threads``, ...), overriding
      the defaults above.

    Raises what :class:`hostpool.Pool` raises (``ConfigError``,
    ``CapacityError``, ``PeerError``, ``PinError`` with ``pin_required=True``).
    """
    kwargs: dict[str, Any] = {"size": size, "pin": "cuda", "numa_node": numa}
    if hugepages:
        kwargs["backing"] = "hugetlbfs"
    if shm_name is not None:
        if "shared" in pool_kwargs:
            raise ValueError("pass shm_name or shared, not both")
        kwargs["shared"] = hostpool.Shared(shm_name.lstrip("/"), world, rank)
    elif world != 1 or rank != 0:
        raise ValueError("world and rank need a shm_name")
    kwargs.update(pool_kwargs)
    pool = hostpool.Pool(**kwargs)
    with _lock:
        _pools[pool.addr] = pool
    ADAPTER.track(pool)
    return pool.addr


def get_pool(addr: int) -> hostpool.Pool:
    """The live pool :func:`alloc` returned ``addr`` for; ``ValueError`` if none."""
    with _lock:
        pool = _pools.get(addr)
    if pool is None:
        raise ValueError(_unknown(addr))
    return pool


def allocations() -> dict[int, int]:
    """Address -> logical size (bytes) of every allocation not yet freed."""
    with _lock:
        return {addr: pool.nbytes for addr, pool in _pools.items()}


def free(addr: int) -> list[str]:
    """Close the pool at ``addr`` (unpin, unmap, leave nothing behind).

    Returns the pool's teardown issues (empty when clean). Raises
    ``ValueError`` for an address :func:`alloc` did not return or that was
    already freed, and :class:`hostpool.PoolBusyError` (the allocation stays
    live, free it again later) while buffers exported from the pool, such as
    ``memoryview``\\ s or ``torch.frombuffer`` tensors of it, are alive. A
    ``ctypes``-wrapped address, as LMCache makes, is not an export: stop using
    it before calling this.
    """
    with _lock:
        pool = _pools.pop(addr, None)
        if pool is None:
            raise ValueError(_unknown(addr))
        try:
            return pool.close()
        except hostpool.PoolBusyError:
            _pools[addr] = pool
            raise


def _unknown(addr: int) -> str:
    return (
        f"address {addr:#x} was not returned by hostpool.lmcache.alloc, "
        "or it was already freed"
    )


# ------------------------------------------------------------- install()

_MM = _names.MEMORY
# Modules that hold `from lmcache.v1.memory_management import _allocate_cpu_memory`
# copies of the two names.
_COPIES = ("lmcache.v1.storage_backend.nixl_storage_backend",)
_NAMES = ("_allocate_cpu_memory", "_free_cpu_memory")
# LMCache's Mooncake store connector: its CPU buffer's (un)registration.
_CONNECTOR = _names.CONNECTOR
_CONNECTOR_NAMES = ("_register_cpu_buffer", "_unregister_cpu_buffer")


class LmcacheAdapter(Adapter):
    """hostpool's hooks into LMCache (see :func:`install`). LMCache runs inside
    vLLM (its ``vllm.general_plugins`` entry point): hostpool's records go to
    vLLM's handlers where vLLM configured them."""

    engine = "lmcache"
    log_target = "vllm"
    names = _names

    def __init__(self) -> None:
        super().__init__()
        self.connector_tried = False

    def hooks(self) -> None:
        import importlib

        mm = importlib.import_module(_MM)
        for name, ours in zip(_NAMES, (_allocate_cpu_memory, _free_cpu_memory)):
            self.patch(mm, name, ours)
            theirs = self.original(mm, name)
            for module in _copies():
                if vars(module).get(name) is theirs:
                    self.patch(module, name, ours)
        if _CONNECTOR in sys.modules:
            self.patch_connector()

    def patch_connector(self, load: bool = False) -> None:
        """Patch ``MooncakestoreConnector``'s CPU buffer (un)registration; with
        ``load``, import its module first (nothing where it does not import)."""
        module = sys.modules.get(_CONNECTOR)
        if module is None and load:
            import importlib

            try:
                module = importlib.import_module(_CONNECTOR)
            except Exception as e:  # optional: LMCache without it, or its imports failing
                _log.debug("%s does not import (%s): LMCache's Mooncake registration is left as is", _CONNECTOR, e)
        cls = getattr(module, "MooncakestoreConnector", None)
        if cls is None:
            return
        if not all(name in vars(cls) for name in _CONNECTOR_NAMES):
            _log.debug("LMCache's MooncakestoreConnector lacks %s: its registration is left as is", _CONNECTOR_NAMES)
            return
        for name in _CONNECTOR_NAMES:
            self.patch(cls, name, _CONNECTOR_METHODS[name])

    def uninstall(self) -> None:
        super().uninstall()
        self.connector_tried = False


ADAPTER = LmcacheAdapter()
"""The process's LMCache adapter."""


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return ADAPTER.installed


def registration(connector: Any) -> Any:
    """The live :class:`hostpool.mooncake.Registration` of a ``MooncakestoreConnector``'s
    CPU buffer made by :func:`install`'s hook (with the connector's store), or ``None``."""
    store = getattr(connector, "store", None)
    for regs in ADAPTER.registrations().values():
        for reg in regs:
            if reg.engine is store:
                return reg
    return None


def install(config: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> None:
    """Make LMCache's CPU buffers hostpool pools, one per ``_allocate_cpu_memory`` call.

    ``config`` is a pool config applied to every buffer (a dict of config
    keys, a TOML or JSON file's path, or inline TOML or JSON; ``None``: the
    defaults, a best-effort CUDA pin). Per call, LMCache's arguments decide
    the rest: ``size``; ``numa_mapping`` the ``numa_node`` (the current
    device's entry of its GPU-to-NUMA map); ``shm_name`` a shared pool of
    that name (nothing in ``/dev/shm``); ``use_hugepages`` the ``hugetlbfs``
    backing (a memfd when the config names no ``dir``). The returned tensor
    is LMCache's kind, ``torch.frombuffer`` of a ctypes array at the pool's
    address, holding no export: ``_free_cpu_memory`` is what closes the pool.
    A buffer allocated before :func:`install` is freed by LMCache's own
    function. Calling it again replaces the config. Raises
    :class:`hostpool.ConfigError` for a bad config, ``ImportError`` without
    LMCache.

    LMCache's ``MooncakestoreConnector._register_cpu_buffer`` and
    ``_unregister_cpu_buffer`` are patched too, when its module is loaded:
    at once if it already is, else at the first buffer made here (a buffer
    made elsewhere is LMCache's to register anyway), so that a vLLM process
    that never builds LMCache's storage does not import it. A buffer in one
    of these pools has the pool registered with the connector's store by
    :func:`hostpool.mooncake.register`, once, and its ``Registration`` is
    kept on the connector, whose ``_unregister_cpu_buffer`` ends it. A
    failure is logged and leaves the buffer unregistered, as LMCache does.
    """
    parsed = None
    if config is not None:
        from hostpool import _engine_config

        parsed = _engine_config.load(config, what="hostpool.lmcache.install(config)")
    _install(parsed, None)


def _install(config: dict[str, Any] | None, error: hostpool.Error | None) -> None:
    ADAPTER.install(config, error)


def _copies() -> list[Any]:
    return [sys.modules[m] for m in _COPIES if m in sys.modules]


def uninstall() -> None:
    """Restore LMCache's own functions and methods, exactly (buffers already made
    stay until freed)."""
    ADAPTER.uninstall()


def _torch_dev() -> Any:
    """LMCache's device module (``memory_management.torch_dev``), or ``None``."""
    return getattr(sys.modules.get(_MM), "torch_dev", None)


def _numa_node(numa_mapping: Any) -> int | None:
    """The NUMA node LMCache would bind: its map's entry for the current device."""
    if not numa_mapping:
        return None
    device = 0
    torch_dev = _torch_dev()
    try:
        if torch_dev is not None and torch_dev.is_available():
            device = torch_dev.current_device()
    except Exception:  # no device: LMCache uses 0 too
        device = 0
    mapping = getattr(numa_mapping, "gpu_to_numa_mapping", None) or {}
    if device not in mapping:
        raise hostpool.ConfigError(
            f"LMCache's NUMA mapping {mapping!r} has no entry for device {device}"
        )
    return int(mapping[device])


def _allocate_cpu_memory(
    size: int,
    numa_mapping: Any = None,
    shm_name: str | None = None,
    use_hugepages: bool = False,
) -> Any:
    """LMCache's ``_allocate_cpu_memory``, as a hostpool pool (see :func:`install`)."""
    import torch

    if not ADAPTER.installed:  # uninstalled while a caller held this function
        mm = sys.modules[_MM]
        return mm._allocate_cpu_memory(size, numa_mapping, shm_name, use_hugepages)
    ADAPTER.current()
    if not ADAPTER.connector_tried:
        # LMCache's storage is being built: its Mooncake connector, if it
        # ever registers this buffer, must find the patch.
        ADAPTER.connector_tried = True
        ADAPTER.patch_connector(load=True)
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    if shm_name and use_hugepages:
        # As LMCache: its shm buffers are never huge pages.
        raise ValueError("Hugepages are not supported with shared memory (shm)")
    config = dict(ADAPTER.config or {})
    config["size"] = int(size)
    config.setdefault("pin", {"kind": "cuda"})
    node = _numa_node(numa_mapping)
    if node is not None:
        config["numa_node"] = node
    if use_hugepages and "dir" not in config:
        config.setdefault("backing", "hugetlbfs")
    if shm_name:
        given = config.get("sharing") or {}
        sharing = {"world": 1, "rank": 0, **given, "name": shm_name.lstrip("/")}
        config["sharing"] = sharing
        if sharing["world"] == 1:
            # Not silent: LMCache's multiprocess workers shm_open this name.
            _log.warning(
                "LMCache's buffer %r is named so that other processes can shm_open it; as a hostpool "
                "pool it has no name in /dev/shm, so they will not find it (LMCache's multiprocess "
                "workers then fall back to pickle transport). Give %s a sharing table with the "
                "world and rank of the processes that share it, or leave LMCache's shm buffers to "
                "LMCache (uninstall)",
                shm_name,
                ENV_VAR,
            )
    from hostpool import _engine_config
    pool = hostpool.Pool.from_config(_engine_config.with_gpu_device(config))
    with _lock:
        _pools[pool.addr] = pool
    ADAPTER.track(pool)
    _log.debug("LMCache buffer of %d bytes in a hostpool pool at %#x", size, pool.addr)
    buf = (ctypes.c_uint8 * int(size)).from_address(pool.addr)
    return torch.frombuffer(buf, dtype=torch.uint8)


def _free_cpu_memory(
    buffer: Any,
    size: int | None = None,
    numa_mapping: Any = None,
    shm_name: str | None = None,
    use_hugepages: bool = False,
) -> None:
    """LMCache's ``_free_cpu_memory``: closes the buffer's pool (LMCache's own for others)."""
    addr = buffer.data_ptr()
    with _lock:
        ours = addr in _pools
    if not ours:
        if buffer.numel() == 0:
            return
        original = ADAPTER.theirs(sys.modules[_MM], "_free_cpu_memory")
        return original(buffer, size, numa_mapping, shm_name, use_hugepages)
    torch_dev = _torch_dev()
    if torch_dev is not None and torch_dev.is_available():
        torch_dev.synchronize()  # as LMCache: no copy may still read the buffer
    for issue in free(addr):
        _log.warning("LMCache buffer teardown: %s: %s", issue.get("step"), issue.get("detail"))


def _connector_original(name: str) -> Any:
    return ADAPTER.theirs(sys.modules[_CONNECTOR].MooncakestoreConnector, name)


def _register_cpu_buffer(self: Any) -> None:
    """LMCache's ``MooncakestoreConnector._register_cpu_buffer``: a buffer in a
    hostpool pool registers the pool with the connector's store, once (see
    :func:`install`); any other buffer is LMCache's own method's."""
    allocator = getattr(getattr(self, "local_cpu_backend", None), "memory_allocator", None)
    buffer = getattr(getattr(allocator, "pin_allocator", None), "buffer", None)
    pool = None
    if buffer is not None and getattr(self, "store", None) is not None and buffer.numel() > 0:
        pool = ADAPTER.pool_of(buffer.data_ptr(), buffer.numel() * buffer.element_size())
    if pool is None:
        return _connector_original("_register_cpu_buffer")(self)
    try:
        reg, new = ADAPTER.register(pool, self.store)
    except Exception as e:  # as LMCache: logged, and the buffer is not registered
        # As text: a log record holding the error (its frames) would hold the pool.
        _log.error("LMCache's CPU buffer registration with Mooncake failed: %s", str(e))
        self.registered_buffer_ptr = None
        return
    self.registered_buffer_ptr = buffer.data_ptr()
    if not new:
        _log.debug("LMCache's CPU buffer at %#x is already registered with this Mooncake store", pool.addr)
        return
    _log.info(
        "LMCache's CPU buffer at %#x registered with Mooncake's store by hostpool: %d region(s) of its pool "
        "(%d bytes)",
        pool.addr,
        len(reg.regions),
        sum(n for _, n in reg.regions),
    )


def _unregister_cpu_buffer(self: Any) -> None:
    """LMCache's ``MooncakestoreConnector._unregister_cpu_buffer``: ends the
    connector's hostpool registration (LMCache's own method for others)."""
    regs = ADAPTER.end_registrations(target=getattr(self, "store", None))
    if not regs:
        return _connector_original("_unregister_cpu_buffer")(self)
    self.registered_buffer_ptr = None
    for reg in regs:
        try:
            reg.unregister()  # a no-op when the pool's close() did it already
        except hostpool.Error as e:  # as LMCache: logged
            _log.warning("LMCache's CPU buffer unregistration from Mooncake failed: %s", str(e))
        else:
            _log.info("LMCache's CPU buffer at %#x unregistered from Mooncake's store", reg.pool.addr)


_CONNECTOR_METHODS: dict[str, Any] = {
    "_register_cpu_buffer": _register_cpu_buffer,
    "_unregister_cpu_buffer": _unregister_cpu_buffer,
}


def _vllm_general_plugin() -> None:
    """The ``vllm.general_plugins`` entry point's LMCache half (``hostpool._vllm_plugin``):
    :func:`install` when ``HOSTPOOL_LMCACHE`` is set.

    vLLM runs it in every process and does not catch what it raises, so it
    never raises: without the variable it does nothing; a config that does
    not parse installs anyway and the first LMCache allocation raises
    hostpool's error (LMCache never silently falls back to its own memory);
    without LMCache it logs and does nothing.
    """
    from hostpool import _engine_config

    loaded = _engine_config.for_plugin(ENV_VAR)
    if loaded is None:
        _log.debug("%s is not set: LMCache keeps its own CPU memory", ENV_VAR)
        return
    config, error = loaded
    try:
        _install(config, error)
    except ImportError as e:
        _log.warning("%s is set but LMCache cannot be imported (%s): nothing installed", ENV_VAR, e)
        return
    except hostpool.EngineVersionError as e:
        _log.error("%s is set, and hostpool cannot hook this LMCache (it keeps its own CPU memory): %s", ENV_VAR, e)
        return
    except Exception:  # never raise into vLLM
        _log.warning("hostpool.lmcache.install() failed", exc_info=True)
        return
    if error is not None:
        _log.error("%s: %s (LMCache's first CPU allocation will raise this)", ENV_VAR, error)
    else:
        _log.info("LMCache's CPU buffers are hostpool pools (%s)", ENV_VAR)
