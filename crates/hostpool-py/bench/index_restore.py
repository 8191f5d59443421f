"""A restarted vLLM engine's kept CPU tier at one million blocks: the time from
the spec's construction to the first prefix hit, and the restore rates,
beside vLLM's own manager starting empty, in the same run (issue 29).

The path is the engine's: vLLM's ``OffloadingSpecFactory`` builds
:class:`hostpool.vllm.HostPoolOffloadingSpec` from an ``OffloadingConfig``
with a ``keeper``; the worker's region leases the kept pool (a real ``hostpool
keep``, 4 GiB of one-block chunks and its index); ``spec.get_manager()`` maps
it as the workers' companion and returns the manager, whose first ``lookup``
of a kept block attaches the index and answers ``HIT``. Generation 1 records
one million blocks through that manager's index (``record_many``, as
``complete_store`` does); each restart is a new spec, region and manager.

Run in the vLLM environment, as root (the keeper's memory), nothing else
running:

    HOSTPOOL_BIN=target/release/hostpool \\
        ~/.cache/hostpool/engine-vllm-*/bin/python crates/hostpool-py/bench/index_restore.py

Prints one JSON object: medians over ``--repeat`` restarts, in seconds, and
rates in blocks per second.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import time

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import hostpool  # noqa: E402
import hostpool.vllm  # noqa: E402
from hostpool._vllm_region import HostPoolRegion  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import init_none_hash  # noqa: E402
from vllm.v1.kv_offload import factory  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

BLOCK_BYTES = 4096  # the smallest chunk vLLM allows: the most chunks per byte


def config(engine: str, spec_name: str, spec_module: str | None, table: dict | None, blocks: int) -> OffloadingConfig:
    extra = {"spec_name": spec_name, "cpu_bytes_to_use": blocks * BLOCK_BYTES}
    if spec_module:
        extra["spec_module_path"] = spec_module
    if table is not None:
        extra["hostpool"] = table
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=BLOCK_BYTES,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id=engine,
        model=OffloadingModelConfig(name="Qwen/Qwen3-8B", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def region_of(spec) -> HostPoolRegion:
    """The worker's region, as the spec's worker builds it (a lease of the kept pool)."""
    return HostPoolRegion(
        engine_id=spec.config.engine_id, num_chunks=spec.num_chunks, rank=0,
        kv_bytes_per_chunk=spec.kv_bytes_per_chunk, cpu_page_size=spec.cpu_page_size_per_worker,
        pool_config={**spec.region_pool_config(), "prefault": "none"},
    )


def wait_idle(name: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run([os.environ["HOSTPOOL_BIN"], "keep", "status", "--name", name, "--json"],
                             capture_output=True, text=True)
        [status] = json.loads(out.stdout)
        if status["state"] == "idle":
            return
        time.sleep(0.02)
    raise RuntimeError(f"kept pool {name} stayed leased")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pulls", type=int, default=100_000)
    a = ap.parse_args()
    n = a.blocks
    init_none_hash(sha256)
    name = f"bench-restore-{os.getpid()}"
    engine = name
    table = {"keeper": name}
    ours = config(engine, "HostPoolOffloadingSpec", "hostpool.vllm", table, n)
    probe = factory.OffloadingSpecFactory.create_spec(ours)
    size = probe.kept_pool_bytes(4096)
    keeper = subprocess.Popen(
        [os.environ["HOSTPOOL_BIN"], "keep", "--name", name, "--size", str(size), "--content", "keep",
         "--backing", "shm-segmented", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    out: dict[str, object] = {"blocks": n, "kept_pool_bytes": size}
    try:
        assert json.loads(keeper.stdout.readline() or "null"), keeper.stderr.read()
        keys = [make_offload_key(hashlib.sha256(i.to_bytes(8, "little")).digest(), 0) for i in range(n)]
        ctx = ReqContext(req_id="bench")

        # Generation 1: one million blocks recorded through the manager's index.
        region = region_of(probe)
        manager = probe.get_manager()
        index = manager.kept_index()
        assert index is not None and not index.warm
        t = time.perf_counter()
        index.record_many(list(range(n)), keys)
        out["gen1_record_all_s"] = time.perf_counter() - t
        manager.kept.close()
        region.cleanup()
        wait_idle(name)

        runs: dict[str, list[float]] = {k: [] for k in (
            "vllm_empty_first_lookup_s", "kept_first_hit_s", "kept_survey_s", "kept_pulls_per_s")}
        theirs = config(f"{engine}-v", "CPUOffloadingSpec", None, None, n)
        for r in range(a.repeat):
            # vLLM's own manager, starting empty: construction to its first lookup (a miss).
            t = time.perf_counter()
            spec = factory.OffloadingSpecFactory.create_spec(theirs)
            m = spec.get_manager()
            assert m.lookup(keys[0], ctx) == LookupResult.MISS
            runs["vllm_empty_first_lookup_s"].append(time.perf_counter() - t)
            del m, spec

            # A restart on the kept pool: the worker leases it first (as in vLLM).
            region = region_of(probe)
            t = time.perf_counter()
            spec = factory.OffloadingSpecFactory.create_spec(ours)
            m = spec.get_manager()
            hit = m.lookup(keys[(r * 7919) % n], ctx)
            runs["kept_first_hit_s"].append(time.perf_counter() - t)
            assert hit == LookupResult.HIT, hit
            # Every record accounted for (the first store does this), once.
            t = time.perf_counter()
            m.survey()
            runs["kept_survey_s"].append(time.perf_counter() - t)
            assert m.restored_blocks == n
            # Lookups bringing kept blocks into vLLM's policy, one each.
            pulls = keys[1 : 1 + a.pulls]
            t = time.perf_counter()
            for k in pulls:
                m.lookup(k, ctx)
            runs["kept_pulls_per_s"].append(len(pulls) / (time.perf_counter() - t))
            m.kept.close()
            region.cleanup()
            del m, spec
            wait_idle(name)
        for k, v in runs.items():
            out[k] = statistics.median(v)
        out["kept_survey_blocks_per_s"] = n / out["kept_survey_s"]
        out["first_hit_vs_vllm_empty"] = out["kept_first_hit_s"] / out["vllm_empty_first_lookup_s"]
    finally:
        keeper.send_signal(signal.SIGTERM)
        keeper.wait(timeout=60)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
