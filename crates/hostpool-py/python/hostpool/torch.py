"""Torch views of a :class:`hostpool.Pool`, with no copies.

* :func:`as_tensor` -- the whole pool as one 1-D tensor.
* :class:`OffloadRegion` -- the per-worker strided views vLLM's CPU KV offload
  (``vllm/v1/kv_offload/cpu/shared_offload_region.py``, ``SharedOffloadRegion``)
  carves from its shared region, over a pool instead of a ``/dev/shm`` file.

Importing this module imports torch; ``import hostpool`` alone does not.
"""

from __future__ import annotations

import operator

import torch

import hostpool

__all__ = ["as_tensor", "OffloadRegion"]


def as_tensor(pool: hostpool.Pool, dtype: torch.dtype = torch.int8) -> torch.Tensor:
    """The whole pool as a 1-D CPU tensor of ``pool.nbytes // itemsize`` elements.

    Zero copy: ``tensor.data_ptr() == pool.addr``. The tensor holds a buffer export
    of the pool, so ``pool.close()`` raises :class:`hostpool.PoolBusyError` until
    the tensor (and every view of it) is gone.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float16, not {dtype!r}")
    count = pool.nbytes // dtype.itemsize
    if count == 0:
        raise ValueError(
            f"a pool of {pool.nbytes} bytes holds no element of {dtype} "
            f"({dtype.itemsize} bytes)"
        )
    # Through a memoryview, as vLLM does: torch.frombuffer releases its own
    # buffer export at once and only keeps a reference to the object, so the
    # memoryview it keeps is what holds the pool's export while the tensor lives.
    tensor = torch.frombuffer(memoryview(pool), dtype=dtype, count=count)
    if tensor.data_ptr() != pool.addr:  # torch.frombuffer never copies; guard anyway
        raise hostpool.Error(
            f"torch.frombuffer returned {tensor.data_ptr():#x}, not the pool at {pool.addr:#x}"
        )
    return tensor


class OffloadRegion:
    """vLLM's ``SharedOffloadRegion`` views over a (usually shared) pool.

    The layout is vLLM's: ``num_blocks`` rows of ``row_stride`` bytes; in each
    row, worker ``r`` owns the ``cpu_page_size`` bytes at ``r * cpu_page_size``::

        worker0_block0 | worker1_block0 | ... | worker{world-1}_block0
        worker0_block1 | worker1_block1 | ... | worker{world-1}_block1

    Each call of :meth:`create_next_worker_view` hands out the next
    ``tensor_page_size`` bytes of this worker's slot in every row, as an int8
    tensor of shape ``(num_blocks, tensor_page_size)`` and stride
    ``(row_stride, 1)``: strides are bytes, as vLLM's ``swap_blocks`` expects.

    Mapping to vLLM (``SharedOffloadRegion(engine_id, num_blocks, rank,
    kv_bytes_per_block, cpu_page_size)``):

    ==========================  ===========================================
    vLLM                        here
    ==========================  ===========================================
    ``engine_id``               the pool's ``hostpool.Shared`` name
    ``kv_bytes_per_block``      ``row_stride`` (default ``world * cpu_page_size``)
    ``rank=None`` (scheduler)   ``rank=None``: canonical views and
                                :meth:`create_kv_memoryview` only
    ``_worker_offset``          :attr:`worker_offset` (the cursor)
    ``_worker_area_end``        :attr:`worker_area_end`
    ``_base``                   :attr:`base`
    ``is_pinned``               :attr:`is_pinned` (``pool.pinned``)
    ``create_next_view``        :meth:`create_next_worker_view` (alias kept)
    ``cleanup()``               :meth:`cleanup` (drops the views; the pool's
                                owner closes the pool)
    ==========================  ===========================================

    File creation, per-rank prefault and ``cudaHostRegister`` are the pool's job
    (``hostpool.Pool(shared=..., pin="cuda")``), so this class only does layout.
    One difference: vLLM has each rank prefault its own slots (strided through
    every row), hostpool a contiguous ``pool.shard``. The work is the same and
    as parallel; only first-touch NUMA placement could differ, and
    ``numa_node=`` sets that explicitly.

    An overflow raises :class:`hostpool.CapacityError` ("exceeds worker area
    end", as vLLM's assertion says) and leaves the cursor where it was.
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
        """Lay out ``pool`` for ``world`` workers of ``cpu_page_size`` bytes per block.

        ``num_blocks`` defaults to as many rows as the pool holds; ``row_stride``
        to ``world * cpu_page_size`` (pass vLLM's page-rounded
        ``kv_bytes_per_block`` to match its layout exactly). Raises
        ``ValueError`` for inconsistent arguments and
        :class:`hostpool.CapacityError` when the rows do not fit in the pool.
        """
        # Sizes and counts are ints (operator.index: a float is a TypeError
        # here, not a broken view later).
        cpu_page_size, world = operator.index(cpu_page_size), operator.index(world)
        rank = None if rank is None else operator.index(rank)
        num_blocks = None if num_blocks is None else operator.index(num_blocks)
        row_stride = None if row_stride is None else operator.index(row_stride)
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
        if num_blocks * row_stride > pool.nbytes:
            raise hostpool.CapacityError(
                f"{num_blocks} blocks x {row_stride} bytes = {num_blocks * row_stride} "
                f"bytes do not fit in the pool of {pool.nbytes} bytes"
            )
        self.pool: hostpool.Pool = pool
        """The pool the views point into."""
        self.cpu_page_size: int = cpu_page_size
        """Bytes per block of one worker's slot."""
        self.world: int = world
        """Number of workers sharing each row."""
        self.rank: int | None = rank
        """This worker's slot, or ``None`` for a scheduler-side region."""
        self.num_blocks: int = num_blocks
        """Rows (blocks) in the region."""
        self.row_stride: int = row_stride
        """Bytes from one row to the next (vLLM's ``kv_bytes_per_block``)."""
        self.total_size_bytes: int = num_blocks * row_stride
        """Bytes the region spans from the pool's start."""
        self.worker_offset: int = 0 if rank is None else rank * cpu_page_size
        """Cursor: offset in each row of this worker's next view."""
        self.worker_area_end: int = 0 if rank is None else (rank + 1) * cpu_page_size
        """Exclusive end in each row of this worker's slot."""
        self.canonical_offset: int = 0
        """Cursor of :meth:`create_next_canonical_view`."""
        self.base: torch.Tensor | None = as_tensor(pool, torch.int8)
        """The whole pool as int8 (vLLM's ``_base``); ``None`` after :meth:`cleanup`."""
        self.views: list[torch.Tensor] = []
        """The views handed out so far."""

    @property
    def is_pinned(self) -> bool:
        """Whether the pool is pinned for the GPU (no ``cudaHostRegister`` needed)."""
        return bool(self.pool.pinned)

    def _strided(self, offset: int, tensor_page_size: int) -> torch.Tensor:
        if self.base is None:
            raise ValueError("the region was cleaned up")
        view = torch.as_strided(
            self.base,
            size=(self.num_blocks, tensor_page_size),
            stride=(self.row_stride, 1),
            storage_offset=offset,
        )
        self.views.append(view)
        return view

    def create_next_worker_view(self, tensor_page_size: int) -> torch.Tensor:
        """The next ``tensor_page_size`` bytes of this worker's slot in every row.

        Returns an int8 ``(num_blocks, tensor_page_size)`` tensor, stride
        ``(row_stride, 1)``, whose ``data_ptr()`` is ``pool.addr +
        worker_offset``; the cursor then advances by ``tensor_page_size``.
        Raises :class:`hostpool.CapacityError` without moving the cursor when the
        slot has less room left, ``ValueError`` on a scheduler-side region.
        """
        if self.rank is None:
            raise ValueError("a region with rank=None has no worker slot")
        tensor_page_size = operator.index(tensor_page_size)
        if tensor_page_size <= 0:
            raise ValueError(f"tensor_page_size must be positive, got {tensor_page_size}")
        new_offset = self.worker_offset + tensor_page_size
        if new_offset > self.worker_area_end:
            raise hostpool.CapacityError(
                f"Worker offset {new_offset} exceeds worker area end "
                f"{self.worker_area_end} (overflowed by "
                f"{new_offset - self.worker_area_end} bytes)"
            )
        view = self._strided(self.worker_offset, tensor_page_size)
        self.worker_offset = new_offset
        return view

    create_next_view = create_next_worker_view

    def create_next_canonical_view(self, tensor_page_size: int) -> torch.Tensor:
        """The next ``tensor_page_size`` bytes of every row, the same for all workers.

        vLLM's canonical layout (one copy of KV replicated across workers, e.g.
        the MLA latent): views are carved from the start of each row and may
        use the whole ``row_stride``. Use either this or
        :meth:`create_next_worker_view` on one pool, not both. Raises
        :class:`hostpool.CapacityError` without moving the cursor on overflow.
        """
        tensor_page_size = operator.index(tensor_page_size)
        if tensor_page_size <= 0:
            raise ValueError(f"tensor_page_size must be positive, got {tensor_page_size}")
        new_offset = self.canonical_offset + tensor_page_size
        if new_offset > self.row_stride:
            raise hostpool.CapacityError(
                f"Canonical offset {new_offset} exceeds row stride {self.row_stride} "
                f"(overflowed by {new_offset - self.row_stride} bytes)"
            )
        view = self._strided(self.canonical_offset, tensor_page_size)
        self.canonical_offset = new_offset
        return view

    def create_kv_memoryview(self) -> memoryview:
        """A zero-copy ``(num_blocks, row_stride)`` byte memoryview of the region.

        Secondary tiers address block ``b`` as ``view[b]``, as with vLLM.
        """
        return self.pool.view(0, self.total_size_bytes).cast(
            "B", (self.num_blocks, self.row_stride)
        )

    def cleanup(self) -> None:
        """Drop the base tensor and the views this region holds.

        After this (and once the caller's own references are gone) the pool
        can be closed. The pool itself is left open: its owner closes it.
        """
        self.views.clear()
        self.base = None
