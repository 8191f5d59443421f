"""Torch views of a :class:`hostpool.Pool`, with no copies.

* :func:`as_tensor` -- the whole pool as one 1-D tensor.
* :class:`HostPoolRegion` -- a drop-in for vLLM's ``SharedOffloadRegion``
  (``vllm/v1/kv_offload/cpu/shared_offload_region.py``): the same constructor
  and the same views, over a hostpool pool instead of ``/dev/shm`` files.
  It is vLLM's region, and :mod:`hostpool.vllm` is its home and plugs it into
  vLLM; this old import path keeps working (without vLLM installed).
* :class:`OffloadRegion` -- the older name: vLLM's views over a pool you own.

Importing this module imports torch; ``import hostpool`` alone does not. It
imports no module of the package that imports it.
"""

from __future__ import annotations

from hostpool._tensor import as_tensor
from hostpool._vllm_region import (  # noqa: F401  (the old paths of what was defined here)
    HostPoolRegion,
    NoWorkerSlotError,
    OffloadRegion,
    RegionFullError,
    pool_name,
)

__all__ = ["as_tensor", "HostPoolRegion", "OffloadRegion", "RegionFullError"]
