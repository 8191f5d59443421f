"""hostpool.vllm against vLLM's released code (each release in tests/engines/vllm/envs/, one environment each).

vLLM's own `SharedOffloadRegion` and `HostPoolRegion` are built side by side
and every view must agree; vLLM's `OffloadingSpecFactory` loads our spec
from the extra config it reads; vLLM's `CPUOffloadingWorker` is built over
our region and must not register it a second time. Only what cannot run
here is replaced: vLLM's platform check (no GPU) and its CUDA transfer
handler.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import textwrap

import pytest
import torch

import hostpool
import hostpool.vllm
from engine_support import die_once_prefaulted, doctor_engines, free_hugepages, hugetlbfs_mount, run_python, shm_files
from hostpool.torch import HostPoolRegion, OffloadRegion, RegionFullError, pool_name
from vllm.v1.kv_offload import factory
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu import gpu_worker
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PAGE = 4096


def _round_up(a, b):
    return -(-a // b) * b


def _view_geometry(region, view):
    return (tuple(view.shape), tuple(view.stride()), view.data_ptr() - region._base.data_ptr())


def _both(engine_id, **kw):
    ours = HostPoolRegion(engine_id=engine_id, **kw, pool_config={"prefault": "none"})
    try:
        theirs = SharedOffloadRegion(engine_id=engine_id, **kw)
    except BaseException:
        ours.cleanup()
        raise
    return ours, theirs


def _assert_same(ours, theirs):
    for name in ("num_chunks", "_row_stride", "total_size_bytes", "cpu_page_size", "page_size", "rank"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours._base.numel() == theirs._base.numel()
    assert ours._base.dtype == theirs._base.dtype == torch.int8
    if ours.rank is not None:
        assert list(ours.iter_worker_slot_ranges()) == list(theirs.iter_worker_slot_ranges())


# (world, cpu_page_size, extra bytes of row padding, num_chunks)
GRID = [
    (world, page, pad, chunks)
    for world in (1, 2, 4, 8)
    for page, pad in ((4 * KiB, 0), (3000, 0), (61 * 512, 0), (16 * KiB, 4 * KiB), (100 * KiB, 12 * KiB))
    for chunks in (1, 7)
]


@pytest.mark.parametrize(("world", "page", "pad", "chunks"), GRID)
def test_worker_views_are_vllms(engine_id, world, page, pad, chunks):
    row = _round_up(world * page + pad, PAGE)
    for rank in sorted({0, world - 1, world // 2}):
        eid = f"{engine_id}-{rank}"
        ours, theirs = _both(eid, num_chunks=chunks, rank=rank, kv_bytes_per_chunk=row, cpu_page_size=page)
        try:
            _assert_same(ours, theirs)
            # Two KV tensors per worker slot, as CPUOffloadingWorker asks.
            for size in (page // 3, page - page // 3):
                a, b = ours.create_next_worker_view(size), theirs.create_next_worker_view(size)
                assert _view_geometry(ours, a) == _view_geometry(theirs, b)
            with pytest.raises(AssertionError):
                theirs.create_next_worker_view(1)
            with pytest.raises(AssertionError):  # the same exception class catches ours
                ours.create_next_worker_view(1)
            kv_ours, kv_theirs = ours.create_kv_memoryview(), theirs.create_kv_memoryview()
            assert (kv_ours.shape, kv_ours.format) == (kv_theirs.shape, kv_theirs.format)
            del a, b, kv_ours, kv_theirs
        finally:
            ours.cleanup()
            theirs.cleanup()


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("pages", [(16 * KiB, 48 * KiB), (40 * KiB, 24 * KiB, 8 * KiB)])
def test_canonical_views_are_vllms(engine_id, world, pages):
    row = _round_up(sum(pages), PAGE)
    ours, theirs = _both(engine_id, num_chunks=5, rank=None, kv_bytes_per_chunk=row, cpu_page_size=row // world)
    try:
        _assert_same(ours, theirs)
        for size in pages:
            a, b = ours.create_next_canonical_view(size), theirs.create_next_canonical_view(size)
            assert _view_geometry(ours, a) == _view_geometry(theirs, b)
        with pytest.raises(AssertionError):
            ours.create_next_canonical_view(row - sum(pages) + 1)
        del a, b
    finally:
        ours.cleanup()
        theirs.cleanup()


def test_populate_shard_and_segments_order_the_slots_as_vllm(engine_id):
    # vLLM cuts a region of 2 GiB or more into segment files and starts each
    # worker's slots on a different one; the order is kept with no file.
    world, page = 8, 64 * KiB
    row = world * page
    chunks = 2 * GiB // row
    for rank in (0, 5):
        eid = f"{engine_id}-{rank}"
        ours = HostPoolRegion(eid, chunks, rank, row, page, num_segments=32, pool_config={"prefault": "none"})
        try:
            theirs = SharedOffloadRegion(eid, chunks, rank, row, page, num_segments=4, populate_shard=(rank, world))
        except OSError as e:  # /dev/shm too small on this host for vLLM's own region
            ours.cleanup()
            pytest.skip(f"vLLM's 2 GiB region does not fit in /dev/shm here: {e}")
        try:
            assert len(theirs._segments) > 1
            # vLLM's count is min(num_segments, total // 1 GiB): 2 here either way.
            _assert_same(ours, theirs)
            slots = list(ours.iter_worker_slot_ranges())
            assert slots[0][0] // row == rank * chunks // world  # starts on its own segment
        finally:
            ours.cleanup()
            theirs.cleanup()


def test_region_arguments_vllm_would_refuse_are_config_errors(engine_id):
    with pytest.raises(hostpool.ConfigError, match="multiple of 4096"):
        HostPoolRegion(engine_id, 4, 0, 5000, 2500)
    with pytest.raises(hostpool.ConfigError, match="does not lie in the row"):
        HostPoolRegion(engine_id, 4, 2, 8192, 4096)
    with pytest.raises(hostpool.ConfigError, match="at least one row"):
        HostPoolRegion(engine_id, 0, 0, 8192, 4096)
    with pytest.raises(hostpool.ConfigError, match="`size`"):
        HostPoolRegion(engine_id, 4, 0, 8192, 4096, pool_config={"size": "1GiB"})
    with pytest.raises(hostpool.ConfigError, match="colour"):
        HostPoolRegion(engine_id, 4, 0, 8192, 4096, pool_config={"colour": "blue"})
    with pytest.raises(TypeError):
        HostPoolRegion(engine_id, 4.0, 0, 8192, 4096)


def test_a_region_without_sharing_is_private_and_cleanup_is_idempotent(engine_id):
    a = HostPoolRegion(engine_id, 4, 0, 8192, 4096)
    b = HostPoolRegion(engine_id, 4, 1, 8192, 4096)
    assert a.pool.report.get("sharing") is None
    a.create_next_worker_view(4096).fill_(7)
    assert int(b._base.sum()) == 0  # same engine id, separate memory
    assert a.mmap_path is None and shm_files() == shm_files()
    view = a.create_next_worker_view  # cursor exhausted below
    a.cleanup()
    a.cleanup()  # twice, as vLLM may
    assert a.pool is None and not a.is_pinned and a.pinned_addresses == []
    with pytest.raises(RuntimeError):
        view(1)
    b.cleanup()


def test_cleanup_with_a_live_view_frees_the_memory_with_the_last_view(engine_id):
    # Huge pages, so that "freed" is a count the kernel gives, not a guess.
    before = free_hugepages(2048)
    region = HostPoolRegion(engine_id, 4, 0, 2 * MiB, 2 * MiB, pool_config={"dir": hugetlbfs_mount("2M")})
    view = region.create_next_worker_view(2 * MiB)
    region.cleanup()  # PoolBusyError inside: swallowed, never raised
    region.cleanup()
    assert free_hugepages(2048) != before, "the memory went while a view was alive"
    view.fill_(1)  # still mapped: the view keeps it
    del view, region
    import gc

    gc.collect()
    assert free_hugepages(2048) == before, "the pool outlived its last view"


def test_the_old_offload_region_name_still_works():
    with hostpool.Pool(size=4 * 8 * KiB * 16) as pool:
        region = OffloadRegion(pool, cpu_page_size=8 * KiB, world=4, rank=1)
        assert isinstance(region, HostPoolRegion)
        assert (region.num_blocks, region.row_stride, region.world) == (16, 32 * KiB, 4)
        v = region.create_next_view(8 * KiB)
        assert v.data_ptr() == pool.addr + 8 * KiB
        with pytest.raises(hostpool.CapacityError):
            region.create_next_worker_view(1)
        with pytest.raises(RegionFullError):
            region.create_next_worker_view(1)
        del v
        region.cleanup()
        assert not pool.closed  # the caller's pool


# ------------------------------------------------------------------ the spec


def _offloading_config(engine_id, extra, *, world=1, rank=0, kv_bytes_per_block=8 * KiB, blocks_per_chunk=2):
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=kv_bytes_per_block,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id=engine_id,
        model=OffloadingModelConfig(name="test", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=rank,
            world_size=world,
            tp_size=world,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def _extra(table, size=4 * MiB):
    extra = {"spec_name": "HostPoolOffloadingSpec", "spec_module_path": "hostpool.vllm", "cpu_bytes_to_use": size}
    if table is not None:
        extra["hostpool"] = table
    return extra


def test_vllms_factory_loads_the_spec_from_the_extra_config(engine_id):
    config = _offloading_config(engine_id, _extra({"threads": 2, "pin": {"kind": "cuda", "background": True}}))
    spec = factory.OffloadingSpecFactory.create_spec(config)
    assert type(spec) is hostpool.vllm.HostPoolOffloadingSpec
    # vLLM's sizing: 8 KiB per block per worker, 2 blocks per chunk.
    assert spec.kv_bytes_per_chunk == 16 * KiB and spec.num_chunks == 4 * MiB // (16 * KiB)
    assert spec.pool_config == {"threads": 2, "pin": {"kind": "cuda", "background": True}}
    assert spec.region_pool_config().get("sharing") is None  # one worker: private
    two = factory.OffloadingSpecFactory.create_spec(_offloading_config(engine_id, _extra({}), world=2, rank=1))
    assert two.region_pool_config()["sharing"] == {"name": pool_name(engine_id), "world": 2, "rank": 1}


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"treads": 2}, "treads"),
        ({"size": "1GiB"}, "cpu_bytes_to_use"),
        ({"sharing": {"world": 4}}, "parallel config"),
        ({"pin": {"kind": "cuda", "backgroud": True}}, "backgroud"),
        ({"backing": "nonesuch"}, "nonesuch"),
        ({"dir": "/nonexistent/hugepages"}, "/nonexistent/hugepages"),
        ({"block_size": 0}, "block_size"),
        ("dir=/dev/shm", "must be a table"),
    ],
)
def test_a_bad_hostpool_table_fails_when_vllm_builds_the_spec(engine_id, table, match):
    with pytest.raises(hostpool.ConfigError, match=match):
        factory.OffloadingSpecFactory.create_spec(_offloading_config(engine_id, _extra(table)))


def test_an_absurd_cpu_bytes_to_use_fails_with_the_limit(engine_id):
    with pytest.raises(hostpool.ConfigError, match="64 PiB"):
        factory.OffloadingSpecFactory.create_spec(_offloading_config(engine_id, _extra({}, size=10**30)))


class _RecordingHandler:
    """Stands in for vLLM's CUDA transfer handler (it asserts CUDA tensors)."""

    made: list = []

    def __init__(self, *, cpu_tensors, host_memory_is_pinned, **_):  # 0.33 also passes gpu_tensors
        _RecordingHandler.made.append((cpu_tensors, host_memory_is_pinned))

    def shutdown(self):
        pass


@pytest.fixture
def cuda_platform(monkeypatch):
    """vLLM's platform check says CUDA; its host registration is recorded, not run."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: True)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: False)
    calls = []
    monkeypatch.setattr(gpu_worker, "host_register", lambda ptr, n: calls.append((ptr, n)) or True)
    monkeypatch.setattr(gpu_worker, "host_unregister", lambda ptr: calls.append((ptr, 0)))
    monkeypatch.setattr(gpu_worker, "PIN_MEMORY", True)
    monkeypatch.setattr(gpu_worker, "SingleDirectionOffloadingHandler", _RecordingHandler)
    _RecordingHandler.made = []
    return calls


def _kv_caches(num_blocks=8, page=8 * KiB, layers=2):
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

    tensors = [
        CanonicalKVCacheTensor(tensor=torch.zeros((num_blocks, page), dtype=torch.int8), page_size_bytes=page)
        for _ in range(layers)
    ]
    refs = [[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page) for i in range(layers)]]
    return CanonicalKVCaches(tensors=tensors, group_data_refs=refs)


def test_vllms_worker_runs_over_a_hostpool_region_and_never_registers_it(engine_id, cuda_platform):
    # Control: the recorder sees vLLM pin its own region, so silence below means something.
    theirs = SharedOffloadRegion(f"{engine_id}-v", 4, 0, 16 * KiB, 16 * KiB)
    gpu_worker.pin_mmap_region(theirs)
    assert cuda_platform and theirs.is_pinned
    theirs.is_pinned = False
    theirs.cleanup()
    cuda_platform.clear()

    config = _offloading_config(engine_id, _extra({"pin": {"kind": "mlock"}}, size=2 * MiB), kv_bytes_per_block=8 * KiB)
    spec = factory.OffloadingSpecFactory.create_spec(config)
    worker = spec.get_worker(_kv_caches(page=4 * KiB))  # 2 layers x 4 KiB x 2 blocks per chunk = 16 KiB rows
    region = worker._mmap_region
    assert isinstance(region, HostPoolRegion)
    assert cuda_platform == [], "vLLM registered a region hostpool pins"
    assert region.is_pinned and region.pool.report["pin"]["kind"] == "mlock"
    assert region.pinned_addresses and region.pinned_addresses[0] == region._base.data_ptr()
    # The worker's CPU tensors are views of the pool, made by vLLM's own code.
    cpu_tensors, pinned = _RecordingHandler.made[0]
    assert pinned is True
    assert [t.data_ptr() - region._base.data_ptr() for t in cpu_tensors] == [0, 8 * KiB]
    assert all(t.stride() == (region._row_stride, 1) for t in cpu_tensors)
    pool = region.pool
    del cpu_tensors
    _RecordingHandler.made.clear()
    worker.shutdown() if hasattr(worker, "shutdown") else None
    region.cleanup()
    del worker, region
    import gc

    gc.collect()
    assert pool.closed


def test_without_a_gpu_platform_vllm_refuses_as_it_always_did(engine_id):
    spec = factory.OffloadingSpecFactory.create_spec(_offloading_config(engine_id, _extra({})))
    with pytest.raises(Exception, match="CUDA-alike"):
        spec.get_worker(_kv_caches())


# --------------------------------------------------- workers in their own processes


def _worker(engine_id, rank, world, mode, q, barrier):
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    try:
        import hostpool.vllm  # noqa: F401
        from hostpool.torch import HostPoolRegion
        from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

        page, chunks = 16 * KiB, 16
        row = world * page
        if mode == "kill" and rank == 1:
            # Stop before the barrier, so the worker is certainly mid-setup
            # when it dies, once its prefault is done.
            die_once_prefaulted()
        try:
            region = HostPoolRegion(
                engine_id, chunks, rank, row, page,
                pool_config={"sharing": {"world": world, "attach_timeout_secs": 20, "barrier_timeout_secs": 20}},
            )
        except hostpool.PeerError as e:
            q.put((rank, "peer", e.rank, list(e.ranks), str(e)))
            return
        # vLLM's own region (private, barrier=None) says where its views lie.
        ref = SharedOffloadRegion(f"{engine_id}-ref{rank}", chunks, rank, row, page)
        view = ref.create_next_worker_view(page)
        offset, stride = view.storage_offset(), view.stride()
        del view
        ref.cleanup()
        mine = torch.as_strided(region._base, (chunks, page), stride, offset)
        mine.copy_(torch.arange(chunks * page, dtype=torch.int64).reshape(chunks, page).to(torch.int8) + rank)
        q.put((rank, "written", sorted(shm_now()), region.pool.report["sharing"]["role"]))
        barrier.wait(timeout=60)  # both have written
        # Read every worker's slot through the region's own rows.
        for r in range(world):
            rows = region._base.view(chunks, row)[:, r * page : (r + 1) * page]
            expect = torch.arange(chunks * page, dtype=torch.int64).reshape(chunks, page).to(torch.int8) + r
            q.put(("probe", rank, r, bool(torch.equal(rows, expect))))
        barrier.wait(timeout=60)  # nobody frees before both have read
        del mine, rows
        q.put((rank, "done"))
        region.cleanup()
    except Exception as e:
        q.put((rank, "error", f"{type(e).__name__}: {e}"))


def shm_now():
    return {f for f in os.listdir("/dev/shm") if not f.startswith("sem.mp-")}


def test_two_spawned_workers_share_one_pool_with_nothing_in_dev_shm(engine_id):
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    before = shm_files()
    procs = [ctx.Process(target=_worker, args=(engine_id, r, 2, "share", q, barrier)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    msgs = []
    while not q.empty():
        msgs.append(q.get())
    errors = [m for m in msgs if len(m) > 1 and m[1] == "error"]
    assert not errors, errors
    written = {m[0]: m for m in msgs if m[1:2] == ("written",)}
    assert sorted(written) == [0, 1]
    assert sorted(m[3] for m in written.values()) == ["creator", "joiner"]
    for m in written.values():
        assert set(m[2]) - before == set(), "a worker's pool has a file in /dev/shm"
    probes = [m for m in msgs if m[0] == "probe"]
    # Bytes written at vLLM's view offsets in one worker are read through
    # the other's region.
    assert sorted((rank, r) for _, rank, r, _ in probes) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(ok for *_, ok in probes), probes
    assert shm_files() == before


def test_a_worker_killed_mid_setup_is_named_by_the_other(engine_id):
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_worker, args=(engine_id, r, 2, "kill", q, barrier)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert procs[1].exitcode == -signal.SIGKILL
    msgs = []
    while not q.empty():
        msgs.append(q.get())
    peer = [m for m in msgs if m[0] == 0]
    assert peer and peer[0][1] == "peer", msgs
    _, _, err_rank, err_ranks, message = peer[0]
    assert err_rank == 1 or 1 in err_ranks or f"pid {procs[1].pid}" in message, message
    assert procs[0].exitcode == 0


# ------------------------------------------------------------ pinning, for real FFI


PIN = textwrap.dedent(
    """
    import json, os
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    import hostpool.vllm
    from hostpool.torch import HostPoolRegion
    from vllm.v1.kv_offload.cpu import gpu_worker
    calls = []
    gpu_worker.host_register = lambda ptr, n: calls.append(n) or True
    region = HostPoolRegion("ENGINE", 64, 0, 256 * 1024, 256 * 1024,
                            pool_config={"pin": {"kind": "cuda", "required": True, "background": BG},
                                         "block_size": 256 * 1024})
    if BG:
        region.pool.wait_pinned(30)
    gpu_worker.pin_mmap_region(region)   # what CPUOffloadingWorker calls
    out = {"pinned": region.is_pinned, "addresses": len(region.pinned_addresses),
           "vllm_calls": calls, "chunks": region.pool.pin_status()["chunks"]}
    region.cleanup()
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("background", [False, True])
def test_hostpool_pins_through_the_driver_and_vllm_registers_nothing(engine_id, fake_cuda_dir, tmp_path, background):
    log = tmp_path / "cuda.log"
    code = PIN.replace("ENGINE", engine_id).replace("BG", str(background))
    out = run_python(code, {"LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log),
                            "HOSTPOOL_LOG": "warning"})
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["pinned"] is True and info["addresses"] >= 1
    assert info["vllm_calls"] == []
    calls = log.read_text().splitlines()
    registers = [c for c in calls if c.startswith("cuMemHostRegister")]
    unregisters = [c for c in calls if c.startswith("cuMemHostUnregister")]
    assert registers and len(registers) == len(unregisters), calls


def test_a_hugetlbfs_dir_gives_the_region_huge_pages(engine_id):
    mount = hugetlbfs_mount("2M")
    region = HostPoolRegion(engine_id, 4, 0, 2 * MiB, 2 * MiB, pool_config={"dir": mount})
    try:
        assert region.pool.backing == "hugetlbfs" and region.pool.page_size == 2 * MiB
        assert region.page_size == PAGE  # vLLM's slot rounding is unchanged
        region.create_next_worker_view(2 * MiB).fill_(3)
    finally:
        region.cleanup()


def _spec_worker(engine_id, rank, world, q, barrier):
    """One TP worker as vLLM makes it: the factory's spec, then get_worker."""
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    try:
        from vllm.platforms import current_platform

        # Only what cannot run here: the GPU platform check and the CUDA handler.
        current_platform.is_cuda_alike = lambda: True
        current_platform.is_rocm = lambda: False
        gpu_worker.SingleDirectionOffloadingHandler = _RecordingHandler
        registered = []
        gpu_worker.host_register = lambda ptr, n: registered.append(n) or True
        gpu_worker.PIN_MEMORY = True
        table = {"threads": 1, "pin": {"kind": "mlock"}, "sharing": {"attach_timeout_secs": 20}}
        config = _offloading_config(engine_id, _extra(table, size=4 * MiB), world=world, rank=rank,
                                    kv_bytes_per_block=4 * KiB)
        spec = factory.OffloadingSpecFactory.create_spec(config)
        worker = spec.get_worker(_kv_caches(page=4 * KiB, layers=1))
        region = worker._mmap_region
        cpu_tensor = _RecordingHandler.made[0][0][0]
        cpu_tensor.fill_(rank + 1)  # this worker's slot of every row, through vLLM's own view
        barrier.wait(timeout=60)
        rows = region._base.view(region.num_chunks, region._row_stride)
        slots = [int(rows[:, r * region.cpu_page_size].min()) for r in range(world)]
        q.put((rank, region.pool.report["sharing"]["role"], slots, registered, sorted(shm_now())))
        barrier.wait(timeout=60)
        del cpu_tensor, rows
        _RecordingHandler.made.clear()
        region.cleanup()
    except Exception as e:
        q.put((rank, "error", f"{type(e).__name__}: {e}", [], []))


def test_the_specs_workers_share_one_pool_through_vllms_own_worker(engine_id):
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    before = shm_files()
    procs = [ctx.Process(target=_spec_worker, args=(engine_id, r, 2, q, barrier)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    results = {}
    while not q.empty():
        m = q.get()
        results[m[0]] = m[1:]
    assert [p.exitcode for p in procs] == [0, 0], results
    assert sorted(r[0] for r in results.values()) == ["creator", "joiner"], results
    for rank, (_, slots, registered, shm) in results.items():
        assert slots == [1, 2], f"worker {rank} sees {slots}"
        assert registered == [], "vLLM registered the pool hostpool pinned"
        assert set(shm) - before == set()
    assert shm_files() == before


def test_the_versions_tested_are_the_readmes():
    from engine_support import installed_versions_are_the_readmes

    installed_versions_are_the_readmes({"vLLM": "vllm", "LMCache": "lmcache"})


def test_a_region_leased_from_a_keeper_is_resident_and_keeps_vllms_bytes(engine_id):
    """Issue 19: a `[lease]` table in the region's pool config (the `hostpool` table of
    vLLM's extra config) leases the region's memory from `hostpool keep`
    instead of building it; a restarted engine (a new region) gets the same
    memory back with `content = "keep"`."""
    import subprocess

    probe = HostPoolRegion(engine_id, 4, 0, 8192, 4096, pool_config={"lease": {"keeper": engine_id, "fallback": "build"}})
    assert "no keeper answers" in probe.pool.report["keeper_fallback"]
    size = probe.total_size_bytes
    probe.cleanup()
    keeper = subprocess.Popen(
        [os.environ["HOSTPOOL_BIN"], "keep", "--name", engine_id, "--size", str(size), "--content", "keep",
         "--backing", "shm-segmented", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        ready = json.loads(keeper.stdout.readline() or "null")
        assert ready and ready["name"] == engine_id, keeper.stderr.read()
        region = HostPoolRegion(engine_id, 4, 0, 8192, 4096, pool_config={"lease": {"keeper": engine_id}})
        lease = region.pool.report["keeper"]
        assert lease["generation"] == 1 and region.pool.report["prefault"]["bytes"] == 0
        try:
            region.create_next_worker_view(4096).fill_(7)
        finally:
            region.cleanup()
        again = HostPoolRegion(engine_id, 4, 0, 8192, 4096, pool_config={"lease": {"keeper": engine_id}})
        assert again.pool.report["keeper"]["generation"] == 2
        assert again.pool.report["keeper"]["previous"]["how"] == "closed"
        try:
            view = again.create_next_worker_view(4096)
            assert view.numel() > 0 and bool((view == 7).all())
            del view
        finally:
            again.cleanup()
    finally:
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=10) == 0, keeper.stderr.read()


# --- issue 38: one place for vLLM's private names, one adapter base ---------------------

MANAGER = "vllm.v1.kv_offload.cpu.manager"
WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"


@pytest.mark.parametrize(
    ("owner", "attr", "named"),
    [
        (WORKER, "pin_mmap_region", f"{WORKER}.pin_mmap_region"),
        (MANAGER + ":CPUOffloadingManager", "_free_chunk", f"{MANAGER}.CPUOffloadingManager._free_chunk"),
        ("vllm.v1.kv_offload.cpu.spec", "CPUOffloadingSpec", "vllm.v1.kv_offload.cpu.spec.CPUOffloadingSpec"),
        ("segments", None, "REGION_SEGMENTS"),
    ],
)
def test_a_vllm_lacking_a_name_the_adapter_needs_fails_at_spec_construction_naming_it(
    engine_id, monkeypatch, owner, attr, named
):
    """A vLLM release that moved or removed a name hostpool reaches: vLLM's factory
    loads the plug-in and building the spec raises hostpool's one error, with the
    version found, every name missing and the versions tested, never an
    AttributeError in a worker later."""
    import importlib

    import vllm
    from hostpool import _engines

    if owner == "segments":  # 0.34 keeps it in shared_offload_region, 0.33 in spec
        for module, name in (
            ("vllm.v1.kv_offload.cpu.shared_offload_region", "REGION_SEGMENTS"),
            ("vllm.v1.kv_offload.cpu.spec", "_REGION_SEGMENTS"),
        ):
            monkeypatch.delattr(importlib.import_module(module), name, raising=False)
    else:
        module, _, cls = owner.partition(":")
        target = importlib.import_module(module)
        monkeypatch.delattr(getattr(target, cls) if cls else target, attr)
    config = _offloading_config(engine_id, _extra({}))
    with pytest.raises(hostpool.EngineVersionError) as raised:
        factory.OffloadingSpecFactory.create_spec(config)
    e = raised.value
    assert isinstance(e, hostpool.Error) and e.engine == "vllm" and e.version == vllm.__version__
    assert any(named in m for m in e.missing), e.missing
    assert e.tested == _engines.TESTED["vllm"] and e.tested[0] in str(e) and named in str(e)
    monkeypatch.undo()
    assert type(factory.OffloadingSpecFactory.create_spec(config)) is hostpool.vllm.HostPoolOffloadingSpec


def test_this_vllm_has_every_name_the_adapter_needs():
    from hostpool._engines import vllm as names

    assert names.missing() == []
    assert names.region_segments() == 32
    # 0.34 removed the policies' touch: recency comes from on_request_finished there.
    import vllm

    assert names.has_touch() == (vllm.__version__ == "0.33.0")


def test_importing_hostpool_vllm_patches_nothing_and_the_adapter_installs_once_and_uninstalls_exactly():
    out = run_python(
        textwrap.dedent(
            """
        import json, sys
        sys.path.insert(0, %r)
        from engine_support import engine_objects, assert_same_objects
        import vllm.v1.kv_offload.cpu.spec, vllm.v1.kv_offload.cpu.gpu_worker as gw
        import logging
        before = engine_objects("vllm")
        import hostpool.vllm
        from hostpool._vllm_region import ADAPTER
        assert_same_objects(before, engine_objects("vllm"), "import hostpool.vllm")
        ADAPTER.install()
        once = engine_objects("vllm")
        assert gw.pin_mmap_region is not before[(gw.__name__, "pin_mmap_region")], "the guard is in place"
        ADAPTER.install()
        assert_same_objects(once, engine_objects("vllm"), "a second install")
        ADAPTER.uninstall()
        assert_same_objects(before, engine_objects("vllm"), "uninstall")
        print(json.dumps({"ok": True}))
        """
            % os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        )
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ok": True}


def test_doctor_lists_this_vllm_as_tested():
    import vllm

    found = doctor_engines()
    assert found["vllm"]["details"]["version"] == vllm.__version__
    assert found["vllm"]["details"]["tested"] is True and found["vllm"]["verdict"] in ("ok", "pass"), found["vllm"]
