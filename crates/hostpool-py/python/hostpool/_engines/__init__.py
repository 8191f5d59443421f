"""What hostpool knows of the serving engines it plugs into: the versions its test
suite runs against (:data:`TESTED`), and, one module per engine
(:mod:`hostpool._engines.vllm`, ...), the engine's names that are not public API.

An engine module lists every private name the adapter reaches, checks them
when the adapter is loaded, and raises one :class:`hostpool.EngineVersionError`
naming the engine version found, the names missing and the versions tested,
where the engine first builds hostpool's objects (never an ``AttributeError``
in a worker later). The adapters reach those names only through it.

:data:`TESTED` is the one place the tested versions are written: the test
suite checks the engines' pinned environments against it, ``docs/engines.md``'s
table says the same, and ``hostpool doctor`` (run as ``python -m hostpool
doctor``) reads it to say whether an installed engine was tested.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from typing import Any

__all__ = ["TESTED", "DISTRIBUTIONS", "installed", "is_tested", "require"]

TESTED: dict[str, tuple[str, ...]] = {
    "vllm": ("0.34.0", "0.33.0"),
    "sglang": ("0.5.23",),
    "lmcache": ("0.5.6",),
    "mooncake": ("0.3.13.post1",),
}
"""Engine -> the releases the test suite runs against, newest first."""

DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "lmcache": ("lmcache",),
    "mooncake": ("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda"),
}
"""Engine -> the distributions (PyPI names) that install it."""


def installed(engine: str) -> str | None:
    """The installed version of ``engine`` (from its distribution's metadata), or ``None``."""
    for dist in DISTRIBUTIONS[engine]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def is_tested(engine: str, version: str | None) -> bool:
    """Whether ``version`` of ``engine`` is one the test suite runs against."""
    return version is not None and version.split("+")[0] in TESTED.get(engine, ())


def require(engine: str, version: str | None, missing: Iterable[str]) -> None:
    """Raise :class:`hostpool.EngineVersionError` when any of ``missing`` is missing."""
    missing = sorted(set(missing))
    if missing:
        from hostpool._errors import EngineVersionError

        raise EngineVersionError(engine, version, missing, TESTED.get(engine, ()))


def lookup(root: Any, dotted: str) -> Any:
    """``root.a.b`` for ``"a.b"``; ``AttributeError`` naming the first part missing."""
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
