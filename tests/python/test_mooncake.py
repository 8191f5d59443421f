"""Mooncake from Python, against the released wheel
(mooncake-transfer-engine-non-cuda, TCP on loopback): a pool registered with
a TransferEngine and a MooncakeDistributedStore in regions that never split
a block or a page, all or nothing; bytes moved between two processes' pools
both ways; a pool as a Store segment (hugetlbfs, kept) with a master the
test starts; the pool's close() undoing both first; a peer or the master
SIGKILLed mid-transfer; a Store client SIGKILLed with a kept segment, and
the restarted one mounting the same pages, resident."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from mooncake.engine import TransferEngine
from mooncake.store import MooncakeDistributedStore

import hostpool
import hostpool.mooncake
from conftest import hugetlbfs_mount, spawn_ranks
from mooncake_peer import pattern, start_master

MiB = 1 << 20
PEER = os.path.join(os.path.dirname(__file__), "mooncake_peer.py")


def engine() -> TransferEngine:
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return e


@pytest.fixture
def master():
    m = start_master()
    yield m
    m.stop()


def store(master, segment: int = 0) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", master.metadata, segment, 16 * MiB, "tcp", "", master.address) == 0
    return s


class Peer:
    """tests/python/mooncake_peer.py in its own process."""

    def __init__(self, pool_kwargs: dict, max_region: str | None = None):
        args = [sys.executable, PEER, json.dumps(pool_kwargs)] + ([max_region] if max_region else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._line()
        self.target = f"127.0.0.1:{self.info['rpc_port']}"

    def _line(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"the peer exited with {self.proc.wait(timeout=30)}"
        return json.loads(line)

    def ask(self, *words) -> dict:
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        return self._line()

    def close(self) -> dict:
        out = self.ask("close")
        assert self.proc.wait(timeout=60) == 0
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def blocks(e, pool, target, remote, write) -> int:
    step = pool.block_size
    for off in range(0, pool.nbytes, step):
        call = e.transfer_sync_write if write else e.transfer_sync_read
        code = call(target, pool.addr + off, remote + off, min(step, pool.nbytes - off))
        if code != 0:
            return code
    return 0


def test_regions_never_split_a_block_or_a_page_and_keep_to_the_limit():
    # A 3 MiB block does not divide the 8 MiB limit: regions of two blocks.
    with hostpool.Pool(size=21 * MiB, backing="anon", block_size="3MiB") as pool:
        rs = hostpool.mooncake.regions(pool, "8MiB")
        assert [n for _, n in rs] == [6 * MiB, 6 * MiB, 6 * MiB, 3 * MiB]
        assert rs[0][0] == pool.addr and all(a + n == b for (a, n), (b, _) in zip(rs, rs[1:]))
        assert sum(n for _, n in rs) == pool.mapped_bytes
        assert hostpool.mooncake.regions(pool) == [(pool.addr, pool.mapped_bytes)]
        with pytest.raises(hostpool.ConfigError, match=r"max_region of 1 MiB is smaller than one 3 MiB"):
            hostpool.mooncake.regions(pool, "1MiB")
    with pytest.raises(hostpool.Error, match="closed"):
        pool.regions()


def test_a_limit_smaller_than_a_huge_page_is_refused_naming_both():
    mount = hugetlbfs_mount("2M")
    with hostpool.Pool(size=8 * MiB, backing="hugetlbfs", dir=mount) as pool:
        assert pool.page_size == 2 * MiB
        with pytest.raises(hostpool.ConfigError, match=r"max_region of 1 MiB .* 2 MiB pages"):
            hostpool.mooncake.register(pool, engine(), max_region="1MiB")
        # 3 MiB blocks on 2 MiB pages: a region is a multiple of 6 MiB.
    with hostpool.Pool(size=24 * MiB, backing="hugetlbfs", dir=mount, block_size="3MiB") as pool:
        assert [n for _, n in hostpool.mooncake.regions(pool, "13MiB")] == [12 * MiB, 12 * MiB]


def test_the_config_table_gives_the_limit():
    config = {"size": "8MiB", "backing": "anon", "block_size": "1MiB", "mooncake": {"max_region": "2MiB"}}
    with hostpool.Pool.from_config(config) as pool:
        assert pool.plugin_table("mooncake") == {"max_region": "2MiB"}
        assert [n for _, n in hostpool.mooncake.regions(pool)] == [2 * MiB] * 4
        e = engine()
        reg = hostpool.mooncake.register(pool, e)
        assert len(reg.regions) == 4 and reg.peer["rpc_port"] == e.get_rpc_port()
    with pytest.raises(hostpool.ConfigError, match=r"\[mooncake\].*max_regon"):
        hostpool.Pool.from_config({"size": "8MiB", "mooncake": {"max_regon": "2MiB"}})


class Failing:
    """The real engine, whose `n`th registration fails (as Mooncake's own
    -600 would), or whose batch call registers everything and then fails."""

    def __init__(self, real, fail_at: int | None = None, batch_fails: bool = False):
        self.real, self.fail_at, self.calls = real, fail_at, []
        if batch_fails:
            self.batch_register_memory = self._batch

    def register_memory(self, addr, length, location="*"):
        self.calls.append(("reg", addr))
        if len([c for c in self.calls if c[0] == "reg"]) == self.fail_at:
            return -1
        return self.real.register_memory(addr, length, location)

    def _batch(self, addrs, lens, location="*"):
        assert self.real.batch_register_memory(addrs, lens, location) == 0
        return -1

    def unregister_memory(self, addr):
        self.calls.append(("unreg", addr))
        return self.real.unregister_memory(addr)

    def get_rpc_port(self):
        return self.real.get_rpc_port()


def test_a_failed_registration_is_rolled_back_in_reverse_through_the_real_engine():
    e = engine()
    with hostpool.Pool(size=8 * MiB, backing="anon", block_size="1MiB") as pool:
        failing = Failing(e, fail_at=3)
        with pytest.raises(hostpool.Error, match=r"region 2 of 4 .* the 2 region\(s\) before it were unregistered in reverse"):
            hostpool.mooncake.register(pool, failing, max_region="2MiB")
        regs = [a for k, a in failing.calls if k == "reg"]
        assert [c[0] for c in failing.calls] == ["reg", "reg", "reg", "unreg", "unreg"]
        assert [a for k, a in failing.calls if k == "unreg"] == regs[:2][::-1]
        # The real engine holds nothing: it refuses overlapping regions
        # (-600), and the whole pool registers again.
        batch = Failing(e, batch_fails=True)
        with pytest.raises(hostpool.Error, match=r"4 regions .* batch_register_memory .* every region was unregistered"):
            hostpool.mooncake.register(pool, batch, max_region="2MiB")
        reg = hostpool.mooncake.register(pool, e, max_region="2MiB")
        with pytest.raises(hostpool.Error, match=r"region 0 of 1 .* -7 \(the range overlaps"):
            hostpool.mooncake.register(pool, e)  # the same memory twice
        assert reg.registered
    assert not reg.registered  # close() unregistered it first


@pytest.mark.parametrize("kind", ["anon", "shm", "hugetlbfs-2M"])
def test_two_processes_move_bytes_through_their_pools_both_ways(kind):
    kwargs = {"size": 32 * MiB, "block_size": "2MiB"}
    kwargs.update({"anon": {"backing": "anon"}, "shm": {"dir": "/dev/shm"}}.get(kind) or {"backing": "hugetlbfs", "dir": hugetlbfs_mount("2M")})
    peer = Peer(kwargs, max_region="8MiB")
    try:
        assert len(peer.info["regions"]) == 4
        e = engine()
        with hostpool.Pool(**kwargs) as pool:
            reg = hostpool.mooncake.register(pool, e, max_region="6MiB")  # not the peer's split
            assert len(reg.regions) == 6
            view = np.frombuffer(memoryview(pool), dtype=np.uint8)
            view[:] = pattern(1, pool.nbytes)
            assert blocks(e, pool, peer.target, peer.info["addr"], write=True) == 0
            assert peer.ask("check", 1) == {"same": True}
            assert peer.ask("fill", 2) == {"filled": True}
            assert blocks(e, pool, peer.target, peer.info["addr"], write=False) == 0
            assert np.array_equal(view, pattern(2, pool.nbytes))
            # The peer writes back into this pool, through its own engine.
            assert peer.ask("write", f"127.0.0.1:{e.get_rpc_port()}", pool.addr, 3) == {"code": 0}
            assert np.array_equal(view, pattern(3, pool.nbytes))
            # A request crossing two of this pool's regions is refused:
            # Mooncake moves a request within one registered region.
            assert e.transfer_sync_write(peer.target, pool.addr, peer.info["addr"] + 7 * MiB, 2 * MiB) != 0
            del view
        assert not reg.registered
        assert peer.close() == {"closed": True, "registered": False, "issues": []}
    finally:
        peer.kill()


def test_a_closed_pool_is_unregistered_before_its_memory_goes():
    peer = Peer({"size": 8 * MiB, "backing": "anon", "block_size": "1MiB"})
    try:
        e = engine()
        pool = hostpool.Pool(size=8 * MiB, backing="anon", block_size="1MiB")
        hostpool.mooncake.register(pool, e)
        target = f"127.0.0.1:{e.get_rpc_port()}"
        assert peer.ask("write", target, pool.addr, 5) == {"code": 0}
        assert pool.close() == []
        # The peer's write now finds no registered memory here: it fails
        # instead of landing where the pool was.
        assert peer.ask("write", target, pool.addr, 6)["code"] != 0
        assert peer.close()["issues"] == []
    finally:
        peer.kill()


def test_a_peer_killed_mid_transfer_gives_an_error_and_the_pool_closes_cleanly():
    size = 256 * MiB
    peer = Peer({"size": size, "backing": "anon"})
    try:
        e = engine()
        with hostpool.Pool(size=size, backing="anon") as pool:
            reg = hostpool.mooncake.register(pool, e)
            out = {}
            started = threading.Event()

            def read():
                started.set()
                out["code"] = e.transfer_sync_read(peer.target, pool.addr, peer.info["addr"], size)

            t = threading.Thread(target=read)
            t.start()
            started.wait(30)
            peer.kill()
            t.join(60)
            assert not t.is_alive(), "the transfer hung after its peer died"
            # Either the peer died mid-transfer (an error) or the transfer
            # won the race; a new transfer to a dead peer is an error.
            assert out["code"] in (0, -1)
            assert e.transfer_sync_read(peer.target, pool.addr, peer.info["addr"], MiB) != 0
        assert not reg.registered and pool.closed
    finally:
        peer.kill()


@pytest.mark.parametrize("segment", ["hugetlbfs-2M", "kept"])
def test_a_pool_is_a_store_segment_and_another_puts_and_gets_through_a_registered_pool(master, segment, keeper, tmp_path):
    if segment == "kept":
        keeper("mc-seg", "--size", str(64 * MiB))
        seg_pool = hostpool.Pool(keeper="mc-seg")
    else:
        seg_pool = hostpool.Pool(size=64 * MiB, backing="hugetlbfs", dir=hugetlbfs_mount("2M"))
    try:
        server = store(master, segment=0)  # no segment of its own
        mount = hostpool.mooncake.mount(seg_pool, server)
        assert mount.mounted and sum(s["size"] for s in mount.segments) == 64 * MiB
        # Each of the pool's files is mounted: a linked one by its name, an
        # unlinked one or a memfd (a kept pool's) by this process's descriptor.
        expected = [path if path is not None else f"/proc/self/fd/{fd}" for fd, _, _, path in seg_pool.files()]
        assert [s["path"] for s in mount.segments] == expected
        client = store(master)
        with hostpool.Pool(size=32 * MiB, backing="anon", block_size="4MiB") as pool:
            reg = hostpool.mooncake.register(pool, client, max_region="8MiB")
            assert reg.kind == "store" and len(reg.regions) == 4
            view = np.frombuffer(memoryview(pool), dtype=np.uint8)
            view[: 8 * MiB] = pattern(7, 8 * MiB)
            assert client.put_from("obj", pool.addr, 8 * MiB) == 0
            assert client.get_into("obj", pool.addr + 16 * MiB, 8 * MiB) == 8 * MiB
            assert np.array_equal(view[16 * MiB : 24 * MiB], pattern(7, 8 * MiB))
            # The object lives in the segment pool: its bytes are there.
            seg = np.frombuffer(memoryview(seg_pool), dtype=np.uint8)
            assert bytes(pattern(7, 8 * MiB)[: 1 * MiB]) in seg.tobytes()
            del seg, view
        assert not reg.registered
        assert seg_pool.close() == []
        assert not mount.mounted
        assert client.close() == 0 and server.close() == 0
    finally:
        seg_pool.close()


GENERATION_1 = """
import sys, time, hostpool, hostpool.mooncake
from mooncake.store import MooncakeDistributedStore
pool = hostpool.Pool(keeper=sys.argv[1])
server = MooncakeDistributedStore()
assert server.setup("127.0.0.1", sys.argv[2], 0, 16 << 20, "tcp", "", sys.argv[3]) == 0
hostpool.mooncake.mount(pool, server)
pool.view(pool.nbytes - 6, 6)[:] = b"gen-1!"
print(pool.report["keeper"]["generation"], flush=True)
time.sleep(600)
"""


def resident_pages(pool) -> tuple[int, int]:
    """(resident, all) pages of the pool's mapping, by mincore(2): for a file
    the kernel's page cache, whether or not this process has touched them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    n = (pool.nbytes + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(pool.addr), ctypes.c_size_t(pool.nbytes), vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec), n


def wait_for(what: str, check, deadline: float = 60):
    end = time.monotonic() + deadline
    while not (got := check()):
        assert time.monotonic() < end, f"{what}: not within {deadline} s"
        time.sleep(0.05)
    return got


def test_a_restarted_store_client_mounts_its_kept_pool_resident_and_serves_from_it(keeper):
    # A client SIGKILLed with the kept pool as its segment; the master drops
    # the dead client's segment after its TTL; the restarted client leases
    # the same pages, resident and with their bytes, and mounts them again.
    m = start_master(60, "--client_ttl=3")
    name = f"mc-restart-{os.getpid()}"
    keeper(name, "--size", str(64 * MiB), "--content", "keep")
    try:
        gen1 = subprocess.Popen(
            [sys.executable, "-c", GENERATION_1, name, m.metadata, m.address], stdout=subprocess.PIPE, text=True
        )
        try:
            assert gen1.stdout.readline().strip() == "1"
            assert m.metric("master_total_capacity_bytes") == 64 * MiB
        finally:
            gen1.kill()
            gen1.wait(timeout=30)
        wait_for("the master drops the dead client's segment", lambda: m.metric("master_total_capacity_bytes") == 0)

        def lease():
            try:
                return hostpool.Pool(keeper=name)
            except hostpool.KeeperError:  # until the keeper has seen the death
                return None

        with wait_for("the keeper leases the pool again", lease) as pool:
            prev = pool.report["keeper"]["previous"]
            assert prev["how"] == "died" and prev["pid"] == gen1.pid
            assert pool.report["prefault"]["bytes"] == 0
            resident, pages = resident_pages(pool)
            assert resident == pages, f"{resident} of the kept pool's {pages} pages are resident"
            assert bytes(pool.view(pool.nbytes - 6, 6)) == b"gen-1!"
            server = store(m, segment=0)
            mount = hostpool.mooncake.mount(pool, server)
            assert m.metric("master_total_capacity_bytes") == 64 * MiB
            client = store(m)
            with hostpool.Pool(size=8 * MiB, backing="anon") as buf:
                reg = hostpool.mooncake.register(buf, client)
                view = np.frombuffer(memoryview(buf), dtype=np.uint8)
                view[: 4 * MiB] = pattern(11, 4 * MiB)
                assert client.put_from("after-restart", buf.addr, 4 * MiB) == 0
                assert client.get_into("after-restart", buf.addr + 4 * MiB, 4 * MiB) == 4 * MiB
                assert np.array_equal(view[4 * MiB :], pattern(11, 4 * MiB))
                assert bytes(pattern(11, 4 * MiB)[: MiB]) in bytes(pool.view(0, pool.nbytes))
                del view
            assert not reg.registered
        assert not mount.mounted
        assert m.metric("master_total_capacity_bytes") == 0
        assert client.close() == 0 and server.close() == 0
    finally:
        m.stop()


def test_an_anonymous_pool_cannot_be_a_segment():
    with hostpool.Pool(size=8 * MiB, backing="anon") as pool:
        assert pool.files() == []
        with pytest.raises(hostpool.ConfigError, match=r"anonymous memory.*shm-segmented.*hugetlbfs"):
            hostpool.mooncake.mount(pool, MooncakeDistributedStore())


def test_the_master_killed_mid_put_gives_an_error_and_the_pools_close(master):
    client = store(master)
    with hostpool.Pool(size=64 * MiB, dir="/dev/shm") as seg_pool, hostpool.Pool(size=64 * MiB, backing="anon") as pool:
        server = store(master)
        hostpool.mooncake.mount(seg_pool, server)
        reg = hostpool.mooncake.register(pool, client)
        out = {}
        started = threading.Event()

        def put():
            started.set()
            out["code"] = client.put_from("big", pool.addr, 32 * MiB)

        t = threading.Thread(target=put)
        t.start()
        started.wait(30)
        os.kill(master.proc.pid, signal.SIGKILL)
        master.stop()
        t.join(120)
        assert not t.is_alive(), "put_from hung after the master died"
        assert out["code"] in (0, -900)  # done before the kill, or RPC_FAIL
        assert client.put_from("after", pool.addr, MiB) != 0
        # With no master, Mooncake refuses to unregister and unmount: each
        # refusal is a teardown issue naming it, and the memory goes all the same.
        issues = pool.close()
        assert [i["step"] for i in issues] == ["before close"] and "Mooncake" in issues[0]["detail"], issues
        issues = seg_pool.close()
        assert [i["step"] for i in issues] == ["before close"] and "-900" in issues[0]["detail"], issues
    assert pool.closed and seg_pool.closed and not reg.registered
    client.close()
    server.close()


def test_the_registration_benchmark_runs_and_measures_against_memcpy():
    mount = hugetlbfs_mount("2M")
    bench = os.path.join(os.path.dirname(__file__), "../../crates/hostpool-py/bench/mooncake_register.py")
    out = subprocess.run(
        [sys.executable, bench, "--dir", mount, "--size", "16MiB", "--max-region", "4MiB",
         "--transfer", "8MiB", "--repeat", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    for what in ("engine", "store"):
        for page in ("2MiB", "4KiB"):
            assert got[f"register_{what}_{page}"] > 0 and got[f"register_{what}_{page}_regions"] == 1
            assert got[f"register_{what}_{page}_split_regions"] == 4
    assert 0 < got["write_to_memcpy"] and 0 < got["read_to_memcpy"] and got["memcpy_Bps"] > 0
    assert got["segment_fill_bytes"] == 12 * MiB  # three quarters of 16 MiB, in 2 MiB objects
    assert got["segment_own_fill"] > 0 and got["segment_hostpool_fill"] > 0 and got["segment_fill_own_to_hostpool"] > 0


def _shard_rank(name, rank, out):
    import hostpool
    import hostpool.mooncake
    from mooncake.engine import TransferEngine

    try:
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        with hostpool.Pool(size="64MiB", block_size="4MiB", shared=hostpool.Shared(name, 2, rank, attach_timeout=20.0)) as pool:
            reg = hostpool.mooncake.register(pool, e, max_region="8MiB")
            out.put((rank, pool.addr, pool.shard, [(a - pool.addr, n) for a, n in reg.regions]))
    except Exception as exc:  # reported to the parent
        out.put((rank, None, None, f"{type(exc).__name__}: {exc}"))


def test_each_rank_of_a_shared_pool_registers_its_own_shard_only():
    results = spawn_ranks(_shard_rank, f"py-mc-{os.getpid()}", 2)
    covered = []
    for rank, _, shard, regions in results:
        assert isinstance(regions, list), regions
        offset, length = shard
        assert regions[0][0] == offset and sum(n for _, n in regions) == length, (rank, shard, regions)
        assert all(n <= 8 * MiB and n % (4 * MiB) == 0 for _, n in regions)
        covered.append((offset, offset + length))
    (a0, a1), (b0, b1) = sorted(covered)
    assert a0 == 0 and a1 == b0 and b1 == 64 * MiB  # disjoint, and the whole pool between them


def test_a_refused_close_leaves_the_registration_and_a_later_close_ends_it():
    e = engine()
    pool = hostpool.Pool(size=8 * MiB, backing="anon")
    reg = hostpool.mooncake.register(pool, e)
    view = memoryview(pool)
    with pytest.raises(hostpool.PoolBusyError):
        pool.close()
    assert reg.registered and not pool.closed
    view.release()
    reg.unregister()  # by hand: close() then has nothing of it left to undo
    assert not reg.registered
    reg.unregister()  # idempotent
    again = hostpool.mooncake.register(pool, e)  # the range is free in the engine again
    assert pool.close() == [] and not again.registered


def test_python_m_hostpool_doctor_probes_its_own_interpreters_mooncake(hostpool_bin):
    env = {k: v for k, v in os.environ.items() if k != "HOSTPOOL_PYTHON"}
    # `python -m hostpool` runs the CLI beside the package, else the one on the PATH.
    env["PATH"] = f"{os.path.dirname(hostpool_bin)}:{env.get('PATH', '')}"
    out = subprocess.run([sys.executable, "-m", "hostpool", "doctor", "--json"], capture_output=True, text=True, env=env, timeout=120)
    found = [f for f in json.loads(out.stdout)["findings"] if f["area"] == "mooncake"]
    assert len(found) == 1 and found[0]["verdict"] == "ok", found
    assert found[0]["details"]["executable"] == sys.executable
    assert "mooncake-transfer-engine-non-cuda 0.3.13.post1" in found[0]["value"] and "tcp" in found[0]["value"]
