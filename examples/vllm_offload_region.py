#!/usr/bin/env python3
"""vLLM's CPU KV offload region, on hostpool.

vLLM's ``SharedOffloadRegion`` gives the tensor-parallel ranks of one engine one
host region: the first rank to win ``open(O_CREAT|O_EXCL)`` on
``/dev/shm/vllm_offload_<engine>.mmap`` checks free space and ``ftruncate``s it,
the others poll ``fstat`` until it has grown, every rank ``mmap``s it,
prefaults its own slots with ``MADV_POPULATE_WRITE`` and ``cudaHostRegister``s
it. Here that is one ``hostpool.Pool(...)`` call per rank (see ``run_rank``),
and the views are vLLM's, from ``hostpool.torch.OffloadRegion``.

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

import hostpool
from hostpool.torch import OffloadRegion


def run_rank(name: str, world: int, rank: int, size: str, page: int, barrier) -> None:
    """One rank: the whole of vLLM's file creation, prefault and cudaHostRegister.

    One region per engine, shared by its ranks; each rank prefaults only its
    shard, and the pool is pinned for the GPU (best effort: no GPU, no pin).
    """
    with hostpool.Pool(size=size, shared=hostpool.Shared(name, world, rank), pin="cuda") as pool:
        check_region(pool, world, rank, page, barrier)
        print(f"rank {rank}: ok, {pool.nbytes >> 20} MiB {pool.backing}, "
              f"shard {pool.shard}, pinned={pool.pinned}\n", end="", flush=True)  # one write


def check_region(pool: hostpool.Pool, world: int, rank: int, page: int, barrier) -> None:
    """Write this rank's K and V views, then check every rank's after a barrier."""
    region = OffloadRegion(pool, cpu_page_size=page, world=world, rank=rank)
    k = region.create_next_worker_view(page // 2)  # (num_blocks, page/2) int8, one per KV tensor
    v = region.create_next_worker_view(page // 2)
    k.fill_(rank + 1)
    v.fill_(-(rank + 1))
    barrier.wait()  # every rank has written its slots

    rows = region.base[: region.total_size_bytes].view(region.num_blocks, region.row_stride)
    for r in range(world):
        slot = rows[:, r * page : (r + 1) * page]
        if not ((slot[:, : page // 2] == r + 1).all() and (slot[:, page // 2 :] == -(r + 1)).all()):
            raise AssertionError(f"rank {rank} does not see rank {r}'s writes")
    barrier.wait()  # nobody leaves (and writes elsewhere) before all have checked
    del k, v, slot, rows
    region.cleanup()  # the pool closes only once no tensor points into it


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
