"""HiCache's `mooncake` storage backend with hostpool (issue 30), against
SGLang's released code and the released Mooncake wheel on loopback: SGLang's
own `MooncakeStore`, set up through its `extra_config` with a master the test
starts, registers its host KV buffer (a hostpool pool) through
`hostpool.mooncake.register`, once, in regions that never split a page of the
layout or a huge page; SGLang's own registration is skipped; bytes put from
one page of the buffer come back into another; the registration ends before
the pool's memory goes, and nothing is left behind."""

from __future__ import annotations

import ctypes
import gc
import json
import pathlib
import textwrap
import weakref

import pytest
import torch

import hostpool
import hostpool.sglang as hs
from engine_support import hugetlbfs_mount, mooncake_master, run_python  # noqa: F401  (fixture)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.mooncake_store import mooncake_store as sgl_mooncake
from test_sglang import _buffers, _device_pool

KiB, MiB = 1 << 10, 1 << 20


def _storage_config(master, **extra):
    """What HiCacheController hands the backend: one rank, MHA, page first;
    Mooncake's settings in `extra_config` (`--hicache-storage-backend-extra-config`)."""
    extra_config = {
        "master_server_address": master.address,
        "metadata_server": master.metadata,
        "protocol": "tcp",
        "device_name": "",
        "local_hostname": "127.0.0.1",
        "global_segment_size": 32 * MiB,  # this client's own segment: where the store's objects live
        **extra,
    }
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=None, extra_config=extra_config,
    )


class StoreSpy:
    """SGLang's `MooncakeStore.store`, the real `MooncakeDistributedStore`,
    with every (un)registration recorded, and whether the pool's memory was
    still there when it was unregistered."""

    def __init__(self, real):
        self.real = real
        self.calls = []

    def register_buffer(self, addr, length):
        self.calls.append(("register", addr, length))
        return self.real.register_buffer(addr, length)

    def unregister_buffer(self, addr):
        live = [p for p in hs.pools().values() if p.addr <= addr < p.addr + p.mapped_bytes and not p.closed]
        self.calls.append(("unregister", addr, bool(live)))
        return self.real.unregister_buffer(addr)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def sglangs_own_registration(monkeypatch):
    """SGLang's own `MooncakeBaseStore.register_buffer`, counting its calls
    (hostpool.sglang.install() wraps what it finds there)."""
    calls = []
    original = sgl_mooncake.MooncakeBaseStore.register_buffer

    def register_buffer(self, tensor):
        calls.append((tensor.data_ptr(), tensor.numel() * tensor.element_size()))
        return original(self, tensor)

    monkeypatch.setattr(sgl_mooncake.MooncakeBaseStore, "register_buffer", register_buffer)
    return calls


def _mooncake_host_pool():
    """SGLang's MHA host pool, page first, as HiCache builds it for
    `--hicache-storage-backend mooncake`: with Mooncake's own allocator
    (`MooncakeHostTensorAllocator`, whose memory hostpool.sglang replaces)."""
    device = _device_pool("mha")
    info = device.get_device_pool_infos()[0].buffer_info
    return MHATokenToKVPoolHost(
        info, host_to_device_ratio=2.0, host_size=0, page_size=16, layout="page_first", pin_memory=False,
        device="cpu", device_capacity_tokens=device.size, start_layer=device.start_layer,
        end_layer=device.end_layer, allocator_type="mooncake",
    )


def _page(host, page):
    """(ptr, size) of each part (k, v) of host KV page `page`, as MooncakeStore reads them."""
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(page * host.page_size, (page + 1) * host.page_size))
    return list(zip(ptrs, sizes))


BACKINGS = {
    # Anonymous memory, regions capped at 256 KiB: 16 of the layout's 16 KiB pages each.
    "anon": {"backing": "anon", "mooncake": {"max_region": "256KiB"}},
    "shm": {"dir": "/dev/shm"},
    "hugetlbfs-2M": {"backing": "hugetlbfs"},
}


@pytest.mark.parametrize("backing", list(BACKINGS))
def test_sglangs_mooncake_store_registers_the_host_buffer_through_hostpool_once(
    backing, mooncake_master, sglangs_own_registration, nothing_left_behind
):
    config = {"threads": 1, **BACKINGS[backing]}
    if backing.startswith("hugetlbfs"):
        config["dir"] = hugetlbfs_mount("2M")
    hs.install(config)
    try:
        host = _mooncake_host_pool()
        (buf,) = _buffers(host)
        pool = hs.pools()[buf.data_ptr()]  # the host buffer is a hostpool pool
        assert pool.backing == config.get("backing", "shm-segmented")
        assert isinstance(host.allocator, sgl_mooncake.MooncakeHostTensorAllocator) and host.allocator.ptr is None

        store = sgl_mooncake.MooncakeStore(_storage_config(mooncake_master), host)  # SGLang's own setup
        spy = store.store = StoreSpy(store.store)
        store.register_mem_pool_host(host)  # as HiCache does: its k and v views of one buffer

        (reg,) = hs.mooncake_registrations()[pool.addr]
        assert reg.registered and reg.kind == "store" and reg.engine is spy
        # The regions cover the pool, in order, none splitting a page of the layout or a huge page.
        assert reg.regions[0][0] == pool.addr and sum(n for _, n in reg.regions) == pool.mapped_bytes
        assert all(a + n == b for (a, n), (b, _) in zip(reg.regions, reg.regions[1:]))
        unit = max(pool.block_size, pool.page_size)
        assert all(n % unit == 0 for _, n in reg.regions[:-1])
        if backing == "anon":
            assert pool.block_size == 16 * KiB and [n for _, n in reg.regions] == [256 * KiB] * 4 + [32 * KiB]
        else:
            assert len(reg.regions) == 1
        # Registered by hostpool, once; SGLang's own registration never ran.
        assert spy.calls == [("register", a, n) for a, n in reg.regions]
        assert sglangs_own_registration == []
        # Which matters: Mooncake refuses a second registration of the range (-600).
        assert spy.real.register_buffer(buf.data_ptr(), 4096) == -600

        # The same buffer again (SGLang's v2 registration, as for a draft pool) and a view of it: no-ops.
        store.register_mem_host_pool_v2(host, PoolName.DRAFT)
        store.register_buffer(buf[1])
        assert len(spy.calls) == len(reg.regions) and hs.mooncake_registrations()[pool.addr] == [reg]
        # A tensor outside hostpool's pools is SGLang's to register.
        other = torch.zeros(4096, dtype=torch.uint8)
        store.register_buffer(other)
        assert sglangs_own_registration == [(other.data_ptr(), 4096)]
        assert spy.calls[-1] == ("register", other.data_ptr(), 4096)
        assert spy.real.unregister_buffer(other.data_ptr()) == 0

        # End to end through SGLang's own batch set/get: page 0 of the
        # buffer put into the store, read back into page 3.
        buf.view(torch.uint8).view(-1).copy_(
            torch.randint(0, 256, (buf.numel() * buf.element_size(),), dtype=torch.uint8)
        )
        assert store.batch_set_v1(["prefix-0"], torch.arange(0, host.page_size)) == [True]
        assert store.batch_get_v1(["prefix-0"], torch.arange(3 * host.page_size, 4 * host.page_size)) == [True]
        for (src, n), (dst, m) in zip(_page(host, 0), _page(host, 3)):
            assert n == m and ctypes.string_at(src, n) == ctypes.string_at(dst, n)

        # Teardown, as SGLang's: the store closes (a no-op in 0.5.23: the
        # Mooncake store stays up while the registration holds it), the host
        # pool drops its buffer. The regions are unregistered, last first,
        # while the memory is still there; then the pool goes.
        regions, gone = list(reg.regions), weakref.ref(pool)
        store.close()
        host.destroy()
        del host, buf, store, reg, pool, other
        gc.collect()
        unregistered = [c for c in spy.calls if c[0] == "unregister"]
        assert unregistered == [("unregister", a, True) for a, _ in reversed(regions)]
        assert gone() is None and hs.pools() == {} and hs.mooncake_registrations() == {}
    finally:
        hs.uninstall()
    assert spy.real.close() == 0


def test_a_registration_mooncake_refuses_raises_hostpools_error_and_registers_nothing(
    mooncake_master, sglangs_own_registration, nothing_left_behind
):
    hs.install({"threads": 1, "mooncake": {"max_region": "256KiB"}})
    try:
        host = _mooncake_host_pool()
        (buf,) = _buffers(host)
        pool = hs.pools()[buf.data_ptr()]
        store = sgl_mooncake.MooncakeStore(_storage_config(mooncake_master), host)
        # Something else registered a page in the pool's third region.
        taken = pool.addr + 2 * 256 * KiB + 16 * KiB
        assert store.store.register_buffer(taken, 16 * KiB) == 0
        spy = store.store = StoreSpy(store.store)
        # SGLang raises RuntimeError when Mooncake refuses; hostpool's error is one, and says more.
        with pytest.raises(hostpool.Error, match=r"region 2 of 5 .* -600 \(invalid parameters: the range overlaps") as e:
            store.register_mem_pool_host(host)
        assert isinstance(e.value, RuntimeError) and "the 2 region(s) before it were unregistered" in str(e.value)
        assert [c[0] for c in spy.calls] == ["register"] * 3 + ["unregister"] * 2  # all or nothing
        assert hs.mooncake_registrations() == {} and sglangs_own_registration == []
        assert spy.real.unregister_buffer(taken) == 0
        # Once the range is free, the pool registers.
        store.register_mem_pool_host(host)
        assert [len(r.regions) for r in hs.mooncake_registrations()[pool.addr]] == [5]
        host.destroy()
        del host, buf, pool, store, e
        gc.collect()
        assert hs.pools() == {} and hs.mooncake_registrations() == {}
    finally:
        hs.uninstall()
    assert spy.real.close() == 0


def test_uninstall_gives_sglang_its_own_registration_back(mooncake_master, nothing_left_behind):
    original = sgl_mooncake.MooncakeBaseStore.register_buffer
    hs.install({"threads": 1})
    assert sgl_mooncake.MooncakeBaseStore.register_buffer is hs._register_buffer
    hs.install({"threads": 2})  # again: the original is kept
    hs.uninstall()
    assert sgl_mooncake.MooncakeBaseStore.register_buffer is original
    host = _mooncake_host_pool()  # SGLang's own memory, from Mooncake's allocator
    store = sgl_mooncake.MooncakeStore(_storage_config(mooncake_master), host)
    store.register_mem_pool_host(host)  # SGLang's own registration, of its k and v halves
    assert hs.mooncake_registrations() == {}
    for buf in host.get_hybrid_pool_buffer():
        assert store.store.unregister_buffer(buf.data_ptr()) == 0
    real = store.store
    host.destroy()
    del host, store
    assert real.close() == 0


PLUGIN = textwrap.dedent(
    """
    import gc, json, sys
    sys.path[:0] = ["TESTDIR", "TESTDIR/.."]
    from sglang.srt.plugins import load_plugins
    load_plugins()               # what every SGLang process runs at start
    import hostpool.sglang as hs
    from sglang.srt.mem_cache.storage.mooncake_store import mooncake_store as mc
    from test_sglang import _buffers
    from test_sglang_mooncake import _mooncake_host_pool, _storage_config

    class Master:
        address, metadata = "ADDRESS", "METADATA"

    out = {"patched": mc.MooncakeBaseStore.register_buffer is hs._register_buffer}
    host = _mooncake_host_pool()
    (buf,) = _buffers(host)
    store = mc.MooncakeStore(_storage_config(Master), host)
    store.register_mem_pool_host(host)
    regs = hs.mooncake_registrations().get(buf.data_ptr(), [])
    out.update(in_pool=buf.data_ptr() in hs.pools(), registrations=[len(r.regions) for r in regs])
    if not regs:  # SGLang registered its k and v halves itself
        out["sglang_unregistered"] = [store.store.unregister_buffer(b.data_ptr()) for b in host.get_hybrid_pool_buffer()]
    real = store.store
    host.destroy()
    del host, buf, store, regs
    gc.collect()
    out.update(left=len(hs.pools()), closed=real.close())
    print(json.dumps(out))
    """
)


def _plugin(master, env):
    code = (
        PLUGIN.replace("TESTDIR", str(pathlib.Path(__file__).parent))
        .replace("ADDRESS", master.address)
        .replace("METADATA", master.metadata)
    )
    out = run_python(code, env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_variable_turns_hostpools_mooncake_registration_on_in_sglang(mooncake_master):
    got = _plugin(mooncake_master, {"HOSTPOOL_SGLANG": 'threads = 1\n[mooncake]\nmax_region = "512KiB"'})
    assert got == {"patched": True, "in_pool": True, "registrations": [3], "left": 0, "closed": 0}, got
    got = _plugin(mooncake_master, {})
    assert got == {"patched": False, "in_pool": False, "registrations": [], "sglang_unregistered": [0, 0],
                   "left": 0, "closed": 0}, got


def test_a_standalone_store_is_refused_with_a_clear_error(mooncake_master, sglangs_own_registration):
    """With standalone_storage SGLang's store is a dummy client whose
    mooncake_client process maps only Mooncake's own allocations. Here the
    store is set up as usual and then marked standalone (a mooncake_client
    process is not run): the registration is refused, naming both ways out."""
    hs.install({"threads": 1})
    try:
        host = _mooncake_host_pool()
        store = sgl_mooncake.MooncakeStore(_storage_config(mooncake_master), host)
        store.config.standalone_storage = True
        with pytest.raises(hostpool.ConfigError, match=r"standalone_storage.*standalone_storage = false.*unset HOSTPOOL_SGLANG"):
            store.register_mem_pool_host(host)
        assert hs.mooncake_registrations() == {} and sglangs_own_registration == []
        real = store.store
        host.destroy()
        del host, store
        gc.collect()
        assert hs.pools() == {}
    finally:
        hs.uninstall()
    assert real.close() == 0
