"""A hostpool pool as a node's memory for Mooncake.

Mooncake (the distributed KV cache behind SGLang's HiCache ``mooncake``
backend, vLLM's ``MooncakeConnector`` and LMCache's Mooncake store) has no C
API: its Python objects are the interface. Two of them take host memory:

- a ``mooncake.engine.TransferEngine`` registers it for transfers
  (``register_memory`` / ``batch_register_memory``);
- a ``mooncake.store.MooncakeDistributedStore`` registers a buffer for
  zero-copy ``put_from`` / ``get_into`` (``register_buffer``), and mounts a
  file as this node's segment of the store (``mount_segment``).

:func:`register` registers a pool with either, once, in regions that never
split a KV block or a page (huge pages stay whole) and never exceed
``max_region`` (the pool config's ``[mooncake] max_region``, else one
region), all or nothing. :func:`mount` makes the pool the store's segment.
Both are undone first when the pool closes::

    import hostpool, hostpool.mooncake
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    engine.initialize("10.0.0.5", "P2PHANDSHAKE", "rdma", "")
    with hostpool.Pool(size="400GiB", dir="/mnt/huge", pin="cuda") as pool:
        reg = hostpool.mooncake.register(pool, engine)
        peer_info = reg.peer          # what a peer needs to write here
        ...
    # pool.close() unregistered it before the memory went

A pool shared by the ranks of one engine (``shared=``) is registered by
each rank for its own shard (:attr:`hostpool.Pool.shard`) only.

A registration (and a mount) keeps its pool alive until it is undone:
Mooncake may still move bytes into that memory, so the pool must not be
collected and unmapped under it. End it with :meth:`Registration.unregister`
or the pool's ``close()``; a pool only dropped stays mapped and registered.
"""

from __future__ import annotations

import logging
from typing import Any

import hostpool

__all__ = ["Registration", "Mount", "register", "mount", "regions", "TABLE"]

_log = logging.getLogger("hostpool.mooncake")

TABLE = "mooncake"
"""The pool config's table for Mooncake: ``[mooncake] max_region``."""


def regions(pool: hostpool.Pool, max_region: int | str | None = None) -> list[tuple[int, int]]:
    """``(addr, len)`` of the regions :func:`register` registers: this rank's
    shard, split at ``max_region`` (default: ``[mooncake] max_region`` of
    the pool's config, else one region) on block and page boundaries.

    Raises ``hostpool.ConfigError`` for a limit smaller than one block or
    page (naming both)."""
    if max_region is None:
        table = pool.plugin_table(TABLE) or {}
        max_region = table.get("max_region")
    return pool.regions(max_region)


def _kind(engine: Any) -> str:
    if hasattr(engine, "register_memory"):
        return "transfer engine"
    if hasattr(engine, "register_buffer"):
        return "store"
    raise hostpool.ConfigError(
        f"{type(engine).__name__} is neither a Mooncake TransferEngine (register_memory) nor a "
        "MooncakeDistributedStore (register_buffer); pass one of them, set up"
    )


def _failed(code: Any) -> bool:
    return not isinstance(code, int) or code != 0


# Codes the 0.3.13 wheel returns for what this module meets (seen on loopback).
_CODES = {
    -7: "the range overlaps memory already registered with this transfer engine",
    -600: "invalid parameters: the range overlaps memory already registered with this store, "
    "or the store cannot reach its metadata",
    -900: "the RPC to the Mooncake master failed: is it running and reachable?",
}


def _why(code: Any) -> str:
    meaning = _CODES.get(code) if isinstance(code, int) else None
    return f"Mooncake returned {code!r}" + (f" ({meaning})" if meaning else "")


class Registration:
    """A pool's regions registered with a Mooncake object; :meth:`unregister`
    (or the pool's ``close()``) ends it."""

    def __init__(self, engine: Any, pool: hostpool.Pool, kind: str, done: list[tuple[int, int]]) -> None:
        """Made by :func:`register`."""
        self.engine = engine
        """The ``TransferEngine`` or ``MooncakeDistributedStore``."""
        self.pool = pool
        """The pool registered."""
        self.kind = kind
        """``"transfer engine"`` or ``"store"``."""
        self.regions = list(done)
        """``(addr, len)`` of each region registered, in order."""
        self._live = True

    @property
    def registered(self) -> bool:
        """Whether the regions are still registered."""
        return self._live

    @property
    def peer(self) -> dict[str, Any]:
        """What a peer needs to reach these regions: the regions, the pool's
        page and block size and, for a transfer engine, its RPC port (the
        peer's target is ``f"{host}:{rpc_port}"``)."""
        info: dict[str, Any] = {
            "regions": [list(r) for r in self.regions],
            "page_size": self.pool.page_size,
            "block_size": self.pool.block_size,
        }
        if self.kind == "transfer engine" and hasattr(self.engine, "get_rpc_port"):
            info["rpc_port"] = self.engine.get_rpc_port()
        elif hasattr(self.engine, "get_hostname"):
            info["hostname"] = self.engine.get_hostname()
        return info

    def unregister(self) -> None:
        """Unregister every region, last first; idempotent. Raises
        ``hostpool.Error`` naming the regions Mooncake refused to let go
        (after trying every one)."""
        if not self._live:
            return
        self._live = False
        self.pool._forget_before_close(self.unregister)
        refused = _unregister(self.engine, self.kind, self.regions)
        if refused:
            raise hostpool.Error(
                f"unregistering the pool from Mooncake's {self.kind}: {len(refused)} of "
                f"{len(self.regions)} region(s) refused, first at {refused[0][0]:#x}: {refused[0][1]}"
            )

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()

    def __repr__(self) -> str:
        state = "registered" if self._live else "unregistered"
        return f"<hostpool.mooncake.Registration {len(self.regions)} region(s) with a {self.kind}, {state}>"


def _unregister(engine: Any, kind: str, done: list[tuple[int, int]]) -> list[tuple[int, str]]:
    """Unregister ``done`` last first; the ``(addr, why)`` refused."""
    refused = []
    for addr, _ in reversed(done):
        try:
            code = engine.unregister_memory(addr) if kind == "transfer engine" else engine.unregister_buffer(addr)
        except Exception as e:  # keep going: give back as much as possible
            refused.append((addr, str(e)))
            continue
        if _failed(code):
            refused.append((addr, _why(code)))
    return refused


def register(
    pool: hostpool.Pool,
    engine: Any,
    *,
    max_region: int | str | None = None,
    location: str = "*",
) -> Registration:
    """Register ``pool`` (this rank's shard) with a Mooncake ``TransferEngine``
    or ``MooncakeDistributedStore``, all or nothing.

    The regions are :func:`regions` (``max_region`` or ``[mooncake]
    max_region``). A transfer engine takes them in one
    ``batch_register_memory`` call where it has one (``location`` is its
    NUMA location hint); a store takes one ``register_buffer`` call each.
    When one fails, those already registered are unregistered last first
    and ``hostpool.Error`` names the region and Mooncake's code. The pool's
    ``close()`` unregisters first.
    """
    kind = _kind(engine)
    chunks = regions(pool, max_region)
    done: list[tuple[int, int]] = []
    batch = getattr(engine, "batch_register_memory", None) if kind == "transfer engine" else None

    def fail(i: int, why: str, cause: BaseException | None = None) -> hostpool.Error:
        refused = _unregister(engine, kind, done)
        addr, length = chunks[i] if i < len(chunks) else (pool.addr, pool.mapped_bytes)
        left = f"; {len(refused)} of them could not be unregistered: {refused[0][1]}" if refused else ""
        err = hostpool.Error(
            f"registering region {i} of {len(chunks)} ({length} bytes at {addr:#x}) with Mooncake's {kind} "
            f"failed: {why}; the {len(done)} region(s) before it were unregistered in reverse{left}"
        )
        err.__cause__ = cause
        return err

    if batch is not None and len(chunks) > 1:
        try:
            code = batch([a for a, _ in chunks], [n for _, n in chunks], location)
        except Exception as e:
            done.extend(chunks)  # which were taken is unknown: give back all
            raise _batch_failed(engine, kind, chunks, str(e)) from e
        if _failed(code):
            raise _batch_failed(engine, kind, chunks, _why(code))
        done.extend(chunks)
    else:
        for i, (addr, length) in enumerate(chunks):
            try:
                if kind == "transfer engine":
                    code = engine.register_memory(addr, length, location)
                else:
                    code = engine.register_buffer(addr, length)
            except Exception as e:
                raise fail(i, str(e), e) from e
            if _failed(code):
                raise fail(i, _why(code))
            done.append((addr, length))
    reg = Registration(engine, pool, kind, done)
    pool._before_close(reg.unregister)
    _log.debug("pool at %#x registered with Mooncake's %s in %d region(s)", pool.addr, kind, len(done))
    return reg


def _batch_failed(engine: Any, kind: str, chunks: list[tuple[int, int]], why: str) -> hostpool.Error:
    # Mooncake's batch call does not say how far it got: each region is
    # unregistered alone, and one that was never registered refuses (ignored).
    _unregister(engine, kind, chunks)
    return hostpool.Error(
        f"registering {len(chunks)} regions with Mooncake's {kind} in one batch_register_memory call "
        f"failed: {why}; every region was unregistered in reverse"
    )


class Mount:
    """The pool mounted as segments of a ``MooncakeDistributedStore``;
    :meth:`unmount` (or the pool's ``close()``) ends it."""

    def __init__(self, store: Any, pool: hostpool.Pool, segments: list[dict[str, Any]]) -> None:
        """Made by :func:`mount`."""
        self.store = store
        """The store."""
        self.pool = pool
        """The pool mounted."""
        self.segments = segments
        """Each mount: ``path``, ``offset`` (in the file), ``size``, ``segment_ids``."""
        self._live = True

    @property
    def mounted(self) -> bool:
        """Whether the segments are still mounted."""
        return self._live

    @property
    def segment_ids(self) -> list[str]:
        """The store's ids of every segment mounted."""
        return [i for s in self.segments for i in s["segment_ids"]]

    def unmount(self) -> None:
        """Unmount every segment, last first; idempotent."""
        if not self._live:
            return
        self._live = False
        self.pool._forget_before_close(self.unmount)
        refused = _unmount(self.store, self.segments)
        if refused:
            raise hostpool.Error(f"unmounting the pool from Mooncake's store: {refused[0]}")

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def __repr__(self) -> str:
        state = "mounted" if self._live else "unmounted"
        return f"<hostpool.mooncake.Mount {len(self.segments)} segment(s), {state}>"


def _unmount(store: Any, segments: list[dict[str, Any]]) -> list[str]:
    refused = []
    for s in reversed(segments):
        try:
            code = store.unmount_segment(list(s["segment_ids"]), 0)
        except Exception as e:
            refused.append(f"{s['path']}: {e}")
            continue
        if _failed(code):
            refused.append(f"{s['path']}: {_why(code)}")
    return refused


def mount(pool: hostpool.Pool, store: Any, *, protocol: str = "tcp", location: str = "") -> Mount:
    """Mount ``pool`` (this rank's shard) as this node's segment of a
    ``MooncakeDistributedStore`` (``mount_segment``), one segment per file of
    the pool that the shard covers: the file's path while linked, else
    ``/proc/self/fd/N`` (an unlinked file, a memfd, a kept pool's file).
    The store maps the same pages, already prefaulted (and resident, for a
    kept pool). All or nothing; the pool's ``close()`` unmounts first.

    A store set up with ``global_segment_size`` 0 has no segment of its own
    and serves this one. An anonymous pool has no file and is refused."""
    if not hasattr(store, "mount_segment"):
        raise hostpool.ConfigError(
            f"{type(store).__name__} has no mount_segment: pass a mooncake.store.MooncakeDistributedStore "
            "(mooncake-transfer-engine 0.3.13 or later)"
        )
    files = pool.files()
    if not files:
        raise hostpool.ConfigError(
            f"the pool (backing {pool.backing}) is anonymous memory, which has no file to mount as a "
            "Mooncake segment; build it with backing = \"shm-segmented\" (dir = \"/dev/shm\") or "
            "\"hugetlbfs\" (dir = a hugetlbfs mount), or keep it ([lease] keeper = ...)"
        )
    start, length = pool.shard
    end = start + length
    segments: list[dict[str, Any]] = []
    for fd, offset, nbytes, path in files:
        lo, hi = max(start, offset), min(end, offset + nbytes)
        if lo >= hi:
            continue
        where = path if path is not None else f"/proc/self/fd/{fd}"
        size, at = hi - lo, lo - offset
        try:
            out = store.mount_segment(where, size, at, protocol, location)
        except Exception as e:
            _unmount(store, segments)
            raise hostpool.Error(
                f"mounting {where} ({size} bytes at offset {at}) as a Mooncake segment failed: {e}; "
                f"the {len(segments)} segment(s) before it were unmounted"
            ) from e
        code = out.get("ret") if isinstance(out, dict) else out
        if _failed(code):
            _unmount(store, segments)
            raise hostpool.Error(
                f"mounting {where} ({size} bytes at offset {at}) as a Mooncake segment failed: {_why(code)} "
                "(is the store set up, and its master reachable?); "
                f"the {len(segments)} segment(s) before it were unmounted"
            )
        segments.append({"path": where, "offset": at, "size": size, "segment_ids": list(out.get("segment_ids", []))})
    m = Mount(store, pool, segments)
    pool._before_close(m.unmount)
    return m
