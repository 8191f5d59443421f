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

import importlib
import importlib.metadata
from collections.abc import Iterable
from typing import Any

__all__ = [
    "TESTED",
    "DISTRIBUTIONS",
    "absent",
    "check",
    "installed",
    "is_tested",
    "present",
    "require",
    "resolve",
    "version_of",
]

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
    """Raise :class:`hostpool.EngineVersionError` when any of ``missing`` is missing
    (``ImportError`` when the engine is not installed at all)."""
    missing = sorted(set(missing))
    if missing and version is None:
        importlib.import_module(engine)  # not installed at all: its ImportError says so
    if missing:
        from hostpool._errors import EngineVersionError

        raise EngineVersionError(engine, version, missing, TESTED.get(engine, ()))


def check(engine: str, required: Iterable[str]) -> None:
    """Raise :class:`hostpool.EngineVersionError` naming every name of ``required``
    the installed ``engine`` lacks (``ImportError`` when it is not installed)."""
    require(engine, version_of(engine), absent(required))


def version_of(engine: str) -> str | None:
    """The engine's version as its top module says it (``__version__``), else its
    distribution's; ``None`` when neither is there."""
    try:
        module = importlib.import_module(engine)
        version = getattr(module, "__version__", None)
    except Exception:  # noqa: BLE001 - a broken install: the metadata's
        version = None
    return str(version) if version else installed(engine)


_INSTANCE = object()
"""What :func:`resolve` returns for a member an instance gets in ``__init__``."""


def resolve(dotted: str) -> Any:
    """The object at ``dotted``: the longest importable module, then attributes; the
    last may be a member the class's ``__init__`` (or a base's) assigns. ``LookupError``
    when there is none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        for i, part in enumerate(rest):
            if hasattr(obj, part):
                obj = getattr(obj, part)
            elif i == len(rest) - 1 and isinstance(obj, type) and _assigned(obj, part):
                return _INSTANCE
            else:
                raise LookupError(dotted)
        return obj
    raise LookupError(dotted)


def _assigned(cls: type, name: str) -> bool:
    """Whether ``__init__`` of ``cls`` or of a base names ``self.<name>``."""
    for klass in cls.__mro__:
        code = getattr(vars(klass).get("__init__"), "__code__", None)
        if code is not None and name in code.co_names:
            return True
    return False


def present(dotted: str) -> bool:
    """Whether :func:`resolve` finds ``dotted``."""
    try:
        resolve(dotted)
    except LookupError:
        return False
    return True


def absent(names: Iterable[str]) -> list[str]:
    """The ``names`` :func:`resolve` does not find, in order."""
    return [n for n in names if not present(n)]
