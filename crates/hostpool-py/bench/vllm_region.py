#!/usr/bin/env python3
"""Time to a ready CPU offload region: vLLM's SharedOffloadRegion against
hostpool.torch.HostPoolRegion, built with the same arguments, each in a fresh
process, in interleaved rounds; with a raw MADV_POPULATE_WRITE of the same
size in the same run as the limit (one call on one shared anonymous mapping,
which is shmem like vLLM's /dev/shm file: vLLM's method at its best).

Runs in the vLLM engine-test environment (tests/engines/vllm), which has
vLLM's released wheel:

    python crates/hostpool-py/bench/vllm_region.py --size 2GiB --row 2MiB --rounds 5 \\
        [--hugetlbfs /mnt/huge2M]

Prints one JSON object: per variant the median seconds (construction to
ready, as vLLM's worker waits for it) and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, mmap, os, sys, time
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    kind, size, row, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    chunks = size // row
    if kind == "raw":
        t = time.perf_counter()
        m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        m.madvise(23, 0, size)  # MADV_POPULATE_WRITE, one call, one thread
        dt = time.perf_counter() - t
        m.close()
    elif kind == "vllm":
        from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
        t = time.perf_counter()
        r = SharedOffloadRegion(f"bench{os.getpid()}", chunks, 0, row, row, num_segments=32)
        dt = time.perf_counter() - t
        r.cleanup()
    else:
        from hostpool.torch import HostPoolRegion
        config = json.loads(extra)
        t = time.perf_counter()
        r = HostPoolRegion(f"bench{os.getpid()}", chunks, 0, row, row, num_segments=32, pool_config=config)
        dt = time.perf_counter() - t
        r.cleanup()
    print(json.dumps({"seconds": dt}))
    """
)


def size_arg(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    for unit, factor in units.items():
        if text.lower().endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=size_arg, default=2 << 30)
    p.add_argument("--row", type=size_arg, default=2 << 20, help="kv_bytes_per_chunk (one worker)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hugetlbfs", help="a hugetlbfs mount for the huge page variant")
    args = p.parse_args()
    variants = {"raw": None, "vllm": None, "hostpool-anon": {}, "hostpool-shm": {"dir": "/dev/shm"}}
    if args.hugetlbfs:
        variants["hostpool-hugetlbfs"] = {"dir": args.hugetlbfs}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, config in variants.items():  # interleaved: one of each per round
            kind = name.split("-")[0]
            out = subprocess.run(
                [sys.executable, "-c", CHILD, kind, str(args.size), str(args.row), json.dumps(config or {})],
                capture_output=True, text=True, check=True, env={**os.environ, "HOSTPOOL_LOG": "warning"},
            )
            times[name].append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "size": args.size,
        "row": args.row,
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "median_seconds": med,
        "all_seconds": times,
        "vllm_over_hostpool": {k: med["vllm"] / v for k, v in med.items() if k.startswith("hostpool")},
        "hostpool_over_raw": {k: v / med["raw"] for k, v in med.items() if k.startswith("hostpool")},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
