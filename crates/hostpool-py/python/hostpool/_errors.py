"""The exceptions hostpool raises. Each carries the same message as the CLI's error."""

from __future__ import annotations


class Error(RuntimeError):
    """Base of every hostpool error.

    ``exit_code`` is what the ``hostpool`` CLI exits with for the same failure:
    2 for bad input, 1 for a runtime failure, 128 + N for signal N.
    """

    exit_code: int = 1


class ConfigError(Error, ValueError):
    """The configuration is wrong (a bad size, key, plugin name or combination)."""

    exit_code = 2


class CapacityError(Error):
    """The node cannot hold the pool; ``remedy`` says how to make room."""

    remedy: str = ""
    need: int = 0
    free: int = 0


class PeerError(Error):
    """A peer rank of a shared pool failed, died, stopped or never attached.

    ``ranks`` are the ranks the message blames, in the order it names them
    (the rank that failed or died, every rank that never attached, or this
    rank when its own setup failed); ``rank`` is the first of them, or
    ``None`` when it names the peer only by pid, as a joiner does for a
    creator that never welcomed it. ``pid`` is the process id of the first
    peer blamed, or ``None`` when it is not known (a rank that never
    attached).
    """

    rank: int | None = None
    ranks: tuple[int, ...] = ()
    pid: int | None = None


class NotAvailableError(Error):
    """Something this host lacks: no GPU driver, no device, no huge pages of that size."""


class PinError(Error):
    """Pinning the pool failed (and was required); nothing stays pinned."""


class PoolBusyError(Error, BufferError):
    """``close()`` while buffers, arrays or tensors exported from the pool are alive.

    The pool is left intact: delete the exports (``del tensor``), then close again.
    """
