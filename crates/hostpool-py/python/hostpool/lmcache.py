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
"""

from __future__ import annotations

import threading
from typing import Any

import hostpool

__all__ = ["alloc", "free", "get_pool", "allocations"]

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
