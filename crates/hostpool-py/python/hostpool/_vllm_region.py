"""vLLM's CPU offload region over a hostpool pool: :class:`HostPoolRegion`.

The region is vLLM's (:mod:`hostpool.vllm` is its public home, and
:mod:`hostpool.torch` keeps the old import path); it lives in a module of its
own that imports torch but not vLLM, so that a region can be laid over a pool
where vLLM is not installed (:class:`OffloadRegion`), and so that no module
of the package imports one that imports it.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import operator
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

import hostpool
from hostpool._adapter import Adapter
from hostpool._tensor import as_tensor

__all__ = [
    "HostPoolRegion",
    "NoWorkerSlotError",
    "OffloadRegion",
    "RegionFullError",
    "VllmAdapter",
    "ADAPTER",
    "install_pin_guard",
    "pool_name",
]

_log = logging.getLogger("hostpool.vllm")

# vLLM's floor for a segment file: its slot order (``iter_worker_slot_ranges``)
# starts each worker on a different segment, and hostpool keeps that order so
# the ranges are vLLM's for the same arguments, though no file exists here.
_MIN_SEGMENT_BYTES = 1 << 30

class RegionFullError(hostpool.CapacityError, AssertionError):
    """A view that does not fit in its slot or row.

    vLLM's ``SharedOffloadRegion`` asserts there (``AssertionError``); hostpool
    says :class:`hostpool.CapacityError`. Either ``except`` catches this one.
    """


class NoWorkerSlotError(ValueError, AssertionError):
    """A worker view asked of a region that has no rank (a scheduler-side region)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def pool_name(engine_id: object) -> str:
    """The name of the shared pool of vLLM engine ``engine_id``.

    ``vllm-<engine_id>`` when that is a valid hostpool name (1 to 64 letters,
    digits, ``.``, ``_`` or ``-``); else a readable prefix and a hash, so two
    engines never meet by accident.
    """
    raw = f"vllm-{engine_id}"
    if len(raw) <= 64 and re.fullmatch(r"[A-Za-z0-9._-]+", raw):
        return raw
    digest = hashlib.sha256(str(engine_id).encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(engine_id))[:40]
    return f"vllm-{safe}-{digest}"


def _index(name: str, value: object) -> int:
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__} {value!r}") from None


class HostPoolRegion:
    """vLLM's ``SharedOffloadRegion``, over a hostpool pool.

    The constructor takes vLLM's arguments, and the views are vLLM's for the
    same arguments: ``num_chunks`` rows of ``kv_bytes_per_chunk`` bytes, worker
    ``r`` owning the ``cpu_page_size`` bytes at ``r * cpu_page_size`` of each
    row; :meth:`create_next_worker_view` and :meth:`create_next_canonical_view`
    return int8 ``(num_chunks, tensor_page_size)`` tensors of stride
    ``(kv_bytes_per_chunk, 1)`` at the same byte offsets from the base;
    :meth:`iter_worker_slot_ranges` yields the same ranges;
    ``total_size_bytes``, ``_row_stride``, ``cpu_page_size``, ``page_size``,
    ``rank`` and ``_base`` are the same.

    What differs is underneath:

    * The memory is one hostpool pool built from ``pool_config`` (the keys of
      a hostpool config file: ``dir``, ``backing``, ``page_size``,
      ``numa_node``, ``threads``, ``prefault``, ``pin``, ``block_size``, ...;
      the size is ``num_chunks * kv_bytes_per_chunk``). ``block_size``
      defaults to the row, so no pinned chunk splits a row. A ``dir`` on
      hugetlbfs gives 2 MiB or 1 GiB pages.
    * Without a ``sharing`` table in ``pool_config`` the region is private to
      this process (vLLM's ``barrier=None``). With one (``world``, and
      optionally the timeouts or ``rendezvous``), the workers of one engine
      share it through hostpool's socket rendezvous: nothing is ever in
      ``/dev/shm``, a worker that dies is named by the others, and the kernel
      frees the memory with the last worker. A missing ``name`` is
      :func:`pool_name` of ``engine_id``, a missing ``rank`` is
      ``populate_shard[0]`` (vLLM passes ``rank=0`` to every worker of a
      replicated layout) or ``rank``, a missing ``world`` is
      ``populate_shard[1]``. Each worker prefaults its shard. hostpool's
      rendezvous is the barrier, so ``barrier`` is accepted and not called.
    * hostpool pins the pool when ``pin`` asks (chunked, driver API,
      optionally in the background): ``is_pinned`` and ``pinned_addresses``
      say what is pinned, and :mod:`hostpool.vllm` keeps vLLM's
      ``pin_mmap_region`` from registering it again.
    * ``creator_memory_check(total_size_bytes)`` runs before a private region
      is built; a shared pool's creator runs hostpool's own capacity checks.
    * :meth:`cleanup` unpins and frees the pool, never raises and may run
      twice; views still alive keep the memory until the last one goes.

    ``pool=`` lays the region over a pool the caller owns instead (then
    :meth:`cleanup` leaves it open).
    """

    BLOCK_SIZE_ALIGNMENT: int = mmap.PAGESIZE
    """As vLLM's: ``kv_bytes_per_chunk`` must be a multiple of this."""

    def __init__(
        self,
        engine_id: str,
        num_chunks: int,
        rank: int | None,
        kv_bytes_per_chunk: int,
        cpu_page_size: int,
        barrier: Callable[[], None] | None = None,
        *,
        creator_memory_check: Callable[[int], None] | None = None,
        populate_shard: tuple[int, int] | None = None,
        num_segments: int = 1,
        pool_config: Mapping[str, Any] | None = None,
        pool: hostpool.Pool | None = None,
    ) -> None:
        """Build (or, with ``pool=``, use) the pool and lay vLLM's rows over it.

        Raises :class:`hostpool.ConfigError` for arguments vLLM would reject
        or that do not describe a region (``kv_bytes_per_chunk`` not a
        multiple of 4 KiB, a slot outside the row, no rows, a ``size`` in
        ``pool_config``), ``TypeError`` for a size that is not an int, and
        what :class:`hostpool.Pool` raises.
        """
        num_chunks = _index("num_chunks", num_chunks)
        kv_bytes_per_chunk = _index("kv_bytes_per_chunk", kv_bytes_per_chunk)
        cpu_page_size = _index("cpu_page_size", cpu_page_size)
        rank = None if rank is None else _index("rank", rank)
        num_segments = _index("num_segments", num_segments)
        if num_chunks < 1:
            raise hostpool.ConfigError(f"num_chunks = {num_chunks}: a region needs at least one row")
        if kv_bytes_per_chunk <= 0 or kv_bytes_per_chunk % self.BLOCK_SIZE_ALIGNMENT:
            raise hostpool.ConfigError(
                f"kv_bytes_per_chunk = {kv_bytes_per_chunk} must be a positive multiple of "
                f"{self.BLOCK_SIZE_ALIGNMENT} (vLLM rounds the row up to it)"
            )
        if cpu_page_size <= 0:
            raise hostpool.ConfigError(f"cpu_page_size = {cpu_page_size} must be positive")
        if rank is not None and (rank < 0 or (rank + 1) * cpu_page_size > kv_bytes_per_chunk):
            raise hostpool.ConfigError(
                f"rank {rank}'s slot of {cpu_page_size} bytes at {max(rank, 0) * cpu_page_size} "
                f"does not lie in the row of {kv_bytes_per_chunk} bytes"
            )
        if populate_shard is not None:
            index, count = (_index("populate_shard", v) for v in populate_shard)
            if not 0 <= index < count:
                raise hostpool.ConfigError(
                    f"populate_shard = ({index}, {count}): give (index, count) with 0 <= index < count"
                )
            populate_shard = (index, count)
        total = num_chunks * kv_bytes_per_chunk
        self._owns_pool = pool is None
        if pool is None:
            config = self._pool_config(engine_id, rank, populate_shard, total, kv_bytes_per_chunk, pool_config)
            if "sharing" not in config and creator_memory_check is not None:
                creator_memory_check(total)
            from hostpool import _engine_config
            pool = hostpool.Pool.from_config(_engine_config.with_gpu_device(config))
        elif pool_config is not None:
            raise hostpool.ConfigError("pass pool_config or pool, not both")
        self._init_layout(pool, num_chunks, rank, kv_bytes_per_chunk, cpu_page_size, num_segments)
        install_pin_guard()

    @staticmethod
    def _pool_config(
        engine_id: object,
        rank: int | None,
        populate_shard: tuple[int, int] | None,
        total: int,
        row: int,
        pool_config: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        config = dict(pool_config or {})
        if "size" in config:
            raise hostpool.ConfigError(
                f"pool_config has `size`, which the region sets itself "
                f"(num_chunks x kv_bytes_per_chunk = {total} bytes): remove it"
            )
        lease = config.get("lease")
        lease = lease if isinstance(lease, Mapping) else {}
        if lease.get("keeper") is None or lease.get("fallback") == "build":
            config["size"] = total
        # else: a lease takes the kept pool as it is; it must hold the region
        # (a keeper that keeps content holds the index at its tail too).
        config.setdefault("block_size", row)
        sharing = config.get("sharing")
        if sharing is not None:
            if not isinstance(sharing, Mapping):
                raise hostpool.ConfigError(
                    f"pool_config's `sharing` must be a table such as {{\"world\": 2}}, not {sharing!r}"
                )
            sharing = dict(sharing)
            sharing.setdefault("name", pool_name(engine_id))
            if "rank" not in sharing:
                if populate_shard is not None:
                    sharing["rank"] = populate_shard[0]
                elif rank is not None:
                    sharing["rank"] = rank
                else:
                    raise hostpool.ConfigError(
                        "a shared region needs a rank: pass rank=, populate_shard= or sharing.rank"
                    )
            if "world" not in sharing:
                if populate_shard is None:
                    raise hostpool.ConfigError(
                        "pool_config's `sharing` needs `world` (how many workers share the region)"
                    )
                sharing["world"] = populate_shard[1]
            config["sharing"] = sharing
        return config

    def _init_layout(
        self,
        pool: hostpool.Pool,
        num_chunks: int,
        rank: int | None,
        row_stride: int,
        cpu_page_size: int,
        num_segments: int,
    ) -> None:
        total = num_chunks * row_stride
        if total > pool.nbytes:
            lease = pool.report.get("keeper")
            remedy = ""
            if lease:
                remedy = (
                    f": kept pool `{lease.get('name')}` is too small; restart its keeper with "
                    f"--size {total} or more (plus hostpool.index_bytes({num_chunks}, page size) "
                    f"with content = \"keep\", for the index that keeps the CPU tier across restarts)"
                )
            if self._owns_pool:
                pool.close()
            raise hostpool.CapacityError(
                f"{num_chunks} blocks x {row_stride} bytes = {total} bytes do not fit in "
                f"the pool of {pool.nbytes} bytes{remedy}"
            )
        self.pool: hostpool.Pool | None = pool
        """The pool the views point into (``None`` after :meth:`cleanup`)."""
        self.page_size: int = mmap.PAGESIZE
        """vLLM's ``page_size``: slots are rounded out to it (``pool.page_size`` is the pool's)."""
        self.num_chunks: int = num_chunks
        self._row_stride: int = row_stride
        self.total_size_bytes: int = total
        self.cpu_page_size: int = cpu_page_size
        self.rank: int | None = rank
        self.mmap_path: str | None = None
        """vLLM's file; hostpool has none."""
        self._worker_offset: int = 0 if rank is None else rank * cpu_page_size
        self._worker_area_end: int = 0 if rank is None else (rank + 1) * cpu_page_size
        self._canonical_offset: int = 0
        segments = min(num_segments, total // _MIN_SEGMENT_BYTES)
        rows = max(1, _cdiv(num_chunks, max(1, segments)))
        self._num_segments: int = len(range(0, max(num_chunks, 1), rows))
        base = as_tensor(pool, torch.int8)
        self._base: torch.Tensor | None = base if base.numel() == total else base[:total]
        self._views: list[torch.Tensor] = []

    # --- what vLLM reads ------------------------------------------------------

    @property
    def is_pinned(self) -> bool:
        """Whether the whole pool is pinned for the GPU (by hostpool)."""
        return self.pool is not None and not self.pool.closed and bool(self.pool.pinned)

    @property
    def pinned_addresses(self) -> list[int]:
        """Start addresses of the pinned ranges (hostpool unpins them; vLLM must not)."""
        if self.pool is None or self.pool.closed:
            return []
        addr = self.pool.addr
        return [addr + r["offset"] for r in self.pool.pin_status().get("ranges", [])]

    @property
    def base_tensor(self) -> torch.Tensor:
        """The whole region as int8, as vLLM's; ``RuntimeError`` after :meth:`cleanup`."""
        if self._base is None:
            raise RuntimeError("Shared offload region has been released.")
        return self._base

    def iter_worker_slot_ranges(self) -> Iterator[tuple[int, int]]:
        """This worker's slots as page-aligned ``(offset, length)``, in vLLM's order."""
        if self.rank is None:
            raise NoWorkerSlotError("a region with rank=None has no worker slot")
        worker_offset = self.rank * self.cpu_page_size
        first = 0
        if self._num_segments > 1:
            first = self.rank * self.num_chunks // (self._row_stride // self.cpu_page_size)
        for i in range(self.num_chunks):
            row = (first + i) % self.num_chunks
            start = row * self._row_stride + worker_offset
            aligned = start - start % self.page_size
            end = _round_up(start + self.cpu_page_size, self.page_size)
            yield aligned, end - aligned

    def _strided(self, offset: int, tensor_page_size: int) -> torch.Tensor:
        if self._base is None:
            raise RuntimeError("Shared offload region has been released.")
        view = torch.as_strided(
            self._base,
            size=(self.num_chunks, tensor_page_size),
            stride=(self._row_stride, 1),
            storage_offset=offset,
        )
        self._views.append(view)
        return view

    def create_next_worker_view(self, tensor_page_size: int) -> torch.Tensor:
        """The next ``tensor_page_size`` bytes of this worker's slot in every row.

        An int8 ``(num_chunks, tensor_page_size)`` tensor of stride
        ``(row_stride, 1)`` at ``base + worker_offset``; the cursor then
        advances. :class:`RegionFullError` ("exceeds worker area end", as
        vLLM's assertion) leaves the cursor where it was.
        """
        if self.rank is None:
            raise NoWorkerSlotError("a region with rank=None has no worker slot")
        tensor_page_size = _index("tensor_page_size", tensor_page_size)
        if tensor_page_size <= 0:
            raise ValueError(f"tensor_page_size must be positive, got {tensor_page_size}")
        new_offset = self._worker_offset + tensor_page_size
        if new_offset > self._worker_area_end:
            raise RegionFullError(
                f"Worker offset {new_offset} exceeds worker area end "
                f"{self._worker_area_end} (overflowed by "
                f"{new_offset - self._worker_area_end} bytes)"
            )
        view = self._strided(self._worker_offset, tensor_page_size)
        self._worker_offset = new_offset
        return view

    create_next_view = create_next_worker_view

    def create_next_canonical_view(self, tensor_page_size: int) -> torch.Tensor:
        """The next ``tensor_page_size`` bytes of every row, the same for all workers.

        vLLM's canonical layout; :class:`RegionFullError` past the row, the
        cursor unchanged.
        """
        tensor_page_size = _index("tensor_page_size", tensor_page_size)
        if tensor_page_size <= 0:
            raise ValueError(f"tensor_page_size must be positive, got {tensor_page_size}")
        new_offset = self._canonical_offset + tensor_page_size
        if new_offset > self._row_stride:
            raise RegionFullError(
                f"Canonical offset {new_offset} exceeds row stride {self._row_stride} "
                f"(overflowed by {new_offset - self._row_stride} bytes)"
            )
        view = self._strided(self._canonical_offset, tensor_page_size)
        self._canonical_offset = new_offset
        return view

    def create_kv_memoryview(self) -> memoryview:
        """A zero-copy ``(num_chunks, row_stride)`` int8 memoryview, as vLLM's."""
        kv = self.base_tensor.view(self.num_chunks, self._row_stride).numpy()
        if kv.ctypes.data != self.base_tensor.data_ptr():
            raise hostpool.Error("the KV memoryview is a copy, not the pool")
        return memoryview(kv)

    def cleanup(self) -> None:
        """Drop the views and give the pool back (unpinned, unmapped); never raises.

        May be called twice. A view the caller still holds keeps the memory
        mapped (a ``PoolBusyError`` from ``close()`` is swallowed): the pool
        is torn down when the last view goes. A pool passed as ``pool=`` is
        left open for its owner.
        """
        self._views.clear()
        self._base = None
        pool, self.pool = self.pool, None
        if pool is None or not self._owns_pool or pool.closed:
            return
        try:
            issues = pool.close()
        except hostpool.PoolBusyError:
            _log.info(
                "the offload region's views are still alive: its pool of %d bytes is "
                "freed when the last one goes",
                pool.nbytes,
            )
        except Exception:  # cleanup never raises, as vLLM's
            _log.warning("closing the offload region's pool failed", exc_info=True)
        else:
            for issue in issues:
                _log.warning("offload region teardown: %s: %s", issue.get("step"), issue.get("detail"))

    # --- hostpool's names (hostpool.torch.OffloadRegion) ----------------------

    @property
    def num_blocks(self) -> int:
        """Rows in the region (vLLM's ``num_chunks``)."""
        return self.num_chunks

    @property
    def row_stride(self) -> int:
        """Bytes from one row to the next (vLLM's ``kv_bytes_per_chunk``)."""
        return self._row_stride

    @property
    def worker_offset(self) -> int:
        """Cursor: offset in each row of this worker's next view."""
        return self._worker_offset

    @property
    def worker_area_end(self) -> int:
        """Exclusive end in each row of this worker's slot."""
        return self._worker_area_end

    @property
    def canonical_offset(self) -> int:
        """Cursor of :meth:`create_next_canonical_view`."""
        return self._canonical_offset

    @property
    def base(self) -> torch.Tensor | None:
        """The region as int8 (vLLM's ``_base``); ``None`` after :meth:`cleanup`."""
        return self._base

    @property
    def views(self) -> list[torch.Tensor]:
        """The views handed out so far."""
        return self._views


class OffloadRegion(HostPoolRegion):
    """The older name: vLLM's views over a pool the caller owns.

    ``OffloadRegion(pool, cpu_page_size, world, rank, num_blocks=None,
    row_stride=None)``: ``num_blocks`` defaults to as many rows as the pool
    holds, ``row_stride`` to ``world * cpu_page_size`` (any number of bytes,
    not only 4 KiB multiples). :meth:`cleanup` leaves the pool open.
    """

    def __init__(
        self,
        pool: hostpool.Pool,
        cpu_page_size: int,
        world: int,
        rank: int | None,
        num_blocks: int | None = None,
        row_stride: int | None = None,
    ) -> None:
        """Lay out ``pool``; ``ValueError`` or :class:`hostpool.CapacityError` when it cannot."""
        cpu_page_size, world = _index("cpu_page_size", cpu_page_size), _index("world", world)
        rank = None if rank is None else _index("rank", rank)
        num_blocks = None if num_blocks is None else _index("num_blocks", num_blocks)
        row_stride = None if row_stride is None else _index("row_stride", row_stride)
        if cpu_page_size <= 0:
            raise ValueError(f"cpu_page_size must be positive, got {cpu_page_size}")
        if world < 1:
            raise ValueError(f"world must be at least 1, got {world}")
        if rank is not None and not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside world {world}")
        if row_stride is None:
            row_stride = world * cpu_page_size
        if row_stride < world * cpu_page_size:
            raise ValueError(
                f"row_stride {row_stride} is less than world * cpu_page_size "
                f"= {world} * {cpu_page_size}"
            )
        if num_blocks is None:
            num_blocks = pool.nbytes // row_stride
        if num_blocks < 1:
            raise hostpool.CapacityError(
                f"a pool of {pool.nbytes} bytes holds no row of {row_stride} bytes "
                f"({world} workers x {cpu_page_size} bytes)"
            )
        self._owns_pool = False
        self.world: int = world
        """Number of workers sharing each row."""
        self._init_layout(pool, num_blocks, rank, row_stride, cpu_page_size, 1)


_GPU_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"


class VllmAdapter(Adapter):
    """hostpool's hooks into vLLM: its worker's ``pin_mmap_region`` leaves hostpool's
    regions alone (hostpool pins them), and hostpool's log records go to vLLM's
    handlers. Installed where vLLM builds hostpool's spec, and by each region
    (where vLLM's worker module is loaded); nothing at import."""

    engine = "vllm"
    log_target = "vllm"

    def hooks(self) -> None:
        gpu_worker = sys.modules.get(_GPU_WORKER)
        if gpu_worker is not None and "pin_mmap_region" in vars(gpu_worker):
            self.patch(gpu_worker, "pin_mmap_region", _pin_mmap_region)


ADAPTER = VllmAdapter()
"""The process's vLLM adapter."""


def _pin_mmap_region(region: Any, *args: Any, **kwargs: Any) -> None:
    """vLLM's ``pin_mmap_region``, except for a :class:`HostPoolRegion` (hostpool pins it)."""
    if isinstance(region, HostPoolRegion):
        _log.debug("vLLM's pin_mmap_region skipped: hostpool pins its own region")
        return None
    original = ADAPTER.theirs(sys.modules[_GPU_WORKER], "pin_mmap_region")
    return original(region, *args, **kwargs)


def install_pin_guard() -> None:
    """Make vLLM's ``pin_mmap_region`` leave hostpool regions alone (hostpool pins them).

    ``CPUOffloadingWorker`` calls its module's ``pin_mmap_region`` whenever
    vLLM pins memory; on a region hostpool already pinned (or is pinning in
    the background) a second ``cudaHostRegister`` of the same range fails.
    Other regions go to vLLM's function unchanged. Only where vLLM's worker
    module is loaded already (this imports nothing of vLLM's); idempotent:
    :data:`ADAPTER`'s install. hostpool's spec installs it when vLLM builds
    it, and every region on creation; ``ADAPTER.uninstall()`` undoes it.
    """
    ADAPTER.install()
