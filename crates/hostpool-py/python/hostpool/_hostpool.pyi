"""Type stubs of the compiled extension `hostpool._hostpool` (re-exported by `hostpool`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Literal, Self

__version__: str

Progress = Callable[[str, int, int], object]
"""`progress(phase, done_bytes, total_bytes)`: phase is "map", "prefault", "attach", "pin" or "register"."""

def plugins() -> dict[str, list[dict[str, str]]]:
    """The registered plugins, as `hostpool plugins --json`: backings, pinners, registrars, adapters."""

def check_config(source: str | os.PathLike[str] | dict[str, Any]) -> None:
    """Parse and plan a pool config as `Pool.from_config` would, building nothing; `ConfigError` when it is wrong."""

def index_bytes(slots: int, page_size: int = 4096) -> int:
    """The bytes `Pool.index` takes for `slots` slots in a pool of `page_size`-byte pages."""

def keeper_status(name: str) -> dict[str, Any]:
    """The status of the kept pool `name`, as `hostpool keep status --json` prints it (size, page_size,
    state, tenants, max_tenants, index). Leases nothing; `KeeperError` when no keeper of that name answers."""

def plan(source: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    """The plan of a pool config, as `hostpool plan --json`: backing, sizes, and every capacity check
    (`capacity`: `resource`, `source`, `need`, `free`, `verdict`, `remedy`; `fits`). Builds nothing."""

class Error(RuntimeError):
    """Base of every hostpool error; `exit_code` is what the `hostpool` CLI exits with for the same failure."""

    exit_code: int

class ConfigError(Error, ValueError):
    """The configuration is wrong (a bad size, key, plugin name or combination)."""

class CapacityError(Error):
    """The node cannot hold the pool; `remedy` says how to make room."""

    remedy: str
    need: int
    free: int

class PeerError(Error):
    """A peer rank of a shared pool failed, died, stopped or never attached: `ranks` it blames
    (`rank` the first, `None` when it names the peer only by pid), `pid` of the first peer blamed."""

    rank: int | None
    ranks: tuple[int, ...]
    pid: int | None

class NotAvailableError(Error):
    """Something this host lacks: no GPU driver, no device, no huge pages of that size."""

class PinError(Error):
    """Pinning the pool failed (and was required); nothing stays pinned."""

class PoolBusyError(Error, BufferError):
    """`close()` while buffers, arrays or tensors exported from the pool are alive."""

class KeeperError(Error):
    """The pool's keeper (`keeper="NAME"`) does not answer, refused the lease, or went away
    during it: `keeper` the kept pool's name, `pid` the process blamed (the keeper, or the
    lease's holder), `absent` whether no keeper answers at all."""

    keeper: str
    pid: int | None
    absent: bool

class Shared:
    """How the ranks of one engine share a pool: the same `name` and `world` on every rank."""

    name: str
    world: int
    rank: int
    attach_timeout: float
    barrier_timeout: float
    rendezvous: Literal["socket", "file"]

    def __init__(
        self,
        name: str,
        world: int,
        rank: int,
        attach_timeout: float = 30.0,
        barrier_timeout: float = 600.0,
        rendezvous: Literal["socket", "file"] = "socket",
    ) -> None:
        """Raises `ConfigError` for a bad name, world, rank, timeout or rendezvous."""

class Pool:
    """A host-memory pool: mapped, prefaulted (in parallel), pinned and registered as asked.

    The pool exports its memory with zero copies: the buffer protocol
    (writable, format "B", `nbytes` long: `memoryview`, `numpy.frombuffer`,
    `torch.frombuffer`) and DLPack (`numpy.from_dlpack`, `torch.from_dlpack`,
    device kDLCPU). The build runs without the GIL; Ctrl-C cancels it, leaving
    nothing, and raises `KeyboardInterrupt`.

    Raises `ConfigError` (bad input), `CapacityError` (the node cannot hold
    it), `PeerError` (a rank of a shared pool failed, died or never came),
    `KeeperError` (the keeper of `keeper=` does not answer or refused),
    `NotAvailableError` (no driver, device or huge pages of that size),
    `PinError` (required pinning failed) or `Error`.
    """

    def __init__(
        self,
        size: int | str | None = None,
        *,
        backing: str = "auto",
        dir: str | os.PathLike[str] | None = None,
        page_size: int | str | None = None,
        numa_node: int | str | list[int] | None = None,
        threads: int | None = None,
        prefault: Literal["auto", "populate-write", "touch", "none"] = "auto",
        block_size: int | str | None = None,
        shared: Shared | None = None,
        pin: str | None = None,
        pin_required: bool = False,
        register: Sequence[str] | None = (),
        pin_scope: Literal["pool", "shard"] = "pool",
        memlock_bound: Literal["check", "ignore"] = "check",
        pin_background: bool = False,
        background_chunk: int | str | None = None,
        huge_pages: Literal["required", "prefer", "off"] | None = None,
        keeper: str | None = None,
        keeper_tag: str | None = None,
        keeper_fallback: Literal["fail", "build"] = "fail",
        keeper_attach_timeout: float | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Build the pool. `size` is bytes or an IEC string ("64GiB"; default 1 GiB).

        `huge_pages` (with `backing="auto"`): "required" (huge pages or a `CapacityError`),
        "prefer" (4 KiB pages when huge pages cannot hold the pool; `report["huge_pages"]`
        says what it got and why) or "off"; without a `dir`, huge pages are a memfd.

        With `keeper="NAME"` the pool is leased from `hostpool keep`'s pool of that name
        instead: it comes resident (no prefault; `report["keeper"]` says which lease of which
        keeper, and how the previous one ended), and is pinned and registered as asked. A
        `size` or `page_size` given must be the kept pool's; none takes it as it is.
        `keeper_tag` is stored with the lease and handed to the next one (at most 16 KiB).
        `keeper_attach_timeout` is how long to wait for the keeper to hand the pool over (it
        may be clearing it; default: `shared`'s attach timeout, else 30 s). Raises
        `KeeperError` when the keeper does not answer (unless `keeper_fallback="build"`) or
        refuses."""

    @staticmethod
    def from_config(source: str | os.PathLike[str] | dict[str, Any], *, progress: Progress | None = None) -> Pool:
        """A pool from a config file (TOML or JSON) or a dict of its keys, as `hostpool alloc --config`."""

    @property
    def addr(self) -> int:
        """The base address."""
    @property
    def nbytes(self) -> int:
        """Bytes asked for: the length of the buffer and of every export."""
    @property
    def mapped_bytes(self) -> int:
        """Bytes mapped: `nbytes` rounded up to the page."""
    @property
    def page_size(self) -> int:
        """Page size in bytes (4096, 2 MiB or 1 GiB)."""
    @property
    def backing(self) -> str:
        """The backing's name: "anon", "shm-segmented" or "hugetlbfs"."""
    @property
    def pinned(self) -> bool:
        """Whether the pool is pinned."""
    @property
    def pin_reason(self) -> str | None:
        """Why a best-effort pin was skipped."""
    @property
    def shard(self) -> tuple[int, int]:
        """`(offset, nbytes)` this rank prefaulted: the whole pool when private."""
    @property
    def report(self) -> dict[str, Any] | None:
        """The report, with the fields of `hostpool alloc --json` (with teardown once closed)."""
    @property
    def block_size(self) -> int | None:
        """The block size given at build (`None` when not given): chunks never split a block."""
    @property
    def closed(self) -> bool:
        """Whether `close()` ran."""

    def pin_status(self) -> dict[str, Any]:
        """Where the pin stands: `state` ("off", "pinning", "pinned", "failed", "skipped"),
        `pinned_bytes`, `total_bytes`, `ranges` (pinned `{offset, len}` in address order),
        `chunks`, `error`, `background`, `paused`, `parked` (the pinning thread waits in
        the pause, the chunk in flight at the pause done), `seconds`."""
    def pause_pinning(self) -> bool:
        """Pause a background pin between chunks (the chunk being pinned finishes first);
        `True` when one was running. `wait_pinned()` waits while paused; `close()` still
        stops and unpins."""
    def resume_pinning(self) -> bool:
        """Resume a background pin paused by `pause_pinning()`; `True` when one was running."""
    def wait_pinned(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait (without the GIL) until the pin is settled or `timeout` seconds pass; returns
        `pin_status()`. `PinError` when a required background pin failed."""
    def close(self) -> list[dict[str, str]]:
        """Tear down; returns what could not be undone (`{"step", "detail"}` each; empty when clean).

        Idempotent. Raises `PoolBusyError`, leaving the pool intact, while
        exports of its memory (memoryviews, arrays, DLPack tensors) are alive.
        A `torch.frombuffer` tensor holds no export: after `close()` it reads
        zeros from a placeholder that keeps the range until the pool object
        is collected, never memory reused by anything else.
        """
    def nixl_descs(self, dev_id: int = 0, max_region: int | str | None = None) -> list[tuple[int, int, int]]:
        """`(addr, len, dev_id)` of the pool split at `max_region` on block boundaries, for `register_memory`."""
    def regions(self, max_region: int | str | None = None) -> list[tuple[int, int]]:
        """`(addr, len)` of this rank's shard split at `max_region` on block and page boundaries."""
    def files(self) -> list[tuple[int, int, int, str | None]]:
        """`(fd, offset, nbytes, path)` of each open file the pool maps (path `None` when unlinked)."""
    def plugin_table(self, name: str) -> dict[str, Any] | None:
        """The config's table `[name]` as given, or `None`."""
    def _before_close(self, callback: Callable[[], object]) -> None: ...
    def _forget_before_close(self, callback: Callable[[], object]) -> bool: ...
    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable memoryview of `nbytes` bytes at `offset` (zero copy); `ValueError` outside the pool."""
    def tier_open(self, slots: int, fingerprint: dict[str, Any], *, timeout: float | None = None) -> KvIndex:
        """Open the keeper's CPU tier for this engine's identity: `slots` slots and `fingerprint`
        (ordered fields, as for `index`). The keeper attaches the index at the pool's tail itself:
        warm with its records when it holds this identity, else formatted afresh (`cold_reason`,
        `cold_field`). The `KvIndex` returned reads it in place (`find`, `get`, `len`); the keeper
        alone writes it (`tier_store`, `tier_stored`), so its writing methods raise `ConfigError`.
        `KeeperError` when another engine in the tier opened it for another identity or number of
        slots (the message names the field, both values and the engines holding it): nothing is
        touched; or when the pool cannot hold the index."""
    def tier_rejoin(
        self,
        slots: int,
        fingerprint: dict[str, Any],
        writing: list[tuple[int, bytes]],
        holding: list[bytes],
        *,
        timeout: float | None = None,
    ) -> tuple[KvIndex, list[int], list[tuple[bytes, int]]]:
        """tier_open for an engine back after its keeper's restart (leased again, the same memory):
        its stores in flight `(slot, key)` and held keys are given back before any other engine can be
        granted them. `(index, claimed slots, held (key, slot))`."""
    def tier_store(self, keys: list[bytes], *, timeout: float | None = None) -> list[tuple[str, int | None, bytes | None]]:
        """Ask the keeper's CPU tier (shared by its tenants) for a slot per key:
        ("granted", slot, evicted), ("stored", slot, None), ("in_flight", None, None)
        or ("no_room", None, None). Every tier_* request waits at most `timeout` seconds (30 unless
        given), the GIL released: KeeperError when the keeper did not answer (what it grants later is
        given back by itself), is away or is gone (`absent`); `tier_link` says which."""
    def tier_stored(self, slots: list[int], *, wait: bool = True, timeout: float | None = None) -> int | None:
        """The granted slots are written completely: recorded for every tenant."""
    def tier_abort(self, slots: list[int], *, wait: bool = True, timeout: float | None = None) -> int | None:
        """The granted slots will not be written."""
    def tier_load(self, keys: list[bytes], *, timeout: float | None = None) -> list[int | None]:
        """Hold each key's slot for a load (None: a miss) until tier_loaded."""
    def tier_hold(self, key: bytes, ahead: int = 0, *, timeout: float | None = None) -> list[tuple[bytes, int]]:
        """Hold key's slot and up to `ahead` blocks stored after it, in one message: (key, slot) pairs
        held, key's first; empty for a miss. Release each with tier_loaded (read) or tier_release."""
    def tier_loaded(self, slots: list[int], *, wait: bool = True, timeout: float | None = None) -> int | None:
        """The held slots were read."""
    def tier_release(self, slots: list[int], *, wait: bool = True, timeout: float | None = None) -> int | None:
        """The held slots were not read: released, not counted as hits."""
    def tier_touch(self, keys: list[bytes], *, wait: bool = True, timeout: float | None = None) -> int | None:
        """The keys were used (the newest in the tier's order of last use). With wait=False, this and
        tier_stored, tier_abort, tier_loaded and tier_release are sent without waiting (None)."""
    def hand_back(self, keeper: str) -> bool:
        """Hand this pool's files back to a restarted keeper that waits for them (adopt_within_secs):
        True when it took them back."""
    @property
    def tier_link(self) -> tuple[str, str | None]:
        """("up", None), ("away", why), ("lost", why), or ("none", None) before the first tier request."""
    def index(self, slots: int, fingerprint: dict[str, Any], *, offset: int | None = None) -> KvIndex:
        """The crash-consistent index of what `slots` slots hold, at `offset` (default: the pool's
        last `index_bytes(slots, page_size)` bytes), for the identity `fingerprint` (ordered
        fields). Warm with its records when identity and slots match, else cold and emptied."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, view: memoryview, /) -> None: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the pool as a 1-D uint8 CPU tensor (versioned when max_version >= (1, 0))."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """(1, 0): kDLCPU."""
    def __len__(self) -> int: ...

class KvIndex:
    """The index of a pool's slots (`Pool.index`): record a slot's key once its bytes are
    written, unrecord it before they are overwritten, read every record back after a restart,
    or find a key's slot without reading them. A writer killed at any moment leaves each slot
    empty or whole, and `find` never names a slot that does not hold its key. The index of
    `Pool.tier_open` is the keeper's CPU tier: read only here (`record`, `unrecord`, `touch`
    and `clear` raise `ConfigError`)."""

    @property
    def warm(self) -> bool: ...
    @property
    def cold_reason(self) -> str | None: ...
    @property
    def cold_field(self) -> tuple[str, str | None, str | None] | None:
        """(field, stored, now) when a fingerprint field differed."""
    @property
    def restored(self) -> int:
        """The records the index holds now (counted when asked: the attach reads only the header)."""
    @property
    def capacity(self) -> int: ...
    @property
    def extent(self) -> tuple[int, int]: ...
    @property
    def digest(self) -> str: ...
    @property
    def fingerprint(self) -> dict[str, str]: ...
    def record(self, slot: int, key: bytes) -> int: ...
    def record_many(self, slots: Sequence[int], keys: Sequence[bytes]) -> None: ...
    def unrecord(self, slot: int) -> None: ...
    def unrecord_many(self, slots: Sequence[int]) -> None: ...
    def touch(self, slot: int) -> None: ...
    def touch_many(self, slots: Sequence[int]) -> None:
        """Touch each slot in order: the last becomes the most recent."""
    def get(self, slot: int) -> bytes | None: ...
    def find(self, key: bytes) -> int | None:
        """The slot recorded for `key`: a few loads of the key table, whatever the index holds."""
    def find_many(self, keys: Sequence[bytes]) -> list[int | None]: ...
    def survey(self) -> tuple[list[int], list[int]]:
        """(free slots ascending, recorded slots oldest use first)."""
    def entries(self) -> list[tuple[int, bytes]]:
        """Every record, oldest use first."""
    def clear(self) -> None: ...
    def __len__(self) -> int: ...
