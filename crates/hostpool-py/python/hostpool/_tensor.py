"""The whole pool as one tensor: a leaf that :mod:`hostpool.torch` and the
engine adapters import (it imports torch and nothing of hostpool's but the
package itself)."""

from __future__ import annotations

import torch

import hostpool

__all__ = ["as_tensor"]


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
