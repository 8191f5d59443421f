"""hostpool.Pool on one process: zero-copy exports, lifetime, attributes,
errors, progress, logging, the GIL and Ctrl-C."""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import hostpool
from conftest import (
    free_hugepages,
    hugetlbfs_mount,
    run_python,
    shared_mapped,
    socket_bound,
    spawn_ranks,
)

MiB = 1 << 20


def test_each_backing_hands_out_its_own_memory_with_zero_copies(backing_kwargs):
    with hostpool.Pool(size=64 * MiB, **backing_kwargs) as pool:
        assert pool.nbytes == 64 * MiB and pool.mapped_bytes >= pool.nbytes
        assert pool.addr % pool.page_size == 0
        arr = np.frombuffer(pool, dtype=np.uint8)
        assert arr.ctypes.data == pool.addr and arr.size == pool.nbytes
        ten = torch.frombuffer(pool, dtype=torch.uint8)
        assert ten.data_ptr() == pool.addr
        dl = torch.from_dlpack(pool)
        assert dl.data_ptr() == pool.addr and dl.device.type == "cpu"
        npdl = np.from_dlpack(pool)
        assert npdl.ctypes.data == pool.addr
        mv = memoryview(pool)
        assert (mv.nbytes, mv.readonly, mv.format) == (pool.nbytes, False, "B")
        # A write through one view is read through every other.
        last = pool.nbytes - 1
        arr[0], ten[4096], mv[last] = 11, 22, 33
        assert dl[0].item() == 11 and npdl[4096] == 22 and ten[last].item() == 33
        part = pool.view(3 * 4096, 8)
        part[0] = 44
        assert arr[3 * 4096] == 44
        del arr, ten, dl, npdl, mv, part
    assert pool.closed


def test_the_page_size_is_the_backings():
    with hostpool.Pool(size=4 * MiB, dir=hugetlbfs_mount("2M")) as pool:
        assert (pool.backing, pool.page_size) == ("hugetlbfs", 2 * MiB)
    with hostpool.Pool(size=4 * MiB, dir="/dev/shm") as pool:
        assert (pool.backing, pool.page_size) == ("shm-segmented", 4096)


def test_1g_pages_are_used_when_asked_for():
    mount = hugetlbfs_mount("1G")
    before = free_hugepages(1 << 20)
    with hostpool.Pool(size=1 << 30, backing="hugetlbfs", dir=mount, threads=1) as pool:
        assert pool.page_size == 1 << 30
        assert free_hugepages(1 << 20)[0] == before[0] - 1
        np.frombuffer(pool, dtype=np.uint8)[-1] = 1
    assert free_hugepages(1 << 20) == before


def test_the_report_has_the_clis_fields_and_values(hostpool_bin):
    cli = subprocess.run(
        [hostpool_bin, "alloc", "--size", "16MiB", "--backing", "anon", "--json"],
        capture_output=True, text=True, check=True,
    )
    cli_report = json.loads(cli.stdout)
    with hostpool.Pool(size="16MiB", backing="anon") as pool:
        report = pool.report
        assert set(report) == set(cli_report) - {"phases"} | {"phases"}
        for key in ("backing", "page_size", "logical_bytes", "mapped_bytes", "options"):
            assert report[key] == cli_report[key], key
        assert report["address"] == hex(pool.addr)
        assert "prefault" in report["phases"] and "teardown" not in report["phases"]
    assert "teardown" in pool.report["phases"]
    assert pool.report["teardown_issues"] == []


def test_close_refuses_while_exports_live_and_leaves_the_pool_intact():
    pool = hostpool.Pool(size=4 * MiB)
    for export in (memoryview, lambda p: np.frombuffer(p, np.uint8), torch.from_dlpack,
                   lambda p: pool.view(0, 10)):
        held = export(pool)
        with pytest.raises(hostpool.PoolBusyError, match="export"):
            pool.close()
        assert not pool.closed
        held[0] = 5  # still mapped and writable
        del held
        gc.collect()
    # An unconsumed DLPack capsule holds the memory too, until it is collected.
    capsule = pool.__dlpack__(max_version=(1, 0))
    with pytest.raises(hostpool.PoolBusyError):
        pool.close()
    del capsule
    assert pool.close() == []
    assert pool.closed and pool.close() == []  # idempotent
    with pytest.raises(hostpool.Error, match="closed"):
        memoryview(pool)
    with pytest.raises(hostpool.Error, match="closed"):
        torch.from_dlpack(pool)


def test_a_torch_frombuffer_tensor_that_outlives_close_never_reaches_foreign_memory():
    # torch.frombuffer keeps the pool object but releases the buffer export
    # at once, so close() cannot see the tensor: the pool's memory is given
    # back, and its range stays ours (zero pages) until the pool object goes.
    mount = hugetlbfs_mount("2M")
    before = free_hugepages(2048)
    pool = hostpool.Pool(size=8 * MiB, dir=mount)
    tensor = torch.frombuffer(pool, dtype=torch.uint8)
    tensor[:] = 9
    assert pool.close() == []
    assert free_hugepages(2048) == before, "the huge pages are given back at close"
    assert tensor.sum().item() == 0, "the stale tensor reads the placeholder's zeros"
    tensor[0] = 1  # and writes to pages of its own
    addr = pool.addr
    del pool
    gc.collect()
    assert _mapped(addr), "the range is kept while the tensor holds the pool object"
    del tensor
    gc.collect()
    assert not _mapped(addr), "and unmapped once the last holder is gone"


def _mapped(addr: int) -> bool:
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return True
    return False


def test_a_pool_collected_without_close_is_torn_down():
    before = free_hugepages(2048)
    pool = hostpool.Pool(size=8 * MiB, dir=hugetlbfs_mount("2M"))
    assert free_hugepages(2048)[0] == before[0] - 4
    del pool
    gc.collect()
    assert free_hugepages(2048) == before


def test_view_is_bounded():
    with hostpool.Pool(size=1 * MiB) as pool:
        assert pool.view(MiB - 1, 1).nbytes == 1
        for offset, n in ((MiB, 1), (0, MiB + 1), (2**63, 2**63)):
            with pytest.raises(ValueError, match="outside the pool"):
                pool.view(offset, n)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"size": "12XB"}, "unknown unit `XB`"),
        ({"size": -1}, "not a size in bytes"),
        ({"size": True}, "not a bool"),
        ({"size": 0}, "size"),
        ({"size": "1MiB", "backing": "nope"}, "unknown backing `nope`"),
        ({"size": "1MiB", "prefault": "fast"}, "not a prefault method"),
        ({"size": "1MiB", "threads": 0}, "1 or more"),
        ({"size": "1MiB", "pin_required": True}, "needs a pinner"),
        ({"size": "1MiB", "dir": 5}, "must be a path"),
        ({"size": "1MiB", "dir": "/nonexistent/kv"}, "does not exist"),
        ({"size": "1MiB", "dir": "/dev/null"}, r"is not a directory \(it is a character device\)"),
    ],
)
def test_bad_input_is_a_config_error_with_the_clis_message(kwargs, match):
    with pytest.raises(hostpool.ConfigError, match=match) as info:
        hostpool.Pool(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert info.value.exit_code == 2


def test_bad_shared_arguments_are_config_errors():
    with pytest.raises(hostpool.ConfigError, match="rank 4 must be below world 4"):
        hostpool.Shared("kv", 4, 4)
    for world in (-1, 0, 257):
        with pytest.raises(hostpool.ConfigError, match=f"world {world} must be between 1 and 256"):
            hostpool.Shared("kv", world, 0)
    with pytest.raises(hostpool.ConfigError, match="name"):
        hostpool.Shared("../kv", 2, 0)
    with pytest.raises(hostpool.ConfigError, match="rendezvous"):
        hostpool.Shared("kv", 2, 0, rendezvous="carrier-pigeon")


def test_a_shortage_of_huge_pages_is_a_capacity_error_with_a_remedy():
    mount = hugetlbfs_mount("2M")
    free, _ = free_hugepages(2048)
    with pytest.raises(hostpool.CapacityError) as info:
        hostpool.Pool(size=(free + 1) * 2 * MiB, backing="hugetlbfs", dir=mount)
    err = info.value
    assert "nr_hugepages" in err.remedy and err.remedy in str(err)
    assert err.need > err.free and err.exit_code == 1


def test_a_missing_peer_is_a_peer_error_naming_it():
    with pytest.raises(hostpool.PeerError, match="never attached") as info:
        hostpool.Pool(size=4 * MiB, shared=hostpool.Shared(f"py-alone-{os.getpid()}", 2, 1, attach_timeout=1.0))
    assert info.value.rank == 0 and info.value.ranks == (0,)
    assert info.value.pid is None, "a rank that never attached has no pid"
    assert info.value.exit_code == 1


def test_the_exception_classes_have_their_bases_defaults_and_module():
    import hostpool._errors
    import hostpool._hostpool
    import hostpool.torch

    assert hostpool.Error.__mro__[1] is RuntimeError
    assert hostpool.Error in hostpool.ConfigError.__mro__ and ValueError in hostpool.ConfigError.__mro__
    assert issubclass(hostpool.PoolBusyError, BufferError) and issubclass(hostpool.PoolBusyError, hostpool.Error)
    for name in ("Error", "ConfigError", "CapacityError", "PeerError", "NotAvailableError", "PinError", "PoolBusyError",
                 "KeeperError"):
        cls = getattr(hostpool, name)
        assert cls is getattr(hostpool._errors, name) is getattr(hostpool._hostpool, name)
        assert cls.__module__ == "hostpool" and cls.__qualname__ == name and cls.__doc__, name
        assert cls is hostpool.Error or issubclass(cls, hostpool.Error), name
    assert (hostpool.Error.exit_code, hostpool.ConfigError.exit_code, hostpool.PeerError.exit_code) == (1, 2, 1)
    assert (hostpool.CapacityError.remedy, hostpool.CapacityError.need, hostpool.CapacityError.free) == ("", 0, 0)
    assert (hostpool.PeerError.rank, hostpool.PeerError.ranks, hostpool.PeerError.pid) == (None, (), None)
    assert (hostpool.KeeperError.keeper, hostpool.KeeperError.pid, hostpool.KeeperError.absent) == ("", None, False)
    # Python code raises and subclasses them as before.
    err = hostpool.PeerError("rank 3 died")
    assert str(err) == "rank 3 died" and err.ranks == () and err.pid is None
    assert pickle.loads(pickle.dumps(err)).args == ("rank 3 died",)
    assert issubclass(hostpool.torch.RegionFullError, hostpool.CapacityError)
    assert issubclass(hostpool.torch.RegionFullError, AssertionError)


def test_required_cuda_pinning_without_a_driver_is_not_available():
    env = {"LD_LIBRARY_PATH": "/nonexistent"}
    code = """
import hostpool
p = hostpool.Pool(size="4MiB", pin="cuda")
print("BEST", p.pinned, p.pin_reason); p.close()
try:
    hostpool.Pool(size="4MiB", pin="cuda", pin_required=True)
except hostpool.NotAvailableError as e:
    print("REQUIRED", e.exit_code, e)
"""
    out = run_python(code, env)
    assert out.returncode == 0, out.stderr
    assert "BEST False cuda pinner is not available" in out.stdout
    assert "REQUIRED 1 cuda pinner is not available on this host: no CUDA driver" in out.stdout


def test_progress_reports_each_phase_up_to_its_total():
    calls = []
    with hostpool.Pool(size=64 * MiB, threads=2, progress=lambda *a: calls.append(a)) as pool:
        pass
    phases = [c[0] for c in calls]
    assert phases[0] == "map" and "prefault" in phases
    for phase, done, total in calls:
        assert 0 <= done <= total
    last = [c for c in calls if c[0] == "prefault"][-1]
    assert last[1] == last[2] == pool.mapped_bytes


def test_an_exception_in_progress_stops_the_build_and_leaves_nothing():
    def fail(phase, done, total):
        if phase == "prefault":
            raise RuntimeError("stop here")

    before = free_hugepages(2048)
    with pytest.raises(RuntimeError, match="stop here"):
        hostpool.Pool(size=64 * MiB, dir=hugetlbfs_mount("2M"), progress=fail)
    assert free_hugepages(2048) == before
    with hostpool.Pool(size=MiB):  # a later build is not interrupted
        pass


def test_logs_go_to_the_hostpool_logger_not_to_stderr(caplog, capfd):
    with caplog.at_level(logging.INFO, logger="hostpool"):
        pool = hostpool.Pool(size=MiB)
        del pool  # collected without close(): hostpool says so
        gc.collect()
    messages = [r.getMessage() for r in caplog.records if r.name == "hostpool" and r.levelno == logging.INFO]
    assert any("collected without close()" in m for m in messages), messages
    out, err = capfd.readouterr()
    assert "collected" not in err and "hostpool" not in err


def test_a_shared_pickles_for_spawned_ranks_and_a_pool_refuses_with_the_remedy(caplog):
    s = hostpool.Shared("kv", 4, 3, attach_timeout=5.0, barrier_timeout=7.0, rendezvous="file")
    assert pickle.loads(pickle.dumps(s)) == s
    # The temporary pool is collected while the TypeError is being raised,
    # and says so through logging: that must not clobber the error (it once
    # became "SystemError: error return without exception set").
    with caplog.at_level(logging.INFO, logger="hostpool"):
        with pytest.raises(TypeError, match="cannot be pickled.*hostpool.Shared"):
            pickle.dumps(hostpool.Pool(size=MiB))
        gc.collect()
    assert any("collected without close()" in r.getMessage() for r in caplog.records)


def test_a_bad_hostpool_log_is_said_through_the_logger():
    code = ("import logging, hostpool; logging.basicConfig(level=logging.INFO)\n"
            "p = hostpool.Pool(size='1MiB'); p.close()")
    out = run_python(code, {"HOSTPOOL_LOG": "a=b=c"})
    assert out.returncode == 0, out.stderr
    assert "WARNING:hostpool:HOSTPOOL_LOG `a=b=c` is not a log filter" in out.stderr, out.stderr


def test_other_threads_run_while_a_pool_is_built_and_torn_down():
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.002)

    t = threading.Thread(target=tick)
    t.start()
    deadline = time.monotonic() + 10
    while not ticks:  # the other thread runs
        assert time.monotonic() < deadline, "the ticking thread never ticked"
        time.sleep(0.001)
    start = time.monotonic()
    pool = hostpool.Pool(size=1 << 30, threads=1, prefault="touch")
    end = time.monotonic()
    # Teardown (releasing 262144 pages) is slow enough to tell too.
    close_start = time.monotonic()
    pool.close()
    close_end = time.monotonic()
    stop.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    # With the GIL held for the whole build, the other thread would not run.
    assert end - start > 0.05, "the build is long enough to tell"
    assert len(during) >= 5, f"{len(during)} ticks during a {end - start:.3f} s build"
    during_close = [x for x in ticks if close_start < x < close_end]
    assert close_end - close_start > 0.02, "teardown is long enough to tell"
    assert len(during_close) >= 2, f"{len(during_close)} ticks during a {close_end - close_start:.3f} s teardown"


CTRL_C = """
import os, sys, time, hostpool
def progress(phase, done, total):
    if phase == "map" and done == 0:  # a shared pool's map waits for its ranks
        print("MAPPING", flush=True)
started = time.monotonic()
try:
    # Rank 1 never comes: the build waits up to 30 s for it, unless stopped.
    # (Set the default handler: a shell ignores SIGINT in background jobs.)
    import signal; signal.signal(signal.SIGINT, signal.default_int_handler)
    hostpool.Pool(size="512MiB", shared=hostpool.Shared(f"py-ctrlc-{os.getpid()}", 2, 0, attach_timeout=30.0),
                  progress=progress)
    print("BUILT", flush=True)
except KeyboardInterrupt:
    maps = open("/proc/self/maps").read().splitlines()
    big = [m for m in maps if int(m.split()[0].split("-")[1], 16) - int(m.split()[0].split("-")[0], 16) >= 256 << 20]
    status = {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith(("RssAnon", "RssShmem"))}
    print("INTERRUPTED", len(big), status["RssAnon"], status["RssShmem"], round(time.monotonic() - started, 1), flush=True)
    with hostpool.Pool(size="1MiB"):   # the next build is not interrupted
        print("AGAIN", flush=True)
"""


def test_ctrl_c_cancels_a_build_cleanly_and_raises_keyboard_interrupt():
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "MAPPING"
    # Now waiting for the rank that never comes: the creator holds the
    # socket name and has mapped its 512 MiB, the last step before it waits.
    deadline = time.monotonic() + 20
    while not (socket_bound(f"py-ctrlc-{proc.pid}") and shared_mapped(proc.pid) >= 512 * MiB):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"never bound and mapped: {shared_mapped(proc.pid)} B mapped"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "INTERRUPTED" in out, out + err
    big, rss_anon, rss_shmem, seconds = out.split("INTERRUPTED", 1)[1].split()[:4]
    assert big == "0", "no mapping of the pool remains"
    assert int(rss_anon) + int(rss_shmem) < 256 * 1024, f"{rss_anon} + {rss_shmem} kB: the pool's pages were given back"
    assert float(seconds) < 10, f"stopped after {seconds} s, not at the 30 s attach timeout"
    assert "AGAIN" in out


def test_from_config_takes_the_clis_files_and_dicts(tmp_path):
    toml = tmp_path / "pool.toml"
    toml.write_text('size = "8MiB"\nprefault = "touch"\n[anon]\n')
    with hostpool.Pool.from_config(toml) as pool:
        assert pool.nbytes == 8 * MiB and pool.report["prefault"]["method"] == "touch"
    with hostpool.Pool.from_config({"size": "2MiB", "backing": "anon"}) as pool:
        assert pool.nbytes == 2 * MiB
    # vLLM HiSparse's keys, as its kv_connector_extra_config has them.
    with hostpool.Pool.from_config({"host_pool_gib": 0.0078125, "host_pool_dir": hugetlbfs_mount("2M")}) as pool:
        assert (pool.nbytes, pool.backing) == (8 * MiB, "hugetlbfs")
    with pytest.raises(hostpool.ConfigError, match="unknown key `sise`"):
        hostpool.Pool.from_config({"sise": "1GiB"})
    with pytest.raises(hostpool.ConfigError, match="does not exist"):
        hostpool.Pool.from_config(tmp_path / "missing.toml")


def test_plugins_lists_the_clis_plugins(hostpool_bin):
    cli = json.loads(subprocess.run([hostpool_bin, "plugins", "--json"], capture_output=True, text=True, check=True).stdout)
    assert hostpool.plugins() == cli


def test_huge_pages_prefer_falls_back_and_says_so_required_raises():
    """Issue 20: huge_pages="prefer" takes huge pages while the huge page pool
    holds the pool, and 4 KiB pages (saying why) when it cannot; "required"
    raises CapacityError; "off" never takes them."""
    hugetlbfs_mount("2M")  # the reserved pages the test counts on (or skip)
    free, _ = free_hugepages(2048)
    with hostpool.Pool(size="16MiB", huge_pages="prefer") as pool:
        assert pool.page_size == 2 * MiB and pool.backing == "hugetlbfs"
        assert pool.report["huge_pages"]["fell_back"] is False
    more = (free + 1) * 2 * MiB  # one page more than there is: never touched (no prefault)
    with hostpool.Pool(size=more, huge_pages="prefer", prefault="none") as pool:
        assert pool.page_size == 4096 and pool.backing == "anon"
        h = pool.report["huge_pages"]
        assert h["asked"] == "prefer" and h["fell_back"] is True and "4 KiB pages instead" in h["reason"]
    with pytest.raises(hostpool.CapacityError, match="nr_hugepages"):
        hostpool.Pool(size=more, huge_pages="required", prefault="none")
    with hostpool.Pool(size="4MiB", huge_pages="off") as pool:
        assert pool.page_size == 4096
    with pytest.raises(hostpool.ConfigError, match="huge page policy"):
        hostpool.Pool(size="4MiB", huge_pages="sometimes")


def test_numa_node_takes_a_number_a_list_per_rank_or_gpu_and_refuses_the_rest():
    """Issue 20: numa_node is a node number, "gpu", or for a shared pool one
    node per rank; anything else is a ConfigError that says which forms
    there are."""
    with hostpool.Pool(size="8MiB", numa_node=0) as pool:
        n = pool.report["numa"]
        assert n["asked"] == 0 and n["node"] == 0 and n["bound"] is True
        assert n["sampled"] >= 2 and n["on_node"] == n["sampled"], n
    for bad in ("banana", True, -1, 1.5, [0, "x"], {"node": 0}):
        with pytest.raises(hostpool.ConfigError, match="numa_node"):
            hostpool.Pool(size="4MiB", numa_node=bad)
    with pytest.raises(hostpool.ConfigError, match="this pool is private"):
        hostpool.Pool(size="4MiB", numa_node=[0, 0])
    with pytest.raises(hostpool.ConfigError, match="lists 3 node"):
        hostpool.Pool(size="4MiB", numa_node=[0, 0, 0], shared=hostpool.Shared("py-numa-bad", 2, 0))
    with pytest.raises(hostpool.ConfigError, match="NUMA node 99 does not exist"):
        hostpool.Pool(size="4MiB", numa_node="0,99", shared=hostpool.Shared("py-numa-bad", 2, 1))


def _numa_rank(name, rank, out):
    import hostpool

    try:
        with hostpool.Pool(size="32MiB", numa_node=(0, 0), shared=hostpool.Shared(name, 2, rank, attach_timeout=20.0)) as pool:
            out.put((rank, pool.shard, pool.report["numa"]))
    except Exception as e:  # reported to the parent
        out.put((rank, None, f"{type(e).__name__}: {e}"))


def test_each_rank_of_a_shared_pool_binds_its_own_shard():
    results = spawn_ranks(_numa_rank, f"py-numa-{os.getpid()}", 2)
    for rank, shard, numa in results:
        assert isinstance(numa, dict), numa
        assert numa["rank"] == rank and numa["node"] == 0 and numa["nodes"] == [0, 0], numa
        assert numa["bound"] is True and numa["on_node"] == numa["sampled"] >= 2, numa
        mine = numa["shards"][rank]
        assert (mine["offset"], mine["bytes"]) == tuple(shard), (mine, shard)
        assert mine["pages"] == {"0": mine["sampled"]}, mine


GPU_NUMA = """
import json, hostpool
pool = hostpool.Pool.from_config({"size": "8MiB", "numa_node": "gpu", "cuda": {"device": 1}})
print(json.dumps(pool.report["numa"]))
pool.close()
try:
    hostpool.Pool.from_config({"size": "8MiB", "numa_node": "gpu", "cuda": {"device": 5}})
except hostpool.Error as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def test_numa_node_gpu_binds_to_the_node_of_the_cuda_device(fake_cuda_dir, tmp_path):
    """The CUDA test double says where device 1 is on the PCI bus; a sysfs
    tree of this one-node host puts it on node 0, so the binding is real."""
    sysfs = tmp_path / "sysfs"
    (sysfs / "devices/system/node/node0").mkdir(parents=True)
    (sysfs / "devices/system/node/online").write_text("0\n")
    (sysfs / "devices/system/node/node0/cpulist").write_text("0-1\n")
    dev = sysfs / "bus/pci/devices/0000:bc:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("0\n")
    (dev / "local_cpulist").write_text("0-1\n")
    done = run_python(GPU_NUMA, {
        "LD_LIBRARY_PATH": str(fake_cuda_dir),
        "HOSTPOOL_TEST_SYSFS_ROOT": str(sysfs),
        "FAKE_CUDA_DEVICES": "2",
        "FAKE_CUDA_PCI_BUS_IDS": "0000:3B:00.0,0000:BC:00.0",
    })
    assert done.returncode == 0, done.stderr
    numa, failed = (json.loads(line) for line in done.stdout.splitlines())
    assert numa["asked"] == "gpu" and numa["node"] == 0 and numa["bound"] is True, numa
    assert numa["gpu"]["device"] == 1 and numa["gpu"]["pci_address"] == "0000:bc:00.0", numa
    assert numa["on_node"] == numa["sampled"] >= 2, numa
    assert "device 5" in failed["message"], failed


def test_the_version_is_the_workspaces_everywhere(hostpool_bin):
    """hostpool.__version__, the wheel's metadata, the CLI's --version and every
    report carry the workspace's version."""
    import importlib.metadata
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[2]
    want = tomllib.loads((root / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    assert hostpool.__version__ == want
    assert importlib.metadata.version("hostpool") == want
    cli = subprocess.run([hostpool_bin, "--version"], capture_output=True, text=True, check=True)
    assert cli.stdout.strip() == f"hostpool {want}"
    with hostpool.Pool(size="4MiB") as pool:
        assert pool.report["version"] == want
    assert hostpool.plan({"size": "4MiB"})["version"] == want
