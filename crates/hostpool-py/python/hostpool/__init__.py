"""hostpool: large host-memory pools for GPU KV-cache offload, from Python.

Build a pool (private, or shared between the tensor-parallel ranks of one
engine), prefault it in parallel, pin it for the GPU, and hand it to numpy
and torch with zero copies::

    import hostpool, hostpool.torch
    with hostpool.Pool(size="64GiB", pin="cuda") as pool:
        kv = hostpool.torch.as_tensor(pool)   # the pool's own memory
        ...
        del kv                                # close() refuses while it lives

`memoryview(pool)`, `numpy.frombuffer(pool)`, `numpy.from_dlpack(pool)` and
`torch.from_dlpack(pool)` hold an export that `close()` waits for (it raises
`PoolBusyError`). `torch.frombuffer(pool)` shares the memory too but lets go
of its export at once: a tensor made that way that outlives `close()` reads
zeros from a placeholder (never memory reused by anything else), and its
writes reach nobody. Prefer `hostpool.torch.as_tensor(pool)` or
`torch.frombuffer(memoryview(pool))`.

Logging goes to the ``hostpool`` logger of :mod:`logging`; inside a serving
engine, the adapter sends those records where the engine's own go (see
:mod:`hostpool._adapter`).
"""

from __future__ import annotations

import logging

from ._errors import (
    CapacityError,
    ConfigError,
    EngineVersionError,
    Error,
    KeeperError,
    NotAvailableError,
    PeerError,
    PinError,
    PoolBusyError,
)
from ._hostpool import KvIndex, Pool, Shared, __version__, check_config, index_bytes, keeper_status, plan, plugins

# A library adds no handler of its own: the application configures logging
# (without one, Python prints warnings and errors to stderr).
logging.getLogger("hostpool").addHandler(logging.NullHandler())

__all__ = [
    "CapacityError",
    "ConfigError",
    "EngineVersionError",
    "Error",
    "KeeperError",
    "KvIndex",
    "NotAvailableError",
    "PeerError",
    "PinError",
    "Pool",
    "PoolBusyError",
    "Shared",
    "__version__",
    "check_config",
    "index_bytes",
    "keeper_status",
    "plan",
    "plugins",
]
