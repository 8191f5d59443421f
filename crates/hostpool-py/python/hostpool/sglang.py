"""An SGLang HiCache host tensor allocator over one :class:`hostpool.Pool`.

SGLang builds its host KV pool with ``alloc_with_host_register(dims, dtype,
device, pin_memory, allocator)``, which calls ``allocator.allocate(dims, dtype,
device)`` and then ``cudaHostRegister``s the result when ``pin_memory`` is
true. :class:`HostPoolAllocator` has the same ``allocate`` method as SGLang's
``HostTensorAllocator`` and carves its tensors from one pool, already
prefaulted and (with ``pin="cuda"``) pinned; pass
``pin_memory=not allocator.is_pinned`` so SGLang does not register the memory
a second time (``cudaHostRegister`` on a registered range fails).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

import hostpool
from hostpool.torch import as_tensor

__all__ = ["HostPoolAllocator", "DEFAULT_ALIGNMENT"]

DEFAULT_ALIGNMENT: int = 2 << 20
"""Alignment when the pool has no block size: 2 MiB (or the page size if larger)."""

class HostPoolAllocator:
    """SGLang ``HostTensorAllocator`` carving aligned tensors from one pool.

    ``HostPoolAllocator(pool)`` uses a pool the caller owns;
    ``HostPoolAllocator(size="64GiB", pin="cuda", ...)`` builds one from
    :class:`hostpool.Pool` keyword arguments and closes it in :meth:`close`.

    Every tensor starts at an address that is a multiple of :attr:`alignment`:
    ``alignment`` if given, else the pool's :attr:`~hostpool.Pool.block_size`,
    else the larger of 2 MiB (one huge page) and the pool's page size.

    Tensors never overlap and are not freed one by one (SGLang allocates its
    host pool once); :meth:`close` ends them all. Out of room, :meth:`allocate`
    raises :class:`hostpool.CapacityError` and allocates nothing.
    """

    def __init__(
        self,
        pool: hostpool.Pool | None = None,
        *,
        alignment: int | None = None,
        **pool_kwargs: Any,
    ) -> None:
        """Use ``pool``, or build one from ``pool_kwargs`` (then owned and closed here)."""
        if pool is not None and pool_kwargs:
            raise ValueError("pass either a pool or Pool keyword arguments, not both")
        if alignment is not None and alignment <= 0:
            raise ValueError(f"alignment must be positive, got {alignment}")
        self._owns_pool = pool is None
        self.pool: hostpool.Pool = hostpool.Pool(**pool_kwargs) if pool is None else pool
        """The pool the tensors live in."""
        self.alignment: int = alignment or self.pool.block_size or max(DEFAULT_ALIGNMENT, self.pool.page_size)
        """Every tensor's ``data_ptr()`` is a multiple of this."""
        self.dtype: torch.dtype | None = None
        """dtype of the last allocation (as SGLang's ``HostTensorAllocator``)."""
        self.dims: tuple[int, ...] | None = None
        """dims of the last allocation (as SGLang's ``HostTensorAllocator``)."""
        self.allocated_bytes: int = 0
        """Offset of the first free byte (aligned tensors plus padding)."""
        self._base: torch.Tensor | None = as_tensor(self.pool, torch.uint8)
        self._lock = threading.Lock()

    @property
    def is_pinned(self) -> bool:
        """True when the pool is pinned for the GPU: SGLang must skip ``cudaHostRegister``."""
        return bool(self.pool.pinned)

    @property
    def free_bytes(self) -> int:
        """Bytes after the last allocation (an aligned tensor may get fewer)."""
        return self.pool.nbytes - self.allocated_bytes

    def allocate(
        self, dims: tuple[int, ...], dtype: torch.dtype, device: str = "cpu"
    ) -> torch.Tensor:
        """A ``dims``-shaped ``dtype`` tensor in the pool, zero copy and aligned.

        ``data_ptr()`` is a multiple of :attr:`alignment` and lies inside the pool.
        Raises ``ValueError`` for a device other than CPU or a negative dim,
        ``TypeError`` for a ``dtype`` that is not a ``torch.dtype``, and
        :class:`hostpool.CapacityError`, allocating nothing, when it does not fit.
        """
        if torch.device(device).type != "cpu":
            raise ValueError(f"HostPoolAllocator allocates host memory; got device={device!r}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype such as torch.float16, not {dtype!r}")
        dims = tuple(int(d) for d in dims)
        if any(d < 0 for d in dims):
            # torch's view() would read -1 as "the rest", handing out the
            # whole pool while the cursor moved backwards.
            raise ValueError(f"dims {dims} must be 0 or more each")
        nbytes = math.prod(dims) * dtype.itemsize
        with self._lock:
            if self._base is None:
                raise ValueError("the allocator is closed")
            addr = self.pool.addr
            align = math.lcm(self.alignment, dtype.itemsize)
            start = -(-(addr + self.allocated_bytes) // align) * align - addr
            end = start + nbytes
            if end > self.pool.nbytes:
                raise hostpool.CapacityError(
                    f"allocating {dims} {dtype} needs {nbytes} bytes at offset {start} "
                    f"(aligned to {align}), but the pool has {self.pool.nbytes} "
                    f"bytes of which {self.allocated_bytes} are allocated"
                )
            tensor = self._base[start:end].view(dtype).view(dims)
            self.allocated_bytes = end
            self.dtype = dtype
            self.dims = dims
            return tensor

    def close(self) -> list[str]:
        """Drop the allocator's own tensor and close the pool if this allocator built it.

        Returns the pool's teardown issues (empty when clean, or when the pool
        is the caller's). The tensors handed out must be gone first, else
        :class:`hostpool.PoolBusyError`.
        """
        self._base = None
        return self.pool.close() if self._owns_pool else []

    def __enter__(self) -> HostPoolAllocator:
        """The allocator itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """:meth:`close`."""
        self.close()
