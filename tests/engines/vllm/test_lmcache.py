"""hostpool.lmcache.install() against LMCache's released allocators, and the
`vllm.general_plugins` entry point that turns it on in every vLLM process."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

import hostpool
import hostpool.lmcache as hl
from engine_support import run_python, shm_files
import lmcache.v1.memory_management as mm
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
from lmcache.v1.memory_allocators.paged_cpu_gpu_memory_allocator import PagedCpuGpuMemoryAllocator
from lmcache.v1.memory_allocators.pin_memory_allocator import PinMemoryAllocator
from lmcache.v1.system_detection import NUMAMapping

MiB = 1 << 20
ORIGINAL_ALLOC = mm._allocate_cpu_memory
ORIGINAL_FREE = mm._free_cpu_memory


@pytest.fixture
def installed():
    hl.install({"threads": 1})
    yield
    hl.uninstall()
    assert hl.allocations() == {}, "a buffer outlived its allocator"


def _in_a_pool(buffer):
    addr = buffer.data_ptr()
    assert addr in hl.allocations(), "the buffer is not a hostpool pool"
    pool = hl.get_pool(addr)
    assert pool.nbytes == buffer.numel()
    # The same memory: a write through LMCache's tensor shows in the pool.
    buffer[:8] = torch.arange(1, 9, dtype=torch.uint8)
    assert bytes(pool.view(0, 8)) == bytes(range(1, 9))
    return pool


def test_pin_memory_allocators_buffer_is_a_pool_and_close_frees_it(installed):
    alloc = PinMemoryAllocator(8 * MiB)
    pool = _in_a_pool(alloc.buffer)
    assert pool.report["prefault"]["bytes"] == 8 * MiB  # prefaulted, unlike a bare mmap
    # Pinning is a best-effort CUDA pin unless the config says otherwise.
    assert pool.report["pin"]["kind"] == "cuda"
    alloc.close()
    assert pool.closed and hl.allocations() == {}


def test_mixed_allocator_with_huge_pages_gets_a_hugetlbfs_pool(installed):
    alloc = MixedMemoryAllocator(8 * MiB, use_hugepages=True)
    pool = _in_a_pool(alloc.buffer)
    assert pool.backing == "hugetlbfs" and pool.page_size >= 2 * MiB
    alloc.close()
    assert pool.closed


def test_a_numa_mapping_binds_the_pool_to_its_node(installed):
    alloc = MixedMemoryAllocator(4 * MiB, numa_mapping=NUMAMapping(gpu_to_numa_mapping={0: 0}))
    pool = _in_a_pool(alloc.buffer)
    assert pool.report["numa"]["node"] == 0, pool.report["numa"]
    alloc.close()


def test_an_shm_name_is_a_shared_pool_with_nothing_in_dev_shm(installed, caplog):
    before = shm_files()
    with caplog.at_level("WARNING", logger="hostpool.lmcache"):
        alloc = MixedMemoryAllocator(4 * MiB, shm_name=f"/lmcache-test-{id(installed)}")
    pool = _in_a_pool(alloc.buffer)
    assert pool.report["sharing"]["name"].startswith("lmcache-test-")
    assert shm_files() == before
    # LMCache's multiprocess workers shm_open that name: they are told, not left to guess.
    assert any("will not find it" in r.getMessage() for r in caplog.records), caplog.text
    alloc.close()


def test_paged_cpu_allocator_gets_and_frees_a_pool(installed):
    alloc = PagedCpuGpuMemoryAllocator()
    alloc.init_cpu_memory_allocator(4 * MiB, [torch.Size([2, 16, 8, 64])], [torch.float16])
    pool = _in_a_pool(alloc.cpu_buffer)
    alloc.close()
    assert pool.closed


def test_uninstall_restores_lmcaches_functions():
    hl.install()
    assert mm._allocate_cpu_memory is not ORIGINAL_ALLOC and hl.installed()
    hl.install({"threads": 2})  # again: replaces the config, keeps the originals
    hl.uninstall()
    assert mm._allocate_cpu_memory is ORIGINAL_ALLOC and mm._free_cpu_memory is ORIGINAL_FREE
    assert not hl.installed()
    hl.uninstall()  # twice is fine
    # LMCache's own path runs again (here without CUDA it fails in its native code, not ours).
    try:
        buf = mm._allocate_cpu_memory(MiB)
    except Exception as e:
        assert "hostpool" not in type(e).__module__
    else:
        assert buf.data_ptr() not in hl.allocations()
        mm._free_cpu_memory(buf, MiB)


def test_a_buffer_lmcache_made_before_install_is_freed_by_lmcache():
    alloc = PinMemoryAllocator(MiB)  # LMCache's own path (on CPU: its fallback tensor)
    assert alloc.buffer.data_ptr() not in hl.allocations()
    hl.install()
    try:
        alloc.close()  # through hostpool's _free_cpu_memory, handed to LMCache's own
        assert alloc._unregistered
    finally:
        hl.uninstall()


def test_a_bad_config_is_a_config_error():
    with pytest.raises(hostpool.ConfigError, match="treads"):
        hl.install({"treads": 1})
    with pytest.raises(hostpool.ConfigError, match="neither a file"):
        hl.install("threads = = 1")
    assert not hl.installed()


PLUGIN = textwrap.dedent(
    """
    import json, os
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    from vllm.plugins import load_general_plugins
    load_general_plugins()          # what every vLLM process runs at start
    import hostpool, hostpool.lmcache as hl
    from lmcache.v1.memory_allocators.pin_memory_allocator import PinMemoryAllocator
    out = {"installed": hl.installed()}
    try:
        alloc = PinMemoryAllocator(4 << 20)
    except hostpool.Error as e:
        out["error"] = str(e)
    except Exception as e:
        out["other"] = type(e).__name__
    else:
        out["in_pool"] = alloc.buffer.data_ptr() in hl.allocations()
        alloc.close()
        out["left"] = len(hl.allocations())
    print(json.dumps(out))
    """
)


def _plugin(env):
    out = run_python(PLUGIN, env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_vllms_general_plugin_installs_with_one_variable():
    got = _plugin({"HOSTPOOL_LMCACHE": '{"threads": 1}'})
    assert got == {"installed": True, "in_pool": True, "left": 0}, got


def test_without_the_variable_the_plugin_changes_nothing():
    got = _plugin({})
    assert got["installed"] is False and "in_pool" not in got or got["in_pool"] is False, got


def test_a_bad_variable_never_breaks_vllms_start_and_fails_lmcaches_first_allocation():
    got = _plugin({"HOSTPOOL_LMCACHE": "treads = 1"})
    assert got["installed"] is True
    assert "HOSTPOOL_LMCACHE" in got.get("error", "") and "treads" in got["error"], got


def test_lmcache_restarted_against_a_keeper_finds_the_bytes_it_offloaded():
    """Issue 19: with `keeper` in its config, LMCache's buffer is leased from
    `hostpool keep` (resident: no prefault), and a restarted LMCache (a new
    allocator) gets the same memory back with `content = "keep"`, told how the
    previous lease ended and the tag it stored."""
    import os
    import signal
    import subprocess

    name = f"lmcache-keep-{os.getpid()}"
    keeper = subprocess.Popen(
        [os.environ["HOSTPOOL_BIN"], "keep", "--name", name, "--size", "8MiB", "--content", "keep",
         "--backing", "shm-segmented", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready = json.loads(keeper.stdout.readline() or "null")
        assert ready and ready["name"] == name, keeper.stderr.read()
        hl.install({"threads": 1, "lease": {"keeper": name, "tag": "model-x"}})
        try:
            alloc = PinMemoryAllocator(8 * MiB)
            pool = _in_a_pool(alloc.buffer)  # writes 1..8 at the start
            assert pool.report["keeper"]["generation"] == 1
            assert pool.report["prefault"]["bytes"] == 0
            alloc.close()
            again = PinMemoryAllocator(8 * MiB)
            lease = hl.get_pool(again.buffer.data_ptr()).report["keeper"]
            assert lease["generation"] == 2 and lease["tag"] == "model-x"
            assert lease["previous"]["how"] == "closed"
            assert bytes(again.buffer[:8].tolist()) == bytes(range(1, 9))
            again.close()
        finally:
            hl.uninstall()
    finally:
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=10) == 0, keeper.stderr.read()


def test_the_adapter_installs_once_and_uninstall_puts_back_every_object_lmcache_had():
    """Issue 38: importing hostpool.lmcache patches nothing; installing twice is
    installing once; uninstalling leaves every attribute of LMCache's loaded modules
    and of their classes (the Mooncake store connector's methods included) the very
    object it was."""
    import os

    out = run_python(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        from engine_support import engine_objects, assert_same_objects
        import lmcache.v1.memory_management as mm
        import lmcache.v1.storage_backend.connector.mooncakestore_connector as conn
        before = engine_objects("lmcache")
        import hostpool.lmcache as hl
        assert_same_objects(before, engine_objects("lmcache"), "import hostpool.lmcache")
        hl.install({{"threads": 1}})
        once = engine_objects("lmcache")
        assert mm._allocate_cpu_memory is not before[(mm.__name__, "_allocate_cpu_memory")]
        assert vars(conn.MooncakestoreConnector)["_register_cpu_buffer"] is not before[
            (conn.__name__, "MooncakestoreConnector", "_register_cpu_buffer")]
        hl.install({{"threads": 2}})
        assert_same_objects(once, engine_objects("lmcache"), "a second install")
        hl.uninstall()
        assert_same_objects(before, engine_objects("lmcache"), "uninstall")
        print(json.dumps({{"ok": True, "installed": hl.installed()}}))
    """))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ok": True, "installed": False}


def test_an_lmcache_lacking_a_name_the_adapter_needs_is_refused_naming_it_and_nothing_is_patched(monkeypatch, caplog):
    from engine_support import assert_same_objects, engine_objects
    from hostpool import _engines

    monkeypatch.delattr(mm, "_free_cpu_memory")
    before = engine_objects("lmcache")
    with pytest.raises(hostpool.EngineVersionError) as raised:
        hl.install()
    e = raised.value
    assert e.engine == "lmcache" and e.missing == ("lmcache.v1.memory_management._free_cpu_memory",)
    assert e.tested == _engines.TESTED["lmcache"] and not hl.installed()
    assert_same_objects(before, engine_objects("lmcache"), "a refused install")
    # vLLM's plug-in door never raises: it says why, as an error, and installs nothing.
    monkeypatch.setenv(hl.ENV_VAR, '{"threads": 1}')
    with caplog.at_level("ERROR", logger="hostpool.lmcache"):
        hl._vllm_general_plugin()
    assert not hl.installed()
    assert any("_free_cpu_memory" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records), caplog.text
