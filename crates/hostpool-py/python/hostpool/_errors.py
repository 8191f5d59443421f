"""The exceptions hostpool raises. Each carries the same message as the CLI's error.

The classes are made by the compiled extension (``hostpool._hostpool``), which
raises them; they are re-exported here and from :mod:`hostpool`. Their
``__module__`` is ``"hostpool"``:

- ``Error(RuntimeError)``: the base of every hostpool error; ``exit_code`` is
  what the ``hostpool`` CLI exits with for the same failure (2 for bad input,
  1 for a runtime failure, 128 + N for signal N);
- ``ConfigError(Error, ValueError)``: the configuration is wrong;
- ``CapacityError(Error)``: the node cannot hold the pool (``remedy``,
  ``need``, ``free``);
- ``PeerError(Error)``: a peer rank of a shared pool failed, died, stopped or
  never attached (``rank``, ``ranks``, ``pid``);
- ``NotAvailableError(Error)``: something this host lacks;
- ``PinError(Error)``: pinning failed (and was required);
- ``PoolBusyError(Error, BufferError)``: ``close()`` while exports are alive;
- ``KeeperError(Error)``: the pool's keeper (``keeper="NAME"``) does not answer,
  refused the lease, or went away during it (``keeper``, ``pid``, ``absent``).
"""

from __future__ import annotations

from ._hostpool import (
    CapacityError,
    ConfigError,
    Error,
    KeeperError,
    NotAvailableError,
    PeerError,
    PinError,
    PoolBusyError,
)

__all__ = [
    "CapacityError",
    "ConfigError",
    "Error",
    "KeeperError",
    "NotAvailableError",
    "PeerError",
    "PinError",
    "PoolBusyError",
]
