"""hostpool's SGLang plugin against SGLang's released code (the version in
requirements-nodeps.txt): SGLang's own `load_plugins()` finds the wheel's
entry point, and SGLang's own `MHATokenToKVPoolHost` / `MLATokenToKVPoolHost`
get their buffers from hostpool pools, for every layout they support."""

from __future__ import annotations

import gc
import json
import textwrap

import pytest
import torch

import hostpool
import hostpool.sglang as hs
from engine_support import free_hugepages, hugetlbfs_mount, run_python
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host import base as sgl_base
from sglang.srt.mem_cache.pool_host import common as sgl_common
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

MiB = 1 << 20
MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head", "page_unified"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_unified"]


def _device_pool(kind):
    if kind == "mha":
        return MHATokenToKVPool(size=256, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=64,
                                layer_num=4, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    return MLATokenToKVPool(size=256, page_size=16, dtype=torch.bfloat16, kv_lora_rank=512,
                            qk_rope_head_dim=64, layer_num=4, device="cpu", enable_memory_saver=False)


def _host_pool(kind, device, layout, pin=False):
    kw = dict(host_to_device_ratio=2.0, host_size=0, page_size=16, layout=layout, pin_memory=pin, device="cpu",
              device_capacity_tokens=device.size, start_layer=device.start_layer, end_layer=device.end_layer)
    info = device.get_device_pool_infos()[0].buffer_info
    if kind == "mha":
        return MHATokenToKVPoolHost(info, **kw)
    return MLATokenToKVPoolHost(info, **kw, target_layer_num=device.layer_num,
                                override_kv_cache_dim=device.kv_cache_dim)


def _buffers(host):
    bufs = host.kv_buffer
    return list(bufs) if isinstance(bufs, (list, tuple)) else [bufs]


@pytest.fixture
def installed():
    hs.install({"threads": 1})
    yield
    hs.uninstall()
    gc.collect()
    assert hs.pools() == {}, "a host KV buffer's pool outlived it"


CASES = [("mha", layout) for layout in MHA_LAYOUTS] + [("mla", layout) for layout in MLA_LAYOUTS]


@pytest.mark.parametrize(("kind", "layout"), CASES)
def test_sglangs_host_pool_buffer_is_a_hostpool_pool(installed, kind, layout):
    device = _device_pool(kind)
    hs.uninstall()
    reference = _host_pool(kind, device, layout)  # SGLang's own buffer, for its shape
    shapes = [tuple(b.shape) for b in _buffers(reference)]
    assert not any(b.data_ptr() in hs.pools() for b in _buffers(reference))
    reference.destroy()
    hs.install({"threads": 1})
    host = _host_pool(kind, device, layout)
    bufs = _buffers(host)
    assert [tuple(b.shape) for b in bufs] == shapes  # SGLang's layout, unchanged
    for b in bufs:
        pool = hs.pools()[b.data_ptr()]
        assert pool.nbytes == b.numel() * b.element_size()
        # The same memory: a write through SGLang's tensor shows in the pool.
        b.view(-1)[:4] = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=b.dtype)
        assert bytes(pool.view(0, 8)) == b.view(-1)[:4].view(torch.uint8).numpy().tobytes()[:8]
        assert getattr(b, "_sglang_cuda_host_registered_ranges") == []  # destroy() unregisters nothing
    host.destroy()
    del host, bufs, b, pool
    gc.collect()
    assert hs.pools() == {}, "destroy() left the pool alive"


def test_huge_pages_back_the_buffer_and_go_back_with_it():
    mount = hugetlbfs_mount("2M")
    before = free_hugepages(2048)
    hs.install({"dir": mount})
    try:
        host = _host_pool("mha", _device_pool("mha"), "page_first")
        (buf,) = _buffers(host)
        pool = hs.pools()[buf.data_ptr()]
        assert pool.backing == "hugetlbfs" and pool.page_size == 2 * MiB
        assert free_hugepages(2048) != before
        host.destroy()
        del host, buf, pool
        gc.collect()
        assert free_hugepages(2048) == before
    finally:
        hs.uninstall()


def test_sglangs_size_check_sees_reserved_huge_pages():
    # SGLang checks MemAvailable less 10 GiB, which never counts reserved huge
    # pages (SGLang #34972); with hostpool it is the pages free for the pool.
    mount = hugetlbfs_mount("2M")
    hs.install({"dir": mount})
    try:
        free, reserved = free_hugepages(2048)
        expect = (free - reserved) * 2 * MiB + sgl_base.HICACHE_HOST_MEMORY_RESERVE_BYTES
        assert sgl_base.available_host_memory_bytes() == expect
        assert sgl_base.host_memory_budget_bytes() == (free - reserved) * 2 * MiB // sgl_base.ranks_per_host()
    finally:
        hs.uninstall()
    hs.install({"backing": "anon"})
    try:  # anonymous memory: MemAvailable, as SGLang reads it
        ours, theirs = sgl_base.available_host_memory_bytes(), hs.ADAPTER.original(sgl_base, "available_host_memory_bytes")()
        assert abs(ours - theirs) < max(theirs // 10, 512 * MiB), (ours, theirs)
    finally:
        hs.uninstall()


def test_uninstall_restores_sglang():
    original = sgl_common.alloc_with_host_register
    hs.install()
    assert sgl_common.alloc_with_host_register is not original
    assert sgl_common.ALLOC_MEMORY_FUNCS["cpu"] is sgl_common.alloc_with_host_register
    hs.uninstall()
    assert sgl_common.alloc_with_host_register is original
    assert sgl_common.ALLOC_MEMORY_FUNCS["cpu"] is original
    host = _host_pool("mha", _device_pool("mha"), "page_first")
    assert not any(b.data_ptr() in hs.pools() for b in _buffers(host))
    host.destroy()


PLUGIN = textwrap.dedent(
    """
    import json, sys, torch
    sys.path[:0] = ["TESTDIR", "TESTDIR/.."]
    from sglang.srt.plugins import load_plugins
    load_plugins()               # what every SGLang process runs at start
    import hostpool, hostpool.sglang as hs
    from sglang.srt.mem_cache.pool_host import common
    calls = []
    common._cuda_host_register = lambda *a, **k: calls.append(a)  # SGLang's own registration
    from test_sglang import _device_pool, _host_pool, _buffers
    out = {"installed": hs.installed()}
    try:
        host = _host_pool("mha", _device_pool("mha"), "page_first", pin=PIN)
    except hostpool.Error as e:
        out["error"] = f"{type(e).__name__}: {e}"
    except Exception as e:
        out["other"] = f"{type(e).__name__}: {e}"
    else:
        (buf,) = _buffers(host)
        pool = hs.pools().get(buf.data_ptr())
        out.update(in_pool=pool is not None, pinned=pool is not None and pool.pinned,
                   sglang_registrations=len(calls), layout_page=host.page_size * host.layout_dim)
        if pool is not None and ("keeper" in pool.report or "keeper_fallback" in pool.report):
            out.update(nbytes=pool.nbytes, lease=pool.report.get("keeper"),
                       fallback=pool.report.get("keeper_fallback"))
        host.destroy()
        del host, buf, pool
    print(json.dumps(out))
    """
)


def _plugin(env, pin=False):
    import pathlib

    code = PLUGIN.replace("TESTDIR", str(pathlib.Path(__file__).parent)).replace("PIN", str(pin))
    out = run_python(code, env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_the_variable_sglang_is_unchanged():
    got = _plugin({})
    assert got == {"installed": False, "in_pool": False, "pinned": False, "sglang_registrations": 0,
                   "layout_page": got["layout_page"]}, got


def test_sglangs_load_plugins_turns_hostpool_on_with_one_variable():
    got = _plugin({"HOSTPOOL_SGLANG": "threads = 1"})
    assert got["installed"] and got["in_pool"], got


def test_a_pinned_buffer_is_pinned_by_hostpool_and_never_registered_by_sglang(fake_cuda_dir, tmp_path):
    log = tmp_path / "cuda.log"
    got = _plugin({"HOSTPOOL_SGLANG": '{"threads": 1, "pin": {"kind": "cuda"}, "prefault": "touch"}',
                   "LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log)}, pin=True)
    assert got["in_pool"] and got["pinned"], got
    assert got["sglang_registrations"] == 0, "SGLang registered a buffer hostpool pinned"
    calls = log.read_text().splitlines()
    registers = [c for c in calls if c.startswith("cuMemHostRegister")]
    assert registers and len(registers) == len([c for c in calls if c.startswith("cuMemHostUnregister")]), calls


def test_a_bad_variable_fails_sglangs_host_pool_with_hostpools_error():
    got = _plugin({"HOSTPOOL_SGLANG": "treads = 1"})
    assert got["installed"] is True
    assert "HOSTPOOL_SGLANG" in got.get("error", "") and "treads" in got["error"], got


def test_the_versions_tested_are_the_readmes():
    from engine_support import installed_versions_are_the_readmes

    installed_versions_are_the_readmes({"SGLang": "sglang", "Mooncake (with SGLang)": "mooncake-transfer-engine-non-cuda"})


def test_sglangs_host_pool_leases_its_buffer_from_a_keeper():
    """Issue 19: a `[lease]` table in HOSTPOOL_SGLANG leases SGLang's host buffer
    from `hostpool keep` (no keeper: a clear error, or a pool of its own with
    fallback = "build"); the keeper's pool must be the buffer's size."""
    import os
    import signal
    import subprocess

    name = f"sglang-keep-{os.getpid()}"
    got = _plugin({"HOSTPOOL_SGLANG": f'threads = 1\n[lease]\nkeeper = "{name}"'})
    assert "KeeperError" in got.get("error", "") and f"@hostpool-keep/{name}" in got["error"], got
    got = _plugin({"HOSTPOOL_SGLANG": f'threads = 1\n[lease]\nkeeper = "{name}"\nfallback = "build"'})
    assert got["in_pool"] and got["lease"] is None and "no keeper answers" in got["fallback"], got
    keeper = subprocess.Popen(
        [os.environ["HOSTPOOL_BIN"], "keep", "--name", name, "--size", str(got["nbytes"]),
         "--backing", "shm-segmented", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready = json.loads(keeper.stdout.readline() or "null")
        assert ready and ready["name"] == name, keeper.stderr.read()
        for generation in (1, 2):
            got = _plugin({"HOSTPOOL_SGLANG": f'threads = 1\n[lease]\nkeeper = "{name}"'})
            assert got["in_pool"] and got["lease"]["generation"] == generation, got
            assert got["lease"]["instance"] == ready["instance"], got
    finally:
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=10) == 0, keeper.stderr.read()


def test_the_adapter_installs_once_and_uninstall_puts_back_every_object_sglang_had():
    """Issue 38: importing hostpool.sglang patches nothing; installing twice is installing
    once; uninstalling leaves every attribute of SGLang's loaded modules and of their
    classes the very object it was (the Mooncake store's register_buffer included)."""
    import os

    out = run_python(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        from engine_support import engine_objects, assert_same_objects
        import sglang.srt.mem_cache.pool_host.common, sglang.srt.mem_cache.pool_host.base
        import sglang.srt.mem_cache.storage.mooncake_store.mooncake_store as ms
        common = sglang.srt.mem_cache.pool_host.common
        common.ALLOC_MEMORY_FUNCS["cpu"]  # SGLang's defaultdict caches its function on first use
        before = engine_objects("sglang")
        funcs = dict(common.ALLOC_MEMORY_FUNCS)
        import hostpool.sglang as hs
        assert_same_objects(before, engine_objects("sglang"), "import hostpool.sglang")
        hs.install({{"threads": 1}})
        once = engine_objects("sglang")
        assert common.alloc_with_host_register is not before[(common.__name__, "alloc_with_host_register")]
        assert common.ALLOC_MEMORY_FUNCS["cpu"] is common.alloc_with_host_register
        assert "cuda" not in funcs and common.ALLOC_MEMORY_FUNCS["cuda"] is common.alloc_with_host_register
        assert "register_buffer" in vars(ms.MooncakeBaseStore)
        hs.install({{"threads": 2}})
        assert_same_objects(once, engine_objects("sglang"), "a second install")
        hs.uninstall()
        assert_same_objects(before, engine_objects("sglang"), "uninstall")
        # Entries SGLang's defaultdict had are SGLang's again; one it cached while
        # hostpool's hook was in place is gone, as it was absent.
        assert set(common.ALLOC_MEMORY_FUNCS) == set(funcs) and all(
            common.ALLOC_MEMORY_FUNCS[k] is v for k, v in funcs.items())
        hs.uninstall()
        print(json.dumps({{"ok": True, "installed": hs.installed()}}))
    """))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ok": True, "installed": False}


def test_doctor_lists_this_sglang_as_tested():
    import sglang

    from engine_support import doctor_engines

    found = doctor_engines()["sglang"]
    assert found["details"]["version"] == sglang.__version__ and found["details"]["tested"] is True, found


def test_an_sglang_lacking_a_name_the_adapter_needs_is_refused_naming_it_and_nothing_is_patched(monkeypatch):
    from engine_support import assert_same_objects, engine_objects
    from hostpool import _engines

    monkeypatch.delattr(sgl_base, "available_host_memory_bytes")
    before = engine_objects("sglang")
    with pytest.raises(hostpool.EngineVersionError) as raised:
        hs.install({"threads": 1})
    e = raised.value
    assert e.engine == "sglang" and e.missing == ("sglang.srt.mem_cache.pool_host.base.available_host_memory_bytes",)
    assert e.tested == _engines.TESTED["sglang"] and not hs.installed()
    assert_same_objects(before, engine_objects("sglang"), "a refused install")
