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
- ``KeeperError(Error)``: the pool's keeper (``keeper="NAME"``, or a ``[lease]`` table) does not answer,
  refused the lease, or went away during it (``keeper``, ``pid``, ``absent``);
- ``EngineVersionError(Error)``: the installed serving engine lacks names
  hostpool's adapter for it reaches (``engine``, ``version``, ``missing``,
  ``tested``); raised where the engine first builds hostpool's objects. Unlike
  the others it is made here, in Python: no Rust code raises it.
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
    "EngineVersionError",
    "Error",
    "KeeperError",
    "NotAvailableError",
    "PeerError",
    "PinError",
    "PoolBusyError",
]


class EngineVersionError(Error):
    """The installed engine lacks names hostpool's adapter for it needs.

    Engines change their internals from release to release; hostpool reaches
    an engine's non-public names only through one module per engine
    (``hostpool._engines.<engine>``), which checks them all where the adapter
    is first used and raises this, once, instead of an ``AttributeError`` in a
    worker later.
    """

    engine: str
    """The engine (``"vllm"``, ``"sglang"``, ``"lmcache"``)."""
    version: str | None
    """The engine's installed version (``None`` when unknown)."""
    missing: tuple[str, ...]
    """The dotted names not found, e.g. ``"vllm.v1.kv_offload.cpu.spec.CPUOffloadingSpec"``."""
    tested: tuple[str, ...]
    """The versions hostpool was tested with, newest first."""

    def __init__(self, engine: str, version: str | None, missing: list[str], tested: tuple[str, ...]) -> None:
        self.engine = engine
        self.version = version
        self.missing = tuple(missing)
        self.tested = tuple(tested)
        found = f"{engine} {version}" if version else f"this {engine} (version unknown)"
        tested_text = ", ".join(tested) if tested else "none"
        super().__init__(
            f"{found} lacks what hostpool's {engine} adapter uses: {', '.join(self.missing)}. "
            f"hostpool was tested with {engine} {tested_text}: install one of those "
            f"(pip install {engine}=={tested[0] if tested else 'VERSION'}), or a hostpool release "
            f"that supports {engine} {version or 'this version'}"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.engine, self.version, list(self.missing), self.tested))
