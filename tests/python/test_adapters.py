"""hostpool.torch, hostpool.sglang and hostpool.lmcache: zero copy, layout, errors."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import hostpool
import hostpool.lmcache as lmcache
from conftest import hugetlbfs_mount, run_python
from hostpool.sglang import HostPoolAllocator
from hostpool.torch import OffloadRegion, as_tensor

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture
def pool():
    with hostpool.Pool(size=4 * MiB) as p:
        yield p


# ---------------------------------------------------------------- hostpool.torch


def test_base_package_and_lmcache_do_not_import_torch():
    code = "import sys, hostpool, hostpool.lmcache; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_as_tensor_is_the_pool_without_a_copy(pool):
    t = as_tensor(pool)
    assert t.dtype == torch.int8 and t.shape == (pool.nbytes,)
    assert t.data_ptr() == pool.addr
    t[12345] = 77
    assert memoryview(pool)[12345] == 77
    np.frombuffer(pool, dtype=np.uint8)[999] = 5
    assert t[999].item() == 5


def test_as_tensor_counts_whole_elements():
    with hostpool.Pool(size=MiB + 6) as p:
        t = as_tensor(p, torch.float32)
        assert t.shape == ((MiB + 6) // 4,)
        assert t.data_ptr() == p.addr
        t[-1] = 1.5
        assert np.frombuffer(p.view(MiB, 4), dtype=np.float32)[0] == 1.5
        del t


def test_as_tensor_keeps_the_pool_busy_until_deleted():
    p = hostpool.Pool(size=MiB)
    t = as_tensor(p, torch.int64)
    view = t[10:20]
    with pytest.raises(hostpool.PoolBusyError):
        p.close()
    assert not p.closed
    del t, view
    assert p.close() == []
    assert p.closed


def region_pool(world, page, blocks):
    return hostpool.Pool(size=world * page * blocks)


def test_worker_views_have_vllm_layout_and_share_memory():
    world, page, blocks = 4, 8 * KiB, 16
    with region_pool(world, page, blocks) as p:
        regions = [OffloadRegion(p, cpu_page_size=page, world=world, rank=r) for r in range(world)]
        assert all(r.num_blocks == blocks and r.row_stride == world * page for r in regions)
        views = []
        for r, region in enumerate(regions):
            k = region.create_next_worker_view(3 * KiB)
            v = region.create_next_worker_view(5 * KiB)
            assert k.shape == (blocks, 3 * KiB) and k.stride() == (world * page, 1)
            assert k.dtype == torch.int8
            assert k.data_ptr() == p.addr + r * page
            assert v.data_ptr() == p.addr + r * page + 3 * KiB
            assert region.worker_offset == region.worker_area_end == (r + 1) * page
            k.fill_(r + 1)
            v.fill_(-(r + 1))
            views += [k, v]
        # Read the writes back through an unrelated view: numpy over the whole pool.
        rows = np.frombuffer(p, dtype=np.int8)[: blocks * world * page].reshape(blocks, world, page)
        for r in range(world):
            assert (rows[:, r, : 3 * KiB] == r + 1).all()
            assert (rows[:, r, 3 * KiB :] == -(r + 1)).all()
        # And through the scheduler side's memoryview (rank=None).
        sched = OffloadRegion(p, cpu_page_size=page, world=world, rank=None)
        kv = sched.create_kv_memoryview()
        assert kv.shape == (blocks, world * page)
        assert kv[blocks - 1, 2 * page] == 3  # last block, rank 2's K
        del rows, kv, views, k, v
        for region in regions + [sched]:
            region.cleanup()


def test_worker_view_overflow_raises_and_keeps_the_cursor(pool):
    region = OffloadRegion(pool, cpu_page_size=64 * KiB, world=2, rank=1)
    first = region.create_next_worker_view(60 * KiB)
    cursor = region.worker_offset
    assert cursor == 64 * KiB + 60 * KiB
    with pytest.raises(hostpool.CapacityError, match="exceeds worker area end"):
        region.create_next_worker_view(4 * KiB + 1)
    assert region.worker_offset == cursor
    assert len(region.views) == 1
    last = region.create_next_worker_view(4 * KiB)  # exactly fills the slot
    assert last.data_ptr() == pool.addr + cursor
    assert region.worker_offset == region.worker_area_end
    del first, last
    region.cleanup()


def test_canonical_views_span_the_row_and_overflow_cleanly(pool):
    region = OffloadRegion(pool, cpu_page_size=16 * KiB, world=4, rank=None)
    a = region.create_next_canonical_view(40 * KiB)
    b = region.create_next_canonical_view(24 * KiB)
    assert a.data_ptr() == pool.addr and b.data_ptr() == pool.addr + 40 * KiB
    assert b.stride() == (64 * KiB, 1)
    with pytest.raises(hostpool.CapacityError):
        region.create_next_canonical_view(1)
    assert region.canonical_offset == 64 * KiB
    with pytest.raises(ValueError):
        region.create_next_worker_view(KiB)  # the scheduler has no worker slot
    del a, b
    region.cleanup()


def test_region_arguments_are_checked(pool):
    with pytest.raises(ValueError):
        OffloadRegion(pool, cpu_page_size=4 * KiB, world=2, rank=2)
    with pytest.raises(ValueError):
        OffloadRegion(pool, cpu_page_size=4 * KiB, world=2, rank=0, row_stride=4 * KiB)
    with pytest.raises(hostpool.CapacityError):
        OffloadRegion(pool, cpu_page_size=4 * KiB, world=2, rank=0, num_blocks=513)
    with pytest.raises(hostpool.CapacityError):
        OffloadRegion(pool, cpu_page_size=4 * MiB, world=2, rank=0)
    with pytest.raises(TypeError):  # a float size is refused, not a broken view later
        OffloadRegion(pool, cpu_page_size=4096.5, world=2, rank=0)
    with pytest.raises(TypeError):
        OffloadRegion(pool, cpu_page_size=4 * KiB, world=2, rank=0).create_next_worker_view(1.5)
    # vLLM's page-rounded row: kv_bytes_per_block > world * cpu_page_size.
    region = OffloadRegion(pool, cpu_page_size=3000, world=2, rank=1, row_stride=8 * KiB)
    assert region.num_blocks == 512
    view = region.create_next_worker_view(3000)
    assert view.data_ptr() == pool.addr + 3000 and view.stride() == (8 * KiB, 1)
    del view
    region.cleanup()
    assert pool.close() == []  # cleanup released every export


# --------------------------------------------------------------- hostpool.sglang


def test_sglang_tensors_are_aligned_disjoint_and_zero_copy():
    with hostpool.Pool(size=16 * MiB) as p:
        alloc = HostPoolAllocator(p, alignment=256 * KiB)
        shapes = [((3, 5, 7), torch.float16), ((1000,), torch.float32), ((2, 64, 8, 128), torch.bfloat16)]
        tensors = [alloc.allocate(dims, dtype, "cpu") for dims, dtype in shapes]
        spans = []
        for t, (dims, dtype) in zip(tensors, shapes):
            assert t.shape == dims and t.dtype == dtype and t.is_contiguous()
            assert t.data_ptr() % (256 * KiB) == 0
            assert p.addr <= t.data_ptr() and t.data_ptr() + t.nbytes <= p.addr + p.nbytes
            spans.append((t.data_ptr(), t.data_ptr() + t.nbytes))
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        assert alloc.dims == (2, 64, 8, 128) and alloc.dtype == torch.bfloat16
        # A write through the tensor is seen through the pool.
        t = tensors[1]
        t[:] = torch.arange(1000, dtype=torch.float32)
        offset = t.data_ptr() - p.addr
        assert (np.frombuffer(p.view(offset, 4000), dtype=np.float32) == np.arange(1000)).all()
        del tensors, t
        assert alloc.close() == []  # the pool is the caller's: still open
        assert not p.closed


def test_sglang_default_alignment_and_out_of_space_keeps_state():
    with HostPoolAllocator(size=8 * MiB) as alloc:
        assert alloc.alignment == max(2 * MiB, alloc.pool.page_size)
        assert not alloc.is_pinned  # pin=None
        a = alloc.allocate((MiB,), torch.uint8)
        assert a.data_ptr() % (2 * MiB) == 0
        used = alloc.allocated_bytes
        with pytest.raises(hostpool.CapacityError):
            alloc.allocate((8 * MiB,), torch.uint8)
        assert alloc.allocated_bytes == used
        b = alloc.allocate((1024,), torch.int32)  # still fits after the failure
        assert b.data_ptr() % (2 * MiB) == 0 and b.data_ptr() >= a.data_ptr() + MiB
        with pytest.raises(ValueError):
            alloc.allocate((4,), torch.uint8, device="cuda")
        pool = alloc.pool
        del a, b
    assert pool.closed  # the allocator built the pool, so it closed it


def test_sglang_refuses_negative_dims_and_non_dtypes_allocating_nothing():
    with HostPoolAllocator(size=8 * MiB) as alloc:
        # torch would read -1 as "the rest of the pool" and the cursor would
        # move backwards, so later tensors would overlap.
        with pytest.raises(ValueError, match="must be 0 or more"):
            alloc.allocate((-1, 4), torch.float16)
        with pytest.raises(TypeError, match="torch.dtype"):
            alloc.allocate((4,), "float16")
        assert alloc.allocated_bytes == 0
        a = alloc.allocate((4,), torch.float16)
        b = alloc.allocate((4,), torch.float16)
        assert b.data_ptr() > a.data_ptr()
        del a, b
    with hostpool.Pool(size=MiB) as pool:
        with pytest.raises(TypeError, match="torch.dtype"):
            as_tensor(pool, dtype="int8")


@pytest.mark.parametrize("block_size", [512 * KiB, "512KiB"])
def test_sglang_alignment_follows_the_block_size_it_builds_with(block_size):
    with HostPoolAllocator(size=8 * MiB, block_size=block_size) as alloc:
        assert alloc.alignment == 512 * KiB
        t = alloc.allocate((10,), torch.uint8)
        u = alloc.allocate((10,), torch.uint8)
        assert t.data_ptr() % (512 * KiB) == 0
        assert u.data_ptr() - t.data_ptr() == 512 * KiB
        del t, u


def test_sglang_alignment_follows_the_block_size_of_a_pool_passed_in():
    with hostpool.Pool(size=8 * MiB, block_size="1MiB") as pool:
        assert pool.block_size == MiB
        alloc = HostPoolAllocator(pool)
        assert alloc.alignment == MiB
        t = alloc.allocate((3,), torch.uint8)
        assert t.data_ptr() % MiB == 0
        del t
        alloc.close()  # lets go of its view; the pool stays the caller's
        assert not pool.closed


def test_sglang_reports_pinning_as_the_pool_does():
    with HostPoolAllocator(size=4 * MiB, pin="cuda") as alloc:  # best effort
        assert alloc.is_pinned is bool(alloc.pool.pinned)


# -------------------------------------------------------------- hostpool.lmcache


def test_lmcache_alloc_free_round_trip():
    addr = lmcache.alloc(4 * MiB)
    pool = lmcache.get_pool(addr)
    assert pool.addr == addr and pool.nbytes == 4 * MiB
    assert lmcache.allocations()[addr] == 4 * MiB
    # LMCache's own wrapping: ctypes at the raw address, then torch.frombuffer.
    raw = torch.frombuffer((ctypes.c_uint8 * (4 * MiB)).from_address(addr), dtype=torch.uint8)
    raw[4 * MiB - 1] = 201
    assert pool.view(4 * MiB - 1, 1)[0] == 201
    del raw
    assert lmcache.free(addr) == []
    assert pool.closed
    assert addr not in lmcache.allocations()
    with pytest.raises(ValueError, match="already freed"):
        lmcache.free(addr)
    with pytest.raises(ValueError):
        lmcache.get_pool(addr)


def test_lmcache_free_of_a_busy_pool_keeps_it():
    addr = lmcache.alloc(MiB)
    view = lmcache.get_pool(addr).view(0, 16)
    with pytest.raises(hostpool.PoolBusyError):
        lmcache.free(addr)
    assert addr in lmcache.allocations()
    view.release()
    assert lmcache.free(addr) == []


def test_lmcache_shm_name_is_a_shared_pool_that_leaves_nothing():
    before = set(os.listdir("/dev/shm"))
    name = f"hp-adapters-{os.getpid()}"
    addr = lmcache.alloc(2 * MiB, shm_name="/" + name)  # LMCache's POSIX-style name
    pool = lmcache.get_pool(addr)
    sharing = pool.report["sharing"]
    assert (sharing["name"], sharing["world"], sharing["rank"]) == (name, 1, 0)
    assert pool.shard == (0, 2 * MiB)  # world 1: the whole pool is this rank's shard
    assert set(os.listdir("/dev/shm")) == before  # nothing named under /dev/shm, unlike LMCache
    assert lmcache.free(addr) == []
    with pytest.raises(ValueError):
        lmcache.alloc(MiB, world=2, rank=1)  # peers need a name


def test_lmcache_unknown_address_is_a_clear_error():
    with pytest.raises(ValueError, match="not returned by hostpool.lmcache.alloc"):
        lmcache.free(0xDEAD000)


# ------------------------------------------------------- pinned (fake driver)

PINNED_CODE = """
import os, hostpool, hostpool.lmcache as lmcache
from hostpool.sglang import HostPoolAllocator
from hostpool.torch import OffloadRegion

addr = lmcache.alloc(4 << 20)
assert lmcache.get_pool(addr).pinned
assert lmcache.free(addr) == []
log = open(os.environ["FAKE_CUDA_LOG"]).read()
assert f"cuMemHostRegister_v2 {addr:#x} {4 << 20} " in log, log
assert f"cuMemHostUnregister {addr:#x} -> CUDA_SUCCESS" in log, log

with HostPoolAllocator(size=4 << 20, pin="cuda") as alloc:
    assert alloc.is_pinned  # so SGLang passes pin_memory=False
with hostpool.Pool(size=1 << 20, pin="cuda") as pool:
    region = OffloadRegion(pool, cpu_page_size=4096, world=2, rank=0)
    assert region.is_pinned
    region.cleanup()
print("pinned ok")
"""


def test_adapters_see_the_pin_through_the_fake_driver(fake_cuda_dir, tmp_path):
    log = tmp_path / "cuda.log"
    env = {"LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log)}
    proc = run_python(PINNED_CODE, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pinned ok" in proc.stdout


# ---------------------------------------------------------------- huge pages


def test_huge_pages_lmcache_and_sglang():
    hugetlbfs_dir = hugetlbfs_mount("2M")
    addr = lmcache.alloc(4 * MiB, hugepages=True, dir=hugetlbfs_dir)
    pool = lmcache.get_pool(addr)
    assert pool.backing == "hugetlbfs" and pool.page_size == 2 * MiB
    assert addr % (2 * MiB) == 0
    assert lmcache.free(addr) == []

    addr = lmcache.alloc(2 * MiB, hugepages=True, page_size="2MiB")  # memfd, no mount
    assert lmcache.get_pool(addr).backing == "hugetlbfs"
    assert lmcache.free(addr) == []

    with HostPoolAllocator(size=6 * MiB, backing="hugetlbfs", dir=hugetlbfs_dir) as alloc:
        assert alloc.alignment == 2 * MiB
        tensors = [alloc.allocate((MiB + 1,), torch.uint8) for _ in range(2)]
        assert [t.data_ptr() - alloc.pool.addr for t in tensors] == [0, 2 * MiB]
        with pytest.raises(hostpool.CapacityError):
            alloc.allocate((2 * MiB + 1,), torch.uint8)
        del tensors
