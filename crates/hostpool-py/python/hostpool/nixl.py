"""A hostpool pool registered with an engine's own NIXL agent.

vLLM, SGLang and Dynamo own their NIXL agents (``nixl_agent`` of the
``nixl_cu12`` / ``nixl_cu13`` package). :func:`register` registers a pool with
such an agent in one call, split the way hostpool's ``nixl`` registrar splits
it (:meth:`hostpool.Pool.nixl_descs`), all or nothing::

    from nixl_cu12 import nixl_agent
    agent = nixl_agent("decode-0")
    with hostpool.Pool(size="64GiB", pin="cuda") as pool:
        reg = hostpool.nixl.register(agent, pool)   # pool.close() now waits for reg
        ...                                         # transfers as usual
        reg.deregister()

For hostpool's own registrar (``Pool(..., register=("nixl",))``) in the same
process, :func:`use_engine_library` points it at the C API of the NIXL
package the engine imported: two NIXL copies of different versions in one
process bind by soname to whichever loaded first.
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import hostpool

__all__ = ["Registration", "engine_library", "register", "use_engine_library"]


class Registration:
    """A pool registered with an engine's agent; :meth:`deregister` ends it.

    While it lives it holds an export of the pool (NIXL and its peers read
    and write the memory), so ``pool.close()`` raises ``PoolBusyError``.
    """

    def __init__(self, agent: Any, pool: hostpool.Pool, regions: list[Any], descs: list[tuple[int, int, int]], view: memoryview) -> None:
        """Made by :func:`register`."""
        self.agent = agent
        """The engine's ``nixl_agent``."""
        self.pool = pool
        """The pool registered."""
        self.descs = descs
        """``(addr, len, dev_id)`` of each region registered."""
        self._regions = regions
        self._view: memoryview | None = view

    @property
    def registered(self) -> bool:
        """Whether the pool is still registered."""
        return self._view is not None

    def deregister(self) -> None:
        """Deregister every region, last first; idempotent."""
        if self._view is None:
            return
        errors = []
        for reg in reversed(self._regions):
            try:
                self.agent.deregister_memory(reg)
            except Exception as e:  # keep going: give back as much as possible
                errors.append(e)
        self._regions = []
        self._view.release()
        self._view = None
        if errors:
            raise hostpool.Error(f"deregistering the pool from NIXL: {errors[0]}") from errors[0]

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.deregister()


def register(agent: Any, pool: hostpool.Pool, *, dev_id: int = 0, max_region: int | str | None = None) -> Registration:
    """Register ``pool`` with the engine's NIXL ``agent`` as DRAM regions.

    The regions are ``pool.nixl_descs(dev_id, max_region)``, one
    ``register_memory`` call each; when one fails, those before it are
    deregistered last first and ``hostpool.Error`` names the region.
    """
    descs = pool.nixl_descs(dev_id, max_region)
    view = memoryview(pool)
    done: list[Any] = []
    for i, (addr, length, dev) in enumerate(descs):
        try:
            done.append(agent.register_memory([(addr, length, dev, "")], "DRAM"))
        except Exception as e:
            for reg in reversed(done):
                agent.deregister_memory(reg)
            view.release()
            raise hostpool.Error(
                f"registering region {i} of {len(descs)} ({length} bytes at {addr:#x}) with NIXL failed: {e}; "
                f"the {len(done)} region(s) before it were deregistered in reverse"
            ) from e
    return Registration(agent, pool, done, descs, view)


def engine_library() -> pathlib.Path | None:
    """``libnixl_capi.so`` of the NIXL package this process imported (``nixl_cu12`` or ``nixl_cu13``)."""
    for name in ("nixl_cu12", "nixl_cu13"):
        module = sys.modules.get(name)
        if module is None or not getattr(module, "__file__", None):
            continue
        root = pathlib.Path(module.__file__).resolve().parent.parent
        lib = root / f".{name}.mesonpy.libs" / "libnixl_capi.so"
        if lib.exists():
            return lib
    return None


def use_engine_library() -> pathlib.Path | None:
    """Point hostpool's ``nixl`` registrar (``HOSTPOOL_NIXL_LIB``) at :func:`engine_library`, unless set."""
    lib = engine_library()
    if lib is not None:
        os.environ.setdefault("HOSTPOOL_NIXL_LIB", str(lib))
    return lib
