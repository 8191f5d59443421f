#!/usr/bin/env python3
"""vLLM's CPU KV offload region, on hostpool.

In vLLM itself one line of config does this (see docs/engines.md, "vLLM"):

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "HostPoolOffloadingSpec", "spec_module_path": "hostpool.vllm",
            "cpu_bytes_to_use": 68719476736,
            "hostpool": {"dir": "/dev/hugepages1G", "pin": {"kind": "cuda", "background": true}}}}'

Each TP worker then builds a ``hostpool.torch.HostPoolRegion`` with vLLM's own
arguments, as this example does without vLLM: vLLM's ``SharedOffloadRegion``
would have the first rank win ``open(O_CREAT|O_EXCL)`` on
``/dev/shm/vllm_offload_<engine>.mmap``, check free space and ``ftruncate``
it, the others poll ``fstat``, every rank ``mmap`` it, prefault its slots and
``cudaHostRegister`` it. Here the ranks meet on hostpool's socket (nothing in
``/dev/shm``), each prefaults its shard, and hostpool pins the pool.

Each of ``--world`` spawned ranks writes its own slot of every block, waits at a
barrier, and checks that it sees every rank's data. Exit status 0 means all
ranks saw all writes.

    python examples/vllm_offload_region.py --world 4 --size 64MiB
"""

import argparse
import multiprocessing as mp
import os
import sys
import time

from hostpool.torch import HostPoolRegion


def run_rank(name: str, world: int, rank: int, size: str, page: int, barrier) -> None:
    """One rank: vLLM's region constructor, with the pool config vLLM's spec adds."""
    row = world * page  # vLLM's kv_bytes_per_chunk: one slot of `page` bytes per rank
    region = HostPoolRegion(
        engine_id=name,
        num_chunks=_bytes(size) // row,
        rank=rank,
        kv_bytes_per_chunk=row,
        cpu_page_size=page,
        pool_config={"sharing": {"world": world}, "pin": {"kind": "cuda"}},  # best effort: no GPU, no pin
    )
    pool = region.pool
    check_region(region, world, rank, page, barrier)
    print(f"rank {rank}: ok, {pool.nbytes >> 20} MiB {pool.backing}, "
          f"shard {pool.shard}, pinned={pool.pinned}\n", end="", flush=True)  # one write
    region.cleanup()  # unpins and frees the pool (the last rank's cleanup frees the memory)


def _bytes(size: str) -> int:
    """`64MiB` or `67108864` in bytes."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
    for unit, factor in units.items():
        if size.lower().endswith(unit):
            return int(float(size[: -len(unit)]) * factor)
    return int(size)


def check_region(region: HostPoolRegion, world: int, rank: int, page: int, barrier) -> None:
    """Write this rank's K and V views, then check every rank's after a barrier."""
    k = region.create_next_worker_view(page // 2)  # (num_chunks, page/2) int8, one per KV tensor
    v = region.create_next_worker_view(page // 2)
    k.fill_(rank + 1)
    v.fill_(-(rank + 1))
    barrier.wait()  # every rank has written its slots

    rows = region.base_tensor.view(region.num_chunks, region.row_stride)
    for r in range(world):
        slot = rows[:, r * page : (r + 1) * page]
        if not ((slot[:, : page // 2] == r + 1).all() and (slot[:, page // 2 :] == -(r + 1)).all()):
            raise AssertionError(f"rank {rank} does not see rank {r}'s writes")
    barrier.wait()  # nobody leaves (and frees) before all have checked
    del k, v, slot, rows


def main_rank(name, world, rank, size, page, barrier) -> None:
    """The spawned process: run_rank, and on failure break the barrier for the peers."""
    try:
        run_rank(name, world, rank, size, page, barrier)
    except BaseException:
        barrier.abort()  # peers fail at the barrier instead of hanging
        raise


def main() -> int:
    """Spawn --world ranks; 0 when every rank saw every write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4, help="ranks sharing the region")
    parser.add_argument("--size", default="64MiB", help="region size, bytes or IEC (64MiB)")
    parser.add_argument("--page", type=int, default=64 << 10, help="bytes per rank per block")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for ranks")
    args = parser.parse_args()

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.world)
    name = f"vllm-offload-{os.getpid()}"  # vLLM's engine_id
    ranks = [ctx.Process(target=main_rank, args=(name, args.world, r, args.size, args.page, barrier))
             for r in range(args.world)]
    for p in ranks:
        p.start()
    deadline = time.monotonic() + args.timeout
    for p in ranks:
        p.join(max(0.0, deadline - time.monotonic()))
    failed = [r for r, p in enumerate(ranks) if p.exitcode != 0]
    for p in ranks:
        if p.is_alive():
            p.kill()
    if failed:
        print(f"FAILED: ranks {failed} (exit codes {[ranks[r].exitcode for r in failed]})", file=sys.stderr)
        return 1
    print(f"all {args.world} ranks see each other's writes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
