"""LMCache's Mooncake store connector with hostpool (issue 30), against
LMCache's released code and the released Mooncake wheel on loopback: LMCache's
own `MooncakestoreConnector`, set up through LMCache's config with a master
the test starts, has its CPU buffer (a hostpool pool) registered by
`hostpool.mooncake.register`, once, in regions that never split a page;
LMCache's own registration is skipped; a chunk put through the connector comes
back through it; `close()` and the pool's close undo it once, in either order,
while the memory is there."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging

import mooncake.store
import pytest
import torch

import hostpool.lmcache as hl
from engine_support import mooncake_master, run_python  # noqa: F401  (fixture)
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector import mooncakestore_connector as lmc_mooncake
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

KiB, MiB = 1 << 10, 1 << 20
CPU_BYTES = int(0.01 * 1024**3)  # LMCache's max_local_cpu_size = 0.01 (GB): 10737418 bytes, not page-aligned
RealStore = mooncake.store.MooncakeDistributedStore


def _config(master):
    """LMCache's config for its Mooncake store: the `mooncake_` keys of
    `extra_config` go to Mooncake's dict setup with the prefix stripped (its
    0.3.13 wheel reads `master_server_addr`; LMCache's own
    `master_server_address` key is not one of its keys)."""
    return LMCacheEngineConfig.from_defaults(
        chunk_size=16,
        local_cpu=True,
        max_local_cpu_size=0.01,
        remote_url=None,
        extra_config={
            "mooncake_local_hostname": "127.0.0.1",
            "mooncake_metadata_server": master.metadata,
            "mooncake_master_server_addr": master.address,
            "mooncake_protocol": "tcp",
            "mooncake_global_segment_size": 32 * MiB,  # this client's segment: where the chunks go
            "mooncake_local_buffer_size": 16 * MiB,
            "save_chunk_meta": False,  # zero copy: put_from / batch_get_into on the CPU buffer
        },
    )


def _metadata():
    return LMCacheMetadata(model_name="m", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=torch.float16, kv_shape=(2, 2, 16, 2, 64), chunk_size=16)


def _local_cpu_backend(config):
    """LMCache's own LocalCPUBackend (its allocator: a MixedMemoryAllocator),
    built with the cyclic collector off. LMCache 0.5.6 deadlocks when the
    collector frees a MemoryObj (earlier tests leave some in cycles) while
    `PrometheusLogger.GetOrCreate()` holds its observability lock: the
    MemoryObj's `__del__` frees it through a stats update that takes the same
    non-reentrant lock."""
    gc.collect()
    gc.disable()
    try:
        return LocalCPUBackend(config, _metadata())
    finally:
        gc.enable()


class StoreSpy:
    """The connector's `MooncakeDistributedStore`, the real one, with every
    (un)registration recorded, and whether the pool's memory was still there
    when it was unregistered."""

    made: list[StoreSpy] = []
    before_registration = None  # called with the real store once set up, before the connector registers

    def __init__(self):
        self.real = RealStore()
        self.calls = []
        self.pools = {}  # registered address -> its hostpool pool, if any
        StoreSpy.made.append(self)

    def setup(self, *args):
        code = self.real.setup(*args)
        if self.before_registration is not None:
            self.before_registration(self.real)
        return code

    def register_buffer(self, addr, length):
        self.calls.append(("register", addr, length))
        self.pools[addr] = next((p for a, p in hl._pools.items() if a <= addr < a + p.mapped_bytes), None)
        return self.real.register_buffer(addr, length)

    def unregister_buffer(self, addr):
        pool = self.pools.get(addr)
        self.calls.append(("unregister", addr, pool is not None and not pool.closed))
        return self.real.unregister_buffer(addr)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def spy(monkeypatch):
    """The store the next connector makes (it imports mooncake.store's class when built)."""
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    StoreSpy.made.clear()
    monkeypatch.setattr(mooncake.store, "MooncakeDistributedStore", StoreSpy)
    yield StoreSpy
    StoreSpy.made.clear()


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _connector(loop, backend, config):
    conn = lmc_mooncake.MooncakestoreConnector(loop, backend, config)  # LMCache's own, end to end
    (store,) = StoreSpy.made
    assert conn.store is store
    return conn, store


@pytest.mark.parametrize("max_region", [None, "4MiB"])
def test_lmcaches_connector_registers_its_cpu_buffer_through_hostpool_once(
    mooncake_master, spy, loop, max_region, nothing_left_behind
):
    hl.install({"threads": 1, **({"mooncake": {"max_region": max_region}} if max_region else {})})
    try:
        config = _config(mooncake_master)
        backend = _local_cpu_backend(config)
        buffer = backend.memory_allocator.pin_allocator.buffer
        pool = hl.get_pool(buffer.data_ptr())  # the CPU buffer is a hostpool pool
        assert buffer.numel() == pool.nbytes == CPU_BYTES

        conn, store = _connector(loop, backend, config)
        reg = hl.registration(conn)
        assert reg.registered and reg.kind == "store" and reg.engine is store and reg.pool is pool
        assert conn.registered_buffer_ptr == buffer.data_ptr()
        # The regions cover the pool (rounded up to its pages), in order, none splitting a page.
        assert reg.regions[0][0] == pool.addr and sum(n for _, n in reg.regions) == pool.mapped_bytes
        assert all(a + n == b for (a, n), (b, _) in zip(reg.regions, reg.regions[1:]))
        assert all(n % pool.page_size == 0 for _, n in reg.regions)
        sizes = [n for _, n in reg.regions]
        assert sizes == ([4 * MiB, 4 * MiB, pool.mapped_bytes - 8 * MiB] if max_region else [pool.mapped_bytes])
        # Registered by hostpool, once; LMCache's own (ptr, numel) never was,
        # and could not be: Mooncake refuses the range a second time.
        assert store.calls == [("register", a, n) for a, n in reg.regions]
        assert store.real.register_buffer(buffer.data_ptr(), buffer.numel()) == -600
        conn._register_cpu_buffer()  # again: a no-op
        assert len(store.calls) == len(reg.regions) and hl.registration(conn) is reg

        # End to end through LMCache's own connector: a chunk put from the
        # CPU buffer comes back into another chunk of it.
        obj = backend.allocate(conn.meta_shapes, conn.meta_dtypes, conn.meta_fmt)
        data = obj.raw_tensor.view(torch.uint8)
        data.copy_(torch.randint(0, 256, (obj.get_size(),), dtype=torch.uint8))
        key = CacheEngineKey("m", 1, 0, 1234, torch.float16)
        loop.run_until_complete(conn.batched_put([key], [obj]))
        assert conn.exists_sync(key)
        (got,) = loop.run_until_complete(conn.batched_get([key]))
        assert got is not None and got.data_ptr != obj.data_ptr
        assert pool.addr <= got.data_ptr < pool.addr + pool.nbytes
        assert ctypes.string_at(got.data_ptr, got.get_size()) == ctypes.string_at(obj.data_ptr, obj.get_size())
        obj.ref_count_down()
        got.ref_count_down()

        # LMCache's close(): _unregister_cpu_buffer ends the registration,
        # last region first, while the memory is there; then the store closes.
        loop.run_until_complete(conn.close())
        assert not reg.registered and hl.registration(conn) is None and conn.registered_buffer_ptr is None
        unregistered = [c for c in store.calls if c[0] == "unregister"]
        assert unregistered == [("unregister", a, True) for a, _ in reversed(reg.regions)]
        backend.close()  # the allocator frees the pool: nothing more to unregister
        assert pool.closed and len(store.calls) == 2 * len(reg.regions)
        assert hl.allocations() == {}
    finally:
        hl.uninstall()


def test_the_pool_closed_first_is_unregistered_first_and_close_does_not_again(mooncake_master, spy, loop):
    hl.install({"threads": 1})
    try:
        config = _config(mooncake_master)
        backend = _local_cpu_backend(config)
        pool = hl.get_pool(backend.memory_allocator.pin_allocator.buffer.data_ptr())
        conn, store = _connector(loop, backend, config)
        reg = hl.registration(conn)
        backend.close()  # the allocator goes first: the pool's close unregisters, then frees
        assert pool.closed and not reg.registered
        assert store.calls[-1] == ("unregister", pool.addr, True)
        loop.run_until_complete(conn.close())  # LMCache's close: nothing left to unregister
        assert [c[0] for c in store.calls] == ["register", "unregister"]
        assert hl.allocations() == {}
    finally:
        hl.uninstall()


def test_a_registration_mooncake_refuses_is_logged_as_lmcache_does_and_registers_nothing(
    mooncake_master, spy, loop, caplog
):
    hl.install({"threads": 1, "mooncake": {"max_region": "4MiB"}})
    try:
        config = _config(mooncake_master)
        backend = _local_cpu_backend(config)
        pool = hl.get_pool(backend.memory_allocator.pin_allocator.buffer.data_ptr())
        taken = pool.addr + 4 * MiB + 4 * KiB  # a page of the second region, registered by something else
        StoreSpy.before_registration = staticmethod(lambda real: real.register_buffer(taken, 4 * KiB))
        try:
            with caplog.at_level(logging.ERROR, logger="hostpool.lmcache"):
                conn, store = _connector(loop, backend, config)  # LMCache logs a failure and goes on
        finally:
            StoreSpy.before_registration = None
        assert "region 1 of 3" in caplog.text and "-600" in caplog.text, caplog.text
        assert conn.registered_buffer_ptr is None and hl.registration(conn) is None
        # All or nothing: the first region was registered and given back.
        assert store.calls == [("register", pool.addr, 4 * MiB), ("register", pool.addr + 4 * MiB, 4 * MiB),
                               ("unregister", pool.addr, True)]
        assert store.real.unregister_buffer(taken) == 0
        loop.run_until_complete(conn.close())  # nothing to unregister
        assert len(store.calls) == 3
        backend.close()
    finally:
        hl.uninstall()


def test_a_buffer_lmcache_made_itself_is_lmcaches_to_register(mooncake_master, spy, loop):
    config = _config(mooncake_master)
    backend = _local_cpu_backend(config)  # before install: LMCache's own memory
    buffer = backend.memory_allocator.pin_allocator.buffer
    hl.install({"threads": 1})
    try:
        assert lmc_mooncake.MooncakestoreConnector._register_cpu_buffer is hl._register_cpu_buffer
        assert buffer.data_ptr() not in hl.allocations()
        conn, store = _connector(loop, backend, config)
        assert hl.registration(conn) is None
        assert store.calls == [("register", buffer.data_ptr(), buffer.numel())]  # LMCache's own call
        assert conn.registered_buffer_ptr == buffer.data_ptr()
        loop.run_until_complete(conn.close())
        assert store.calls[-1] == ("unregister", buffer.data_ptr(), False)
        backend.close()
    finally:
        hl.uninstall()


def test_uninstall_gives_lmcache_its_registration_back():
    originals = [lmc_mooncake.MooncakestoreConnector.__dict__[n] for n in ("_register_cpu_buffer", "_unregister_cpu_buffer")]
    hl.install()  # the module is loaded here: patched at once
    assert lmc_mooncake.MooncakestoreConnector._register_cpu_buffer is hl._register_cpu_buffer
    assert lmc_mooncake.MooncakestoreConnector._unregister_cpu_buffer is hl._unregister_cpu_buffer
    hl.install({"threads": 2})  # again: the originals are kept
    hl.uninstall()
    assert [lmc_mooncake.MooncakestoreConnector.__dict__[n] for n in ("_register_cpu_buffer", "_unregister_cpu_buffer")] == originals


LAZY = """
import json, os, sys
os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
from vllm.plugins import load_general_plugins
load_general_plugins()          # what every vLLM process runs at start
import hostpool.lmcache as hl
CONNECTOR = "lmcache.v1.storage_backend.connector.mooncakestore_connector"
out = {"installed": hl.installed(), "loaded_at_start": CONNECTOR in sys.modules}
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
alloc = MixedMemoryAllocator(1 << 20)   # LMCache's storage being built
connector = sys.modules.get(CONNECTOR)
out["patched"] = connector is not None and connector.MooncakestoreConnector._register_cpu_buffer is hl._register_cpu_buffer
alloc.close()
print(json.dumps(out))
"""


def test_the_connector_is_patched_at_the_first_buffer_not_at_vllms_start():
    """vLLM runs the plugin in every process: importing LMCache's storage
    backends there costs seconds, so the connector is patched when LMCache
    makes its first CPU buffer, before any connector can register one."""
    out = run_python(LAZY, {"HOSTPOOL_LMCACHE": '{"threads": 1}'})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"installed": True, "loaded_at_start": False, "patched": True}, got


def test_the_mooncake_version_tested_is_the_readmes():
    from engine_support import installed_versions_are_the_readmes

    installed_versions_are_the_readmes({"Mooncake (with LMCache)": "mooncake-transfer-engine-non-cuda"})
