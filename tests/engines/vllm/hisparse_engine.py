"""vLLM HiSparse's host pool without a GPU, for tests/engines/vllm/test_hisparse.py.

``python hisparse_engine.py SCENARIO ARGS_JSON`` runs one scenario in a fresh
process (the fake CUDA driver is found through ``LD_LIBRARY_PATH``, set before
the process starts) and prints one JSON line of what it saw.

Replaced, only because no GPU exists here: vLLM's platform (its HiSparse
backend is vLLM's own ``CUDAHiSparseBackend``), ``torch.cuda.cudart()`` (the
CUDA runtime HiSparse pins with: here :class:`FakeCudart`, which calls the
CUDA driver test double, ``crates/fake-cuda``, whose call log the test reads),
and ``torch.accelerator.synchronize`` (nothing to synchronize). Everything
else is vLLM's: its ``VllmConfig``, ``KVCacheConfig``, ``get_hisparse_host_pool``,
``HiSparseHostPool.allocate``, ``release_pinned_state``,
``drop_hisparse_host_pool``, its plugin loader and its TP group over gloo.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import engine_support  # noqa: E402
import vllm_engine  # noqa: E402

LAYERS = tuple(f"model.layers.{i}.self_attn.attn" for i in range(3))
HOST_BLOCK = 656 * 64  # one layer's host block: 64 fp8_ds_mla rows of 656 B (not a page multiple)


class _Err:
    def __init__(self, value: int) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"cudaError({self.value})"


class FakeCudart:
    """``torch.cuda.cudart()``'s registration calls, made to the CUDA driver double."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.calls: list[tuple[str, int, int]] = []
        ctx = ctypes.c_void_p()
        assert self.lib.cuInit(0) == 0
        assert self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        self.ctx = ctx

    def _current(self) -> None:
        assert self.lib.cuCtxSetCurrent(self.ctx) == 0

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> _Err:  # noqa: N802 - CUDA's name
        self._current()
        rc = self.lib.cuMemHostRegister_v2(ctypes.c_void_p(ptr), ctypes.c_size_t(size), ctypes.c_uint(flags))
        self.calls.append(("register", ptr, size))
        return _Err(rc)

    def cudaHostUnregister(self, ptr: int) -> _Err:  # noqa: N802
        self._current()
        rc = self.lib.cuMemHostUnregister(ctypes.c_void_p(ptr))
        self.calls.append(("unregister", ptr, 0))
        return _Err(rc)

    def cudaGetLastError(self) -> _Err:  # noqa: N802
        return _Err(0)


CUDART: FakeCudart | None = None


def install_platform() -> FakeCudart:
    """What cannot run here, replaced in this process."""
    global CUDART
    from vllm.platforms import current_platform

    CUDART = FakeCudart()
    torch.cuda.cudart = lambda: CUDART
    torch.accelerator.synchronize = lambda *a, **k: None
    current_platform.is_cuda_alike = lambda: True
    type(current_platform).support_hybrid_kv_cache = classmethod(lambda cls: True)
    type(current_platform).get_hisparse_backend_cls = classmethod(
        lambda cls: "vllm.v1.hisparse.backend.CUDAHiSparseBackend"
    )
    return CUDART


def model_dir(root: str) -> str:
    """A model directory vLLM reads offline: the tiny Llama of ``vllm_engine`` with
    ``index_topk``, which vLLM asks of a model it runs HiSparse for (a DSA model)."""
    path = os.path.join(root, "tiny-dsa")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**vllm_engine.MODEL_DIR_CONFIG, "index_topk": 64}, f)
    return path


def vllm_config(args: dict[str, Any]) -> Any:
    from vllm.config import ModelConfig

    extra: dict[str, Any] = {"host_pool_gib": args.get("gib", 1)}
    if args.get("table") is not None:
        extra["hostpool"] = args["table"]
    from vllm.platforms import current_platform

    model = ModelConfig(model=args["model"], skip_tokenizer_init=True, dtype="float16", max_model_len=2048)
    # 0.33's config asks the platform whether it is CUDA for HiSparse; only there (a
    # CUDA platform everywhere would run CUDA kernels' checks at import).
    is_cuda = current_platform.is_cuda
    current_platform.is_cuda = lambda: True
    try:
        return _vllm_config(model, args, extra)
    finally:
        current_platform.is_cuda = is_cuda


def _vllm_config(model: Any, args: dict[str, Any], extra: dict[str, Any]) -> Any:
    from vllm.config import DeviceConfig, KVTransferConfig, ParallelConfig, VllmConfig

    return VllmConfig(
        model_config=model,
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=args.get("tp", 1), distributed_executor_backend="mp"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="HiSparseConnector", kv_role="kv_both", kv_connector_extra_config=extra
        ),
    )


def kv_cache_config(num_blocks: int, shared: bool) -> Any:
    """A KVCacheConfig whose host-resident tensor asks HiSparse for a host pool, laid out
    as vLLM's ``get_hisparse_kv_cache_config`` lays it (layer-outermost, LBNHC)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor

    per_block = HOST_BLOCK * len(LAYERS)
    stride = -(-per_block // 4096) * 4096 if shared else per_block
    host = KVCacheTensor(
        size=per_block * num_blocks,
        layers=list(LAYERS),
        layer_stride=HOST_BLOCK * num_blocks,
        block_stride=HOST_BLOCK,
        offset=0,
        host_resident=True,
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[host],
        kv_cache_groups=[],
        hisparse_host_num_blocks=num_blocks,
        hisparse_host_block_stride=stride,
        hisparse_shared_host_pool=shared,
    )


def fake_log() -> list[str]:
    path = os.environ.get("FAKE_CUDA_LOG")
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def registrations() -> list[tuple[int, int, int]]:
    """(address, bytes, flags) of every successful cuMemHostRegister_v2 in the log."""
    out = []
    for line in fake_log():
        parts = line.split()
        if parts[0] == "cuMemHostRegister_v2" and parts[-1] == "CUDA_SUCCESS":
            out.append((int(parts[1], 16), int(parts[2]), int(parts[3])))
    return out


def unregistrations() -> list[int]:
    return [
        int(line.split()[1], 16)
        for line in fake_log()
        if line.startswith("cuMemHostUnregister") and line.endswith("CUDA_SUCCESS")
    ]


def release(host_pool: Any) -> None:
    """The teardown vLLM's HiSparse worker makes (``shutdown``), as each release makes it."""
    from hostpool._engines import vllm as names
    from vllm.distributed.kv_transfer.kv_connector.v1.hisparse import worker

    if names.hisparse_keeps_pinned():  # 0.34
        worker.release_pinned_state(host_pool.pinned, host_pool.shared_region)
    else:  # 0.33: the runtimes' registered pools, unless the pool is shared
        pinned = [] if host_pool.shared_region is not None else [host_pool.registered]
        worker.release_pinned_state([], pinned, host_pool.shared_region)
    worker.drop_hisparse_host_pool(host_pool.vllm_config)


def maps_of(path_part: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if path_part in line)


def allocate(args: dict[str, Any]) -> dict[str, Any]:
    """One engine's private (TP 1) pool: allocate, write, release, drop."""
    import hostpool
    import hostpool.hisparse
    from vllm.plugins import load_general_plugins
    from vllm.v1.hisparse import runtime


    install_platform()
    watched = ("vllm.v1.hisparse", "vllm.distributed.kv_transfer.kv_connector.v1.hisparse")
    import vllm.distributed.kv_transfer.kv_connector.v1.hisparse.worker  # noqa: F401
    import vllm.v1.hisparse.binding  # noqa: F401

    before = engine_support.engine_objects(*watched)
    if args.get("vllm_logging"):
        # As vLLM's worker process starts (``worker_main``): vLLM's own logging
        # config, applied before its plugins load.
        from vllm.config.logging import LoggingConfig
        from vllm.logger import configure_logging

        configure_logging(LoggingConfig())
    load_general_plugins()  # what every vLLM process runs at start: the wheel's entry point
    config = vllm_config(args)
    kcc = kv_cache_config(args["blocks"], shared=False)
    size = kcc.kv_cache_tensors[0].size
    host_pool = runtime.get_hisparse_host_pool(config, kcc)
    out: dict[str, Any] = {"size": size, "installed": hostpool.hisparse.installed()}
    try:
        backing = host_pool.allocate(size)
    except hostpool.Error as e:
        out.update(error=type(e).__name__, message=str(e))
        runtime.drop_hisparse_host_pool(config)
        return out
    after = engine_support.engine_objects(*watched)
    out["replaced"] = sorted(".".join(k) for k, v in before.items() if k in after and after[k] is not v)
    out["numel"] = backing.numel()
    out["registered"] = host_pool.registered.numel()
    pool = hostpool.hisparse.ADAPTER.pool_of(backing.data_ptr(), backing.numel())
    out["in_pool"] = pool is not None
    if pool is not None:
        out.update(backing_kind=pool.backing, page_size=pool.page_size, pinned=pool.pinned, addr=pool.addr,
                   mapped=pool.mapped_bytes, ranges=[(r["offset"], r["len"]) for r in pool.pin_status()["ranges"]])
        del pool
    # HiSparse's views over the pool (one per layer) take and keep bytes.
    views = [backing[i * HOST_BLOCK * args["blocks"]:(i + 1) * HOST_BLOCK * args["blocks"]] for i in range(len(LAYERS))]
    for i in range(len(views)):
        views[i].fill_(i + 1)
    out["written"] = all(int(v[0]) == i + 1 and int(v[-1]) == i + 1 for i, v in enumerate(views))
    out["hisparse_pins"] = [c for c in CUDART.calls if c[0] == "register"]
    out["registrations"] = registrations()
    out["registered_addr"] = host_pool.registered.data_ptr()
    del views, backing
    release(host_pool)
    del host_pool
    gc.collect()
    out["hisparse_unpins"] = [c for c in CUDART.calls if c[0] == "unregister"]
    out["unregistrations"] = unregistrations()
    out["maps_left"] = maps_of(args.get("mount") or "hostpool") if args.get("table") else 0
    out["live_pools"] = len(hostpool.hisparse.ADAPTER.pools())
    hostpool.hisparse.ADAPTER.uninstall()
    restored = engine_support.engine_objects(*watched)
    out["restored"] = not [k for k, v in before.items() if k in restored and restored[k] is not v]
    return out


def shared_rank(args: dict[str, Any]) -> dict[str, Any]:
    """One TP rank of HiSparse's shared pool, in a process of its own, joined over gloo."""
    import hostpool
    import hostpool.hisparse
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        get_tp_group,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.plugins import load_general_plugins
    from vllm.v1.hisparse import runtime

    rank, world = args["rank"], args["tp"]
    install_platform()
    load_general_plugins()
    config = vllm_config(args)
    config.instance_id = args["instance"]
    out: dict[str, Any] = {"rank": rank}
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=world, rank=rank, distributed_init_method=f"tcp://127.0.0.1:{args['port']}",
            local_rank=rank, backend="gloo",
        )
        initialize_model_parallel(tensor_model_parallel_size=world)
        tp = get_tp_group()
        if args.get("die") == rank:
            engine_support.die_once_prefaulted()
        kcc = kv_cache_config(args["blocks"], shared=True)
        size = kcc.kv_cache_tensors[0].size
        host_pool = runtime.get_hisparse_host_pool(config, kcc)
        shm_before = sorted(os.listdir("/dev/shm"))
        try:
            backing = host_pool.allocate(size)
        except hostpool.PeerError as e:
            out.update(error="PeerError", peer=e.rank, ranks=list(e.ranks), message=str(e))
            print(json.dumps(out), flush=True)
            os._exit(0)  # the group's peer is gone: no orderly teardown of gloo
        pool = hostpool.hisparse.ADAPTER.pool_of(backing.data_ptr(), 1) or host_pool.shared_region.pool
        report = pool.report
        out.update(
            numel=backing.numel(),
            role=report["sharing"]["role"],
            shard=list(pool.shard),
            page_size=pool.page_size,
            backing_kind=pool.backing,
            mapped=pool.mapped_bytes,
            addr=pool.addr,
            pinned=pool.pinned,
            shm_new=sorted(set(os.listdir("/dev/shm")) - set(shm_before)),
            region_is_hostpool=type(host_pool.shared_region).__name__,
        )
        # Each rank writes the first byte of each of its shard's pages of layer 0; the
        # other reads them through its own mapping.
        mine = backing[rank * size // world:(rank + 1) * size // world]
        mine.fill_(rank + 1)
        del mine
        tp.barrier()
        other = (rank + 1) % world
        theirs = backing[other * size // world:(other + 1) * size // world]
        out["sees_other"] = bool(torch.all(theirs == other + 1))
        del theirs, backing, pool
        tp.barrier()  # nobody frees before both have read
        out["hisparse_pins"] = [c for c in CUDART.calls if c[0] == "register"]
        out["registrations"] = registrations()
        release(host_pool)
        del host_pool
        gc.collect()
        out["unregistrations"] = unregistrations()
        tp.barrier()
    print(json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    scenario, raw = sys.argv[1], sys.argv[2]
    args = json.loads(raw)
    if scenario == "allocate":
        print(json.dumps(allocate(args)), flush=True)
    elif scenario == "shared":
        shared_rank(args)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
