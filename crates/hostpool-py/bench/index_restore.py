"""Restoring a kept pool's index into vLLM's CPU offloading manager, at one
million blocks, beside vLLM's own empty start in the same run (issue 29's
figure; the manager is not wired to the index yet, so this measures the
pieces a restore is made of: vLLM's `CPUOffloadingManager` built empty, the
index attached warm, its entries read back, and each put into the manager's
LRU policy present, ready and evictable, as a restoring manager would).

Run in the vLLM environment, nothing else running:

    ~/.cache/hostpool/engine-vllm-*/bin/python crates/hostpool-py/bench/index_restore.py

Prints one JSON object: the median seconds of each step over `--repeat`
runs and the restore rate in blocks per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import hostpool
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

FP = {"model": "Qwen/Qwen3-8B", "dtype": "bfloat16", "block_size": "16", "tp": "1", "hash": "sha256"}


def timed(f):
    t = time.perf_counter()
    value = f()
    return time.perf_counter() - t, value


def run(slots: int, keys: list[bytes]) -> dict[str, float]:
    out = {}
    out["vllm_empty_manager"], _ = timed(lambda: CPUOffloadingManager(num_chunks=slots))
    nbytes = hostpool.index_bytes(slots)
    with hostpool.Pool(nbytes) as pool:
        idx = pool.index(slots, FP)
        out["record_all"], _ = timed(lambda: idx.record_many(list(range(slots)), keys))
        out["attach_warm"], warm = timed(lambda: pool.index(slots, FP))
        assert warm.warm
        out["entries"], entries = timed(warm.entries)
        manager = CPUOffloadingManager(num_chunks=slots)
        ctx = ReqContext(req_id="restore")

        def restore():
            policy = manager._policy
            for slot, key in entries:
                chunk = ChunkStatus(slot)
                chunk.ref_cnt = 0
                policy.insert(key, chunk, ctx)
                policy.mark_evictable(key)
            manager._num_allocated_chunks = slots
            manager._num_evictable_cache_chunks = len(entries)

        out["into_manager"], _ = timed(restore)
        assert warm.restored == slots
        del warm, idx
    out["restore_total"] = out["attach_warm"] + out["entries"] + out["into_manager"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    keys = [i.to_bytes(32, "little") + (0).to_bytes(4, "big") for i in range(args.slots)]
    runs = [run(args.slots, keys) for _ in range(args.repeat)]
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    median["restore_blocks_per_second"] = args.slots / median["restore_total"]
    median["slots"] = args.slots
    print(json.dumps(median, indent=1))


if __name__ == "__main__":
    main()
