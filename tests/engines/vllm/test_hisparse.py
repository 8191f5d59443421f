"""vLLM HiSparse's host pool from hostpool (hostpool.hisparse), against vLLM's released code.

Each scenario runs in a process of its own (``hisparse_engine.py``): vLLM's
``VllmConfig`` with a HiSparseConnector, a ``KVCacheConfig`` whose host-resident
tensor asks for a host pool, vLLM's ``get_hisparse_host_pool`` and
``HiSparseHostPool.allocate``, the teardown of HiSparse's worker
(``release_pinned_state``, ``drop_hisparse_host_pool``), and, for the shared
pool, two TP ranks joined by vLLM's own group over gloo. The wheel's
``vllm.general_plugins`` entry point is loaded by vLLM's ``load_general_plugins``.
Replaced, because no GPU exists here: the platform's answers and
``torch.cuda.cudart()``, whose registrations go to the CUDA driver test double,
so the call log shows who pinned what.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import types

import pytest

from engine_support import free_hugepages, hugetlbfs_mount, shm_files

ENGINE = pathlib.Path(__file__).with_name("hisparse_engine.py")
sys.path.insert(0, str(ENGINE.parent))
import hisparse_engine  # noqa: E402

MiB = 1 << 20
BLOCK = hisparse_engine.HOST_BLOCK
LAYERS = len(hisparse_engine.LAYERS)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return hisparse_engine.model_dir(str(tmp_path_factory.mktemp("model")))


def _env(fake_cuda_dir, log) -> dict:
    return {**os.environ, "LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log)}


def _run(scenario: str, args: dict, env: dict, timeout: float = 240) -> dict:
    out = subprocess.run(
        [sys.executable, str(ENGINE), scenario, json.dumps(args)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


HUGE = {"2M": 2 * MiB, "1G": 1 << 30}


@pytest.mark.parametrize("size", ["2M", "1G"])
def test_with_the_table_the_pool_is_hostpools_on_huge_pages_pinned_once(model, fake_cuda_dir, tmp_path, size):
    mount = hugetlbfs_mount(size)
    kib = HUGE[size] >> 10
    before = free_hugepages(kib)
    blocks = 64
    info = _run("allocate", {"model": model, "blocks": blocks, "table": {"dir": mount}, "mount": mount},
                _env(fake_cuda_dir, tmp_path / "cuda.log"))
    size_bytes = BLOCK * LAYERS * blocks
    # The tensor HiSparse gets lies in a hostpool pool on huge pages, of the exact size.
    assert info["in_pool"] and info["backing_kind"] == "hugetlbfs" and info["page_size"] == HUGE[size]
    assert info["numel"] == info["size"] == size_bytes
    assert info["registered"] == -(-size_bytes // 4096) * 4096  # HiSparse's registered range: 4 KiB rounded
    assert info["written"]
    # One pinning, by hostpool (the driver's portable flag, as hostpool asks), of the
    # pool's range; none by HiSparse (its cudaHostRegister would have flags 0).
    assert info["hisparse_pins"] == []
    regs = info["registrations"]
    assert sum(n for _, n, _ in regs) == info["mapped"] and all(f == 1 for *_, f in regs), regs
    assert sorted(a for a, _, _ in regs)[0] == info["addr"]
    # HiSparse's teardown gave it all back: unregistered, unmapped, the pages free.
    assert sorted(info["unregistrations"]) == sorted(a for a, _, _ in regs)
    assert info["hisparse_unpins"] == []
    assert info["maps_left"] == 0 and info["live_pools"] == 0
    assert free_hugepages(kib) == before
    assert list(pathlib.Path(mount).iterdir()) == []
    # The hooks were HiSparse's allocate and its release_pinned_state where it calls it;
    # uninstall put every object back.
    assert set(info["replaced"]) == {
        "vllm.v1.hisparse.runtime.HiSparseHostPool.allocate",
        "vllm.v1.hisparse.runtime.release_pinned_state",
        "vllm.v1.hisparse.binding.release_pinned_state",
        "vllm.distributed.kv_transfer.kv_connector.v1.hisparse.worker.release_pinned_state",
    }
    assert info["restored"]


def test_hostpools_line_reaches_stderr_under_vllms_own_logging(model, fake_cuda_dir, tmp_path):
    env = {**_env(fake_cuda_dir, tmp_path / "cuda.log"), "VLLM_CONFIGURE_LOGGING": "1",
           "VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_LOGGING_LEVEL": "INFO"}
    out = subprocess.run(
        [sys.executable, str(ENGINE), "allocate",
         json.dumps({"model": model, "blocks": 64, "table": {}, "vllm_logging": True})],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [l for l in out.stderr.splitlines() if "HiSparse host pool of" in l]
    # Once, in vLLM's format ("(pid) LEVEL date [file.py:line] message"), at vLLM's level.
    assert len(lines) == 1, out.stderr[-4000:]
    assert " INFO " in f" {lines[0].split('[')[0]} " and "[hisparse.py:" in lines[0], lines[0]
    assert "private" in lines[0] and "pinned: True" in lines[0], lines[0]
    assert "HiSparse host pool of" not in out.stdout


def test_pinned_chunks_never_split_a_hisparse_block(model, fake_cuda_dir, tmp_path):
    # 4 KiB pages: chunks are cut on multiples of lcm(41984, 4096) = 167936 bytes.
    chunk = 4 * 167936
    info = _run("allocate", {"model": model, "blocks": 64, "table": {"cuda": {"chunk_size": chunk}}},
                _env(fake_cuda_dir, tmp_path / "cuda.log"))
    regs = sorted(info["registrations"])
    assert len(regs) > 2, regs
    for addr, n, _ in regs:
        assert (addr - info["addr"]) % BLOCK == 0, (addr - info["addr"], BLOCK)
    assert sum(n for _, n, _ in regs) == info["mapped"]


def test_without_the_table_hisparse_allocates_as_released(model, fake_cuda_dir, tmp_path):
    info = _run("allocate", {"model": model, "blocks": 64, "table": None}, _env(fake_cuda_dir, tmp_path / "cuda.log"))
    assert info["installed"]  # the entry point ran, and changed nothing HiSparse calls
    assert not info["in_pool"]
    # Only the door is in place, and it called vLLM's own allocation: HiSparse's
    # cudaHostRegister of its registered range (flags 0), its unregister at teardown.
    assert info["replaced"] == ["vllm.v1.hisparse.runtime.HiSparseHostPool.allocate"]
    assert info["hisparse_pins"] == [["register", info["registered_addr"], info["registered"]]]
    assert info["registrations"] == [[info["registered_addr"], info["registered"], 0]]
    assert info["hisparse_unpins"] == [["unregister", info["registered_addr"], 0]]
    assert info["restored"]


def test_too_few_huge_pages_is_hostpools_error_at_allocation(model, fake_cuda_dir, tmp_path):
    mount = hugetlbfs_mount("2M")
    free, _ = free_hugepages(2048)
    blocks = (free + 8) * 2 * MiB // (BLOCK * LAYERS) + 1
    info = _run("allocate", {"model": model, "blocks": blocks, "table": {"dir": mount}},
                _env(fake_cuda_dir, tmp_path / "cuda.log"))
    assert info["error"] == "CapacityError", info
    message = info["message"]
    assert "huge page" in message and str(free) in message, message
    assert "nr_hugepages" in message or "hugepages" in message, message
    assert free_hugepages(2048)[0] == free


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(model, fake_cuda_dir, tmp_path, table, die=None):
    args = {"model": model, "blocks": 64, "tp": 2, "port": _port(), "instance": f"i{os.getpid()}-{tmp_path.name}"[-40:],
            "table": table}
    if die is not None:
        args["die"] = die
    procs = []
    for rank in range(2):
        env = _env(fake_cuda_dir, tmp_path / f"cuda{rank}.log")
        procs.append(subprocess.Popen(
            [sys.executable, str(ENGINE), "shared", json.dumps({**args, "rank": rank})],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        outs.append((p.returncode, out, err))
    return procs, outs


def test_two_tp_ranks_share_one_pool_each_pinning_it_once(model, fake_cuda_dir, tmp_path):
    mount = hugetlbfs_mount("2M")
    shm, pages = shm_files(), free_hugepages(2048)
    table = {"dir": mount, "sharing": {"attach_timeout_secs": 30, "barrier_timeout_secs": 30}}
    _, outs = _ranks(model, fake_cuda_dir, tmp_path, table)
    infos = []
    for code, out, err in outs:
        assert code == 0, err[-3000:]
        infos.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(i["role"] for i in infos) == ["creator", "joiner"]
    size = BLOCK * LAYERS * 64
    for info in infos:
        assert info["numel"] == size and info["region_is_hostpool"] == "HostPoolRegion"
        assert info["backing_kind"] == "hugetlbfs" and info["page_size"] == 2 * MiB
        assert info["sees_other"], info  # each rank reads the other's writes
        assert info["shm_new"] == []
        # Each rank prefaulted its own shard, on huge page boundaries ...
        offset, length = info["shard"]
        assert offset % (2 * MiB) == 0 and length % (2 * MiB) == 0
        # ... and registered the pool once in its own process (its GPU reads every
        # row), by hostpool alone; HiSparse registered nothing.
        assert info["hisparse_pins"] == []
        regs = info["registrations"]
        assert sum(n for _, n, _ in regs) == info["mapped"] and all(f == 1 for *_, f in regs), regs
        assert sorted(info["unregistrations"]) == sorted(a for a, _, _ in regs)
    shards = sorted(tuple(i["shard"]) for i in infos)
    assert shards[0][0] == 0 and shards[0][0] + shards[0][1] == shards[1][0]
    assert shards[1][0] + shards[1][1] == infos[0]["mapped"]
    assert shm_files() == shm and free_hugepages(2048) == pages
    assert list(pathlib.Path(mount).iterdir()) == []


def test_a_rank_killed_mid_setup_is_named_by_the_other(model, fake_cuda_dir, tmp_path):
    table = {"sharing": {"attach_timeout_secs": 30, "barrier_timeout_secs": 30}}
    procs, outs = _ranks(model, fake_cuda_dir, tmp_path, table, die=1)
    assert outs[1][0] == -signal.SIGKILL, outs[1][2][-2000:]
    code, out, err = outs[0]
    assert code == 0, err[-3000:]
    info = json.loads(out.strip().splitlines()[-1])
    assert info.get("error") == "PeerError", info
    assert info["peer"] == 1 or 1 in info["ranks"] or f"pid {procs[1].pid}" in info["message"], info


def _vllm_config(table) -> types.SimpleNamespace:
    from vllm.config import KVTransferConfig

    extra = {"host_pool_gib": 1, "hostpool": table}
    return types.SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector="HiSparseConnector", kv_role="kv_both",
                                            kv_connector_extra_config=extra)
    )


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({"size": "1GiB"}, ["size", "host_pool_gib"]),
        ({"lease": {"keeper": "kv"}}, ["lease", "not leased"]),
        ({"keeper": "kv"}, ["`keeper` moved into the [lease] table"]),
        ({"pin": {"kind": "mlock"}}, ["pin.kind", "cuda"]),
        ({"pin": {"kind": "cuda", "scope": "shard"}}, ["pin.scope"]),
        ({"sharing": {"world": 2}}, ["sharing", "world"]),
        ({"no_such_key": 1}, ["no_such_key"]),
        ("dir=/dev/hugepages", ["must be a table"]),
    ],
)
def test_a_bad_table_is_refused_naming_what_is_wrong(table, names):
    import hostpool.hisparse

    with pytest.raises(hostpool.ConfigError) as e:
        hostpool.hisparse.pool_config_of(_vllm_config(table))
    for name in names:
        assert name in str(e.value), str(e.value)


def test_the_table_is_found_beside_host_pool_gib_alone_or_in_a_multiconnector():
    import hostpool.hisparse
    from vllm.config import KVTransferConfig

    assert hostpool.hisparse.pool_config_of(_vllm_config({"threads": 1}))["pin"] == {"kind": "cuda", "required": True}
    multi = KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both", kv_connector_extra_config={
        "connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
            {"kv_connector": "HiSparseConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"host_pool_gib": 1, "hostpool": {"threads": 2}}},
        ]})
    assert hostpool.hisparse.pool_config_of(types.SimpleNamespace(kv_transfer_config=multi))["threads"] == 2
    assert hostpool.hisparse.pool_config_of(_vllm_config(None)) is None
    assert hostpool.hisparse.pool_config_of(types.SimpleNamespace(kv_transfer_config=None)) is None


def test_a_vllm_without_a_hisparse_name_is_refused_by_name(monkeypatch):
    import hostpool.hisparse
    from hostpool._engines import vllm as names
    from vllm.v1.hisparse import runtime

    assert names.hisparse_missing() == []
    monkeypatch.delattr(runtime, "release_pinned_state")
    with pytest.raises(hostpool.EngineVersionError) as e:
        hostpool.hisparse.ADAPTER.install()
    assert "vllm.v1.hisparse.runtime.release_pinned_state" in e.value.missing


def test_hisparses_registration_ranges_are_known_on_both_releases():
    from hostpool._engines import vllm as names

    sizes = [BLOCK * 64] * LAYERS
    total = -(-BLOCK * LAYERS // 4096) * 4096 * 64
    assert names.hisparse_registration_ranges(sizes, 64, total) == ((0, total),)
