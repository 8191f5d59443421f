"""An SGLang HiCache host tensor allocator over one :class:`hostpool.Pool`.

SGLang builds its host KV pool with ``alloc_with_host_register(dims, dtype,
device, pin_memory, allocator)``, which calls ``allocator.allocate(dims, dtype,
device)`` and then ``cudaHostRegister``s the result when ``pin_memory`` is
true. :class:`HostPoolAllocator` has the same ``allocate`` method as SGLang's
``HostTensorAllocator`` and carves its tensors from one pool, already
prefaulted and (with ``pin="cuda"``) pinned; pass
``pin_memory=not allocator.is_pinned`` so SGLang does not register the memory
a second time (``cudaHostRegister`` on a registered range fails).

The wheel's ``sglang.srt.plugins`` entry point ``hostpool``
(:func:`_sglang_plugin`) goes further, from SGLang's own start: when
``HOSTPOOL_SGLANG`` holds a pool config (a TOML or JSON file's path, or the
config inline), :func:`install` makes every HiCache host KV buffer
(``HostKVCache`` and its MHA and MLA subclasses, for each
``--hicache-mem-layout``) a hostpool pool of its own, pinned by hostpool, and
SGLang's own ``cudaHostRegister`` of it is skipped. SGLang's size check
against ``MemAvailable`` (which misses reserved huge pages, SGLang #34972)
sees hostpool's capacity for that backing instead. Without the variable the
entry point does nothing but log one debug line.

With HiCache's ``mooncake`` storage backend (``--hicache-storage-backend
mooncake``), SGLang's ``MooncakeStore`` registers each host KV buffer with
its ``MooncakeDistributedStore`` (``MooncakeBaseStore.register_buffer``).
:func:`install` patches that method too, when SGLang's Mooncake module
imports: a buffer inside one of its pools is registered by
:func:`hostpool.mooncake.register`, once per store and pool, in regions that
never split a page of the layout or a huge page (``[mooncake] max_region``
of the config caps them), and SGLang's own registration is skipped; any
other tensor is SGLang's to register. The registration ends before the pool's
memory goes, when SGLang drops the buffer.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import torch

import hostpool
import hostpool.mooncake
from hostpool._adapter import Adapter
from hostpool._engines import sglang as _names
from hostpool.torch import as_tensor

__all__ = [
    "HostPoolAllocator",
    "DEFAULT_ALIGNMENT",
    "ENV_VAR",
    "install",
    "uninstall",
    "installed",
    "pools",
    "mooncake_registrations",
]

_log = logging.getLogger("hostpool.sglang")

ENV_VAR = "HOSTPOOL_SGLANG"
"""The variable whose pool config makes the SGLang plugin call :func:`install`."""

DEFAULT_ALIGNMENT: int = 2 << 20
"""Alignment when the pool has no block size: 2 MiB (or the page size if larger)."""

class HostPoolAllocator:
    """SGLang ``HostTensorAllocator`` carving aligned tensors from one pool.

    ``HostPoolAllocator(pool)`` uses a pool the caller owns;
    ``HostPoolAllocator(size="64GiB", pin="cuda", ...)`` builds one from
    :class:`hostpool.Pool` keyword arguments and closes it in :meth:`close`.

    Every tensor starts at an address that is a multiple of :attr:`alignment`:
    ``alignment`` if given, else the pool's :attr:`~hostpool.Pool.block_size`,
    else the larger of 2 MiB (one huge page) and the pool's page size.

    Tensors never overlap and are not freed one by one (SGLang allocates its
    host pool once); :meth:`close` ends them all. Out of room, :meth:`allocate`
    raises :class:`hostpool.CapacityError` and allocates nothing.
    """

    def __init__(
        self,
        pool: hostpool.Pool | None = None,
        *,
        alignment: int | None = None,
        **pool_kwargs: Any,
    ) -> None:
        """Use ``pool``, or build one from ``pool_kwargs`` (then owned and closed here)."""
        if pool is not None and pool_kwargs:
            raise ValueError("pass either a pool or Pool keyword arguments, not both")
        if alignment is not None and alignment <= 0:
            raise ValueError(f"alignment must be positive, got {alignment}")
        self._owns_pool = pool is None
        self.pool: hostpool.Pool = hostpool.Pool(**pool_kwargs) if pool is None else pool
        """The pool the tensors live in."""
        self.alignment: int = alignment or self.pool.block_size or max(DEFAULT_ALIGNMENT, self.pool.page_size)
        """Every tensor's ``data_ptr()`` is a multiple of this."""
        self.dtype: torch.dtype | None = None
        """dtype of the last allocation (as SGLang's ``HostTensorAllocator``)."""
        self.dims: tuple[int, ...] | None = None
        """dims of the last allocation (as SGLang's ``HostTensorAllocator``)."""
        self.allocated_bytes: int = 0
        """Offset of the first free byte (aligned tensors plus padding)."""
        self._base: torch.Tensor | None = as_tensor(self.pool, torch.uint8)
        self._lock = threading.Lock()

    @property
    def is_pinned(self) -> bool:
        """True when the pool is pinned for the GPU: SGLang must skip ``cudaHostRegister``."""
        return bool(self.pool.pinned)

    @property
    def free_bytes(self) -> int:
        """Bytes after the last allocation (an aligned tensor may get fewer)."""
        return self.pool.nbytes - self.allocated_bytes

    def allocate(
        self, dims: tuple[int, ...], dtype: torch.dtype, device: str = "cpu"
    ) -> torch.Tensor:
        """A ``dims``-shaped ``dtype`` tensor in the pool, zero copy and aligned.

        ``data_ptr()`` is a multiple of :attr:`alignment` and lies inside the pool.
        Raises ``ValueError`` for a device other than CPU or a negative dim,
        ``TypeError`` for a ``dtype`` that is not a ``torch.dtype``, and
        :class:`hostpool.CapacityError`, allocating nothing, when it does not fit.
        """
        if torch.device(device).type != "cpu":
            raise ValueError(f"HostPoolAllocator allocates host memory; got device={device!r}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype such as torch.float16, not {dtype!r}")
        dims = tuple(int(d) for d in dims)
        if any(d < 0 for d in dims):
            # torch's view() would read -1 as "the rest", handing out the
            # whole pool while the cursor moved backwards.
            raise ValueError(f"dims {dims} must be 0 or more each")
        nbytes = math.prod(dims) * dtype.itemsize
        with self._lock:
            if self._base is None:
                raise ValueError("the allocator is closed")
            addr = self.pool.addr
            align = math.lcm(self.alignment, dtype.itemsize)
            start = -(-(addr + self.allocated_bytes) // align) * align - addr
            end = start + nbytes
            if end > self.pool.nbytes:
                raise hostpool.CapacityError(
                    f"allocating {dims} {dtype} needs {nbytes} bytes at offset {start} "
                    f"(aligned to {align}), but the pool has {self.pool.nbytes} "
                    f"bytes of which {self.allocated_bytes} are allocated"
                )
            tensor = self._base[start:end].view(dtype).view(dims)
            self.allocated_bytes = end
            self.dtype = dtype
            self.dims = dims
            return tensor

    def close(self) -> list[str]:
        """Drop the allocator's own tensor and close the pool if this allocator built it.

        Returns the pool's teardown issues (empty when clean, or when the pool
        is the caller's). The tensors handed out must be gone first, else
        :class:`hostpool.PoolBusyError`.
        """
        self._base = None
        return self.pool.close() if self._owns_pool else []

    def __enter__(self) -> HostPoolAllocator:
        """The allocator itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """:meth:`close`."""
        self.close()


# --------------------------------------------------------------- install()

_COMMON = _names.COMMON
_BASE = _names.BASE
# HiCache's `mooncake` storage backend: MooncakeBaseStore.register_buffer.
_MOONCAKE = _names.MOONCAKE
# SGLang marks a buffer it did not register with an empty list here, so that
# HostKVCache.destroy() does not unregister it (its HIP path does the same).
_REGISTERED_RANGES = "_sglang_cuda_host_registered_ranges"



class SglangAdapter(Adapter):
    """hostpool's hooks into SGLang (see :func:`install`)."""

    engine = "sglang"
    log_target = "sglang"
    names = _names

    def hooks(self) -> None:
        import importlib

        common = importlib.import_module(_COMMON)
        base = importlib.import_module(_BASE)
        mooncake = _mooncake_module()
        self.patch(common, "alloc_with_host_register", _alloc_with_host_register)
        theirs = self.original(common, "alloc_with_host_register")
        # ALLOC_MEMORY_FUNCS is a defaultdict that caches the function per
        # device type on first lookup: replace the cached copies too, and drop
        # the copies of ours it caches while installed.
        self.patch_cache(common.ALLOC_MEMORY_FUNCS, _alloc_with_host_register)
        for key, func in list(common.ALLOC_MEMORY_FUNCS.items()):
            if func is theirs:
                self.patch_item(common.ALLOC_MEMORY_FUNCS, key, _alloc_with_host_register)
        self.patch(base, "available_host_memory_bytes", _available_host_memory_bytes)
        if mooncake is not None:
            self.patch(mooncake.MooncakeBaseStore, "register_buffer", _register_buffer)


ADAPTER = SglangAdapter()
"""The process's SGLang adapter."""


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return ADAPTER.installed


def pools() -> dict[int, hostpool.Pool]:
    """The live pools behind SGLang's host KV buffers, by address.

    A pool lives as long as SGLang's buffer (the tensor holds it); dropping
    the buffer (``HostKVCache.destroy()``) unpins and frees it.
    """
    return ADAPTER.pools()


def mooncake_registrations() -> dict[int, list[Any]]:
    """The :class:`hostpool.mooncake.Registration`\\ s of the live pools, by
    pool address: one per Mooncake store SGLang registered the pool's buffer
    with (see :func:`install`)."""
    return ADAPTER.registrations()


def install(config: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> None:
    """Make SGLang's HiCache host KV buffers hostpool pools, one per buffer.

    ``config`` is the pool config of every buffer (a dict of config keys, a
    TOML or JSON file's path, or inline TOML or JSON; ``None``: defaults).
    SGLang's arguments decide the rest: the size is the buffer's, its
    ``registration_granularity_bytes`` (a page of its layout) is the
    ``block_size`` unless the config has one, and with ``pin_memory`` the
    pool is pinned by hostpool (``cuda``, required unless the config says
    otherwise), in the foreground: SGLang's kernels address the buffer as
    registered memory at once. Raises :class:`hostpool.ConfigError` for a bad
    config, ``ImportError`` without SGLang.

    When SGLang's Mooncake store module imports, its
    ``MooncakeBaseStore.register_buffer`` is patched too: a tensor inside one
    of these pools has the whole pool registered with the store by
    :func:`hostpool.mooncake.register` (once per store and pool: another
    tensor of the same pool is a no-op; a failure raises hostpool's error,
    a ``RuntimeError`` as SGLang's own), unregistered when SGLang drops the
    buffer, before its memory goes. Other tensors go to SGLang's method.
    A store with ``standalone_storage`` (a separate ``mooncake_client``
    process, which maps only Mooncake's own allocations) is refused with
    :class:`hostpool.ConfigError`.
    """
    parsed = None
    if config is not None:
        from hostpool import _engine_config

        parsed = _engine_config.load(config, what="hostpool.sglang.install(config)")
    _install(parsed, None)


def _install(config: dict[str, Any] | None, error: hostpool.Error | None) -> None:
    ADAPTER.install(config, error)


def uninstall() -> None:
    """Restore SGLang's functions, exactly (buffers already made stay until SGLang drops them)."""
    ADAPTER.uninstall()


def _mooncake_module() -> Any:
    """SGLang's Mooncake store module, or ``None`` where it does not import."""
    import importlib

    try:
        return importlib.import_module(_MOONCAKE)
    except Exception as e:  # optional: an SGLang without it, or its imports failing
        _log.debug("%s does not import (%s): SGLang's Mooncake registration is left as is", _MOONCAKE, e)
        return None


def _alloc_with_host_register(
    dims: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    pin_memory: bool,
    allocator: Any = None,
    registration_granularity_bytes: int | None = None,
) -> torch.Tensor:
    """SGLang's ``alloc_with_host_register``, as a hostpool pool (see :func:`install`)."""
    if not ADAPTER.installed:  # uninstalled while SGLang held this function
        import sys

        return sys.modules[_COMMON].alloc_with_host_register(
            dims, dtype, device, pin_memory, allocator, registration_granularity_bytes
        )
    ADAPTER.current()
    if torch.device(device).type != "cpu":
        raise ValueError(f"SGLang's host KV buffer is host memory; got device={device!r}")
    dims = tuple(int(d) for d in dims)
    nbytes = math.prod(dims) * dtype.itemsize
    if nbytes <= 0:
        return torch.empty(dims, dtype=dtype)
    config = dict(ADAPTER.config or {})
    config["size"] = nbytes
    if registration_granularity_bytes and "block_size" not in config:
        config["block_size"] = int(registration_granularity_bytes)
    if pin_memory:
        pin = dict(config.get("pin") or {})
        pin.setdefault("kind", "cuda")
        pin.setdefault("required", True)
        config["pin"] = pin
    from hostpool import _engine_config
    pool = hostpool.Pool.from_config(_engine_config.with_gpu_device(config))
    view = None
    try:
        if pin_memory:
            if pool.pin_status().get("background"):
                pool.wait_pinned()  # SGLang uses the buffer as registered memory at once
            if not pool.pinned:
                raise hostpool.PinError(
                    f"SGLang asked for a pinned host KV buffer (pin_memory) and hostpool could not "
                    f"pin it: {pool.pin_reason or 'pin is off in ' + ENV_VAR}; pin it "
                    f"(pin = {{kind = \"cuda\"}}) or start SGLang without pinned host memory"
                )
        # As hostpool.torch.as_tensor, keeping the memoryview: the tensors'
        # storage holds it, so it goes with SGLang's last view of the buffer.
        view = memoryview(pool)
        whole = torch.frombuffer(view, dtype=torch.uint8, count=pool.nbytes)
        if whole.data_ptr() != pool.addr:  # torch.frombuffer never copies; guard anyway
            raise hostpool.Error(f"torch.frombuffer returned {whole.data_ptr():#x}, not the pool at {pool.addr:#x}")
        tensor = whole[:nbytes].view(dtype).view(dims)
    except BaseException:
        whole = view = None
        pool.close()
        raise
    # When the buffer goes, a Mooncake registration of it ends first: it holds
    # the pool until then (see _register_buffer).
    weakref.finalize(view, _buffer_gone, pool.addr).atexit = False
    # hostpool pinned it: SGLang's destroy() must not unregister it.
    setattr(tensor, _REGISTERED_RANGES, [])
    ADAPTER.track(pool)
    _log.info(
        "SGLang host KV buffer %s %s (%d bytes) in a hostpool pool: %s, %d-byte pages, pinned: %s",
        dims,
        dtype,
        nbytes,
        pool.backing,
        pool.page_size,
        pool.pinned,
    )
    return tensor


def _buffer_gone(addr: int) -> None:
    """SGLang dropped the buffer of the pool at ``addr``: end its Mooncake
    registrations, which frees the pool (they held it) and its memory."""
    for reg in ADAPTER.end_registrations(addr=addr):
        try:
            reg.unregister()
        except hostpool.Error as e:  # the memory goes all the same
            # As text: a log record holding the error would hold the pool.
            _log.warning("SGLang host KV buffer at %#x: %s", addr, str(e))


def _register_buffer(self: Any, tensor: torch.Tensor) -> None:
    """SGLang's ``MooncakeBaseStore.register_buffer``: a buffer inside a
    hostpool pool registers the pool with ``self.store``, once (see
    :func:`install`); any other tensor is SGLang's own method's."""
    import sys

    original = ADAPTER.theirs(sys.modules[_MOONCAKE].MooncakeBaseStore, "register_buffer")
    store = self.store
    nbytes = tensor.numel() * tensor.element_size()
    pool = ADAPTER.pool_of(tensor.data_ptr(), nbytes) if store is not None and nbytes else None
    if pool is None:
        return original(self, tensor)
    if getattr(getattr(self, "config", None), "standalone_storage", False):
        # A dummy client hands the pointer to a separate mooncake_client
        # process, which maps only what Mooncake's own allocator made.
        raise hostpool.ConfigError(
            f"SGLang's Mooncake store runs with standalone_storage, whose mooncake_client process maps only "
            f"host buffers from Mooncake's own allocator, and this one ({nbytes} bytes at {tensor.data_ptr():#x}) "
            f"is a hostpool pool ({ENV_VAR}); set standalone_storage = false in the Mooncake config, or leave "
            f"SGLang's host KV buffers to SGLang (unset {ENV_VAR})"
        )
    try:
        reg, new = ADAPTER.register(pool, store)
    except hostpool.Error as e:
        # As text: a log record holding the error (its frames) would hold the pool.
        _log.error("Failed to register SGLang's host KV buffer with Mooncake: %s", str(e))
        raise
    if not new:
        _log.debug(
            "SGLang tensor at %#x (%d bytes) lies in the hostpool pool at %#x, already registered "
            "with this Mooncake store: nothing to do",
            tensor.data_ptr(),
            nbytes,
            pool.addr,
        )
        return
    _log.info(
        "SGLang host KV buffer at %#x registered with Mooncake's store by hostpool: %d region(s) of its pool "
        "(%d bytes)",
        pool.addr,
        len(reg.regions),
        sum(n for _, n in reg.regions),
    )


def _available_host_memory_bytes(*args: Any, **kwargs: Any) -> int:
    """What the configured backing can hold, from hostpool's capacity checks.

    SGLang subtracts a 10 GiB reserve of system RAM from this; huge pages are
    not system RAM, so for a huge page backing it is added back.
    """
    ADAPTER.current()
    config = dict(ADAPTER.config or {})
    config["size"] = 4096
    config.pop("block_size", None)
    config.pop("sharing", None)
    plan = hostpool.plan(config)
    frees = [c["free"] for c in plan.get("capacity", []) if c.get("free") is not None]
    if not frees:
        import sys

        return ADAPTER.original(sys.modules[_BASE], "available_host_memory_bytes")(*args, **kwargs)
    free = min(frees)
    if plan.get("backing") == "hugetlbfs":
        import sys

        free += getattr(sys.modules[_BASE], "HICACHE_HOST_MEMORY_RESERVE_BYTES", 0)
    return int(free)


def _sglang_plugin() -> None:
    """The ``sglang.srt.plugins`` entry point: :func:`install` when ``HOSTPOOL_SGLANG`` is set.

    SGLang's ``load_plugins()`` only logs what a plugin raises, so a bad
    config never passes unnoticed: it installs anyway, and the first host KV
    buffer SGLang builds raises hostpool's error, failing SGLang's start
    (never a silent fall back to SGLang's own memory).
    """
    from hostpool import _engine_config

    loaded = _engine_config.for_plugin(ENV_VAR)
    if loaded is None:
        _log.debug("%s is not set: SGLang keeps its own host KV memory", ENV_VAR)
        return
    config, error = loaded
    try:
        _install(config, error)
    except hostpool.EngineVersionError as e:
        # SGLang's load_plugins() only logs what a plug-in raises: say it as an error.
        _log.error("%s is set, and hostpool cannot hook this SGLang (it keeps its own host KV memory): %s", ENV_VAR, e)
        return
    if error is not None:
        _log.error("%s: %s (SGLang's host KV pool will fail with this error)", ENV_VAR, error)
    else:
        _log.info("SGLang's host KV buffers are hostpool pools (%s)", ENV_VAR)
