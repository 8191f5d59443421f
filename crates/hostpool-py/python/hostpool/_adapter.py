"""The one mechanism every engine adapter installs its hooks with.

An :class:`Adapter` is one engine's hooks into hostpool (vLLM's pin guard,
SGLang's host buffer allocator, LMCache's CPU allocator, their Mooncake
registration methods). It gives each adapter the same four things:

* :meth:`Adapter.install` (idempotent: installing twice is installing once)
  and :meth:`Adapter.uninstall`, which puts back every object a hook
  replaced, exactly (the same object, or no attribute of its own where there
  was none, as for a method a class inherited). A hook is one
  :meth:`Adapter.patch` of an attribute or a mapping's item; nothing is
  patched when a module is imported;
* the pools its hooks made (:meth:`Adapter.track`), and the one lookup of
  the pool holding an address range (:meth:`Adapter.pool_of`);
* the ledger of Mooncake registrations of those pools, one per pool and
  Mooncake object (:meth:`Adapter.register`, :meth:`Adapter.registrations`,
  :meth:`Adapter.end_registrations`);
* the route of hostpool's log records to the engine's own handlers
  (:func:`route_logs`, from :meth:`Adapter.install`): a library's loggers sit under a
  ``NullHandler``, and an engine configures only its own logger, so inside
  an engine hostpool's records go where the engine's go, at its level.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import hostpool

__all__ = ["Adapter", "Patch"]

_MISSING: Any = object()


@dataclass
class Patch:
    """One object replaced: ``owner``'s attribute (or, for a mapping, item) ``name``."""

    owner: Any
    name: Any
    original: Any
    """What was there (:data:`_MISSING`: nothing of the owner's own)."""
    new: Any
    item: bool = False

    def current(self) -> Any:
        if self.item:
            return self.owner.get(self.name, _MISSING)
        return vars(self.owner).get(self.name, _MISSING)

    def apply(self) -> None:
        if self.item:
            self.owner[self.name] = self.new
        else:
            setattr(self.owner, self.name, self.new)

    def restore(self) -> bool:
        """Put the original back if the hook is still there; whether it was."""
        if self.current() is not self.new:
            return False
        if self.original is _MISSING:
            if self.item:
                del self.owner[self.name]
            else:
                delattr(self.owner, self.name)
        elif self.item:
            self.owner[self.name] = self.original
        else:
            setattr(self.owner, self.name, self.original)
        return True


@dataclass
class _Cache:
    """A mapping that may cache ``new`` under keys it had no entry for (as a
    ``defaultdict`` does on first lookup): those entries go at uninstall."""

    owner: MutableMapping[Any, Any]
    new: Any
    name: str = "cached entries"

    def restore(self) -> bool:
        for key in [k for k, v in list(self.owner.items()) if v is self.new]:
            del self.owner[key]
        return True


class _ToEngine(logging.Handler):
    """Hands hostpool's records to an engine logger's handlers."""

    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        # Logger.handle: the target's filters and handlers (and theirs
        # upwards while it propagates), never its level: hostpool's logger
        # has the engine's level already.
        self.target.handle(record)


_route_lock = threading.Lock()
_route: dict[str, Any] = {}


class Adapter:
    """One engine's hooks; subclasses give :meth:`hooks` (and may add state)."""

    engine: str = ""
    """The engine's name (``"vllm"``, ``"sglang"``, ``"lmcache"``)."""
    log_target: str | None = None
    """The engine's logger whose handlers hostpool's records go to (``None``: none)."""
    names: Any = None
    """The engine's module of non-public names (``hostpool._engines.<engine>``), whose
    ``check()`` runs before any hook is put in place (``None``: checked elsewhere, as
    vLLM's are where vLLM builds hostpool's spec)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._patches: list[Patch | _Cache] = []
        self._installed = False
        self._pools: weakref.WeakValueDictionary[int, hostpool.Pool] = weakref.WeakValueDictionary()
        # (pool address, id(Mooncake object)) -> Registration (which holds both).
        self._registrations: dict[tuple[int, int], Any] = {}
        self.config: dict[str, Any] | None = None
        """The pool config the hooks build with (``None``: defaults)."""
        self.error: hostpool.Error | None = None
        """A config error the hooks raise at their first use (a plug-in never raises)."""

    # --- install / uninstall ---------------------------------------------------

    @property
    def installed(self) -> bool:
        """Whether :meth:`install` is in effect."""
        return self._installed

    def install(self, config: dict[str, Any] | None = None, error: hostpool.Error | None = None) -> None:
        """Set the config and put the hooks in place (again: only what is not in place).

        Raises :class:`hostpool.EngineVersionError`, with nothing patched, when the
        installed engine lacks a name the hooks need."""
        if self.names is not None:
            self.names.check()
        with self._lock:
            self.config, self.error = config, error
            self.hooks()
            self._installed = True
        if self.log_target is not None:
            route_logs(self.log_target)

    def hooks(self) -> None:
        """Put this engine's hooks in place with :meth:`patch` (idempotent)."""

    def patch(self, owner: Any, name: str, new: Any) -> None:
        """Replace ``owner.name`` (an attribute of a module, class or object) with ``new``.

        A second call for the same attribute while ``new`` is there does nothing.
        """
        with self._lock:
            original = vars(owner).get(name, _MISSING)
            if original is new:
                return
            p = Patch(owner, name, original, new)
            p.apply()
            self._patches.append(p)

    def patch_item(self, mapping: MutableMapping[Any, Any], key: Any, new: Any) -> None:
        """Replace ``mapping[key]`` with ``new`` (idempotent as :meth:`patch`)."""
        with self._lock:
            original = mapping.get(key, _MISSING)
            if original is new:
                return
            p = Patch(mapping, key, original, new, item=True)
            p.apply()
            self._patches.append(p)

    def patch_cache(self, mapping: MutableMapping[Any, Any], new: Any) -> None:
        """``mapping`` may come to hold ``new`` under keys of its own making while
        installed (a ``defaultdict`` caching a function on first lookup): uninstall
        removes those entries, as they were absent. Call it before :meth:`patch_item`
        of the same mapping (uninstall restores newest first)."""
        with self._lock:
            if any(isinstance(p, _Cache) and p.owner is mapping and p.new is new for p in self._patches):
                return
            self._patches.append(_Cache(mapping, new))  # type: ignore[arg-type]

    def original(self, owner: Any, name: str) -> Any:
        """What :meth:`patch` replaced at ``owner.name`` (``AttributeError`` if it did not)."""
        with self._lock:
            for p in reversed(self._patches):
                if isinstance(p, Patch) and p.owner is owner and p.name == name and not p.item:
                    if p.original is _MISSING:
                        # Inherited: the attribute as the owner's bases give it.
                        for base in getattr(owner, "__mro__", ())[1:]:
                            if name in vars(base):
                                return vars(base)[name]
                        raise AttributeError(name)
                    return p.original
        raise AttributeError(f"{self.engine} adapter did not replace {name}")

    def theirs(self, owner: Any, name: str) -> Any:
        """The engine's own object at ``owner.name``, for a hook to call: what the hook
        replaced while installed, the attribute itself once uninstalled (a caller may
        still hold the hook after :meth:`uninstall`)."""
        try:
            return self.original(owner, name)
        except AttributeError:
            return getattr(owner, name)

    def uninstall(self) -> None:
        """Put back every object the hooks replaced, newest first (pools already made
        stay until their owner drops them)."""
        with self._lock:
            patches, self._patches = self._patches, []
            self._installed = False
            for p in reversed(patches):
                if not p.restore():
                    logging.getLogger("hostpool").debug(
                        "%s adapter: %r was replaced again since; left as it is", self.engine, p.name
                    )
        if self.log_target is not None:
            unroute_logs(self.log_target)

    def current(self) -> Adapter:
        """This adapter, installed; else the config error to raise, or ``RuntimeError``."""
        if not self._installed:
            raise RuntimeError(f"hostpool's {self.engine} adapter is not installed")
        if self.error is not None:
            raise self.error
        return self

    # --- pools -------------------------------------------------------------------

    def track(self, pool: hostpool.Pool) -> None:
        """A pool the hooks made: :meth:`pool_of` finds it while it lives."""
        self._pools[pool.addr] = pool

    def pools(self) -> dict[int, hostpool.Pool]:
        """The live pools the hooks made, by address."""
        return dict(self._pools.items())

    def pool_of(self, ptr: int, nbytes: int) -> hostpool.Pool | None:
        """The live pool made here that holds ``[ptr, ptr + nbytes)``, or ``None``."""
        for pool in list(self._pools.values()):
            if not pool.closed and pool.addr <= ptr and ptr + nbytes <= pool.addr + pool.mapped_bytes:
                return pool
        return None

    # --- Mooncake registrations ------------------------------------------------------

    def register(self, pool: hostpool.Pool, target: Any) -> tuple[Any, bool]:
        """``pool`` registered with the Mooncake object ``target``, once: the live
        registration and ``False`` when there is one, else a new one and ``True``."""
        import hostpool.mooncake

        with self._lock:
            key = (pool.addr, id(target))
            reg = self._registrations.get(key)
            if reg is not None and reg.registered and reg.engine is target and reg.pool is pool:
                return reg, False
            reg = hostpool.mooncake.register(pool, target)
            self._registrations[key] = reg
            return reg, True

    def registrations(self) -> dict[int, list[Any]]:
        """The live registrations, by pool address."""
        with self._lock:
            current = list(self._registrations.items())
        out: dict[int, list[Any]] = {}
        for (addr, _), reg in current:
            if reg.registered:
                out.setdefault(addr, []).append(reg)
        return out

    def end_registrations(self, *, addr: int | None = None, target: Any = None) -> list[Any]:
        """Take the registrations of the pool at ``addr`` and/or with ``target`` off the
        ledger, and return them (the caller ends them, outside any lock)."""
        with self._lock:
            keys = [
                k
                for k, reg in self._registrations.items()
                if (addr is None or k[0] == addr) and (target is None or reg.engine is target)
            ]
            return [self._registrations.pop(k) for k in keys]


def route_logs(target: str) -> None:
    """Send the ``hostpool`` logger's records to the handlers of logger ``target``, at its
    level, when that logger has handlers of its own (the engine configured it); the
    first engine's route stays. Nothing otherwise: the records propagate as before."""
    engine_logger = logging.getLogger(target)
    if not engine_logger.handlers:
        return
    ours = logging.getLogger("hostpool")
    with _route_lock:
        if _route:
            return
        handler = _ToEngine(engine_logger)
        _route.update(
            target=target, handler=handler, level=ours.level, propagate=ours.propagate
        )
        ours.addHandler(handler)
        if ours.level == logging.NOTSET:
            ours.setLevel(engine_logger.getEffectiveLevel())
        # The engine's handlers print them: not the root's again.
        ours.propagate = False


def unroute_logs(target: str) -> None:
    """Undo :func:`route_logs` for ``target``."""
    ours = logging.getLogger("hostpool")
    with _route_lock:
        if _route.get("target") != target:
            return
        ours.removeHandler(_route["handler"])
        ours.setLevel(_route["level"])
        ours.propagate = _route["propagate"]
        _route.clear()

