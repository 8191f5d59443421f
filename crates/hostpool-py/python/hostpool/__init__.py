"""hostpool: large host-memory pools for GPU KV-cache offload, from Python.

Build a pool (private, or shared between the tensor-parallel ranks of one
engine), prefault it in parallel, pin it for the GPU, and hand it to numpy
and torch with zero copies::

    import hostpool, torch
    with hostpool.Pool(size="64GiB", pin="cuda") as pool:
        kv = torch.frombuffer(pool, dtype=torch.uint8)   # pool's own memory
        ...

Logging goes to the ``hostpool`` logger of :mod:`logging`.
"""

from __future__ import annotations

import logging

from ._errors import (
    CapacityError,
    ConfigError,
    Error,
    NotAvailableError,
    PeerError,
    PinError,
    PoolBusyError,
)
from ._hostpool import Pool, Shared, __version__, plugins

# A library adds no handler of its own: the application configures logging
# (without one, Python prints warnings and errors to stderr).
logging.getLogger("hostpool").addHandler(logging.NullHandler())

__all__ = [
    "CapacityError",
    "ConfigError",
    "Error",
    "NotAvailableError",
    "PeerError",
    "PinError",
    "Pool",
    "PoolBusyError",
    "Shared",
    "__version__",
    "plugins",
]
