"""A node's memory for Mooncake, measured against limits of the same run
(issue 30):

- **registration**: ``hostpool.mooncake.register`` of a pool on 2 MiB pages
  (hugetlbfs) against a pool of the same size on 4 KiB pages, with a
  ``TransferEngine`` and with a ``MooncakeDistributedStore``'s
  ``register_buffer`` (the store needs a master: one is started on
  loopback), each with and without a ``max_region`` split;
- **segment**: a Store whose segment is Mooncake's own (``global_segment_size``,
  what the engines ask for) against one whose segment is a hostpool pool on
  2 MiB pages (``hostpool.mooncake.mount``): seconds to a ready segment and
  to fill three quarters of it through ``put_from``;
- **transfer**: ``transfer_sync_write`` / ``transfer_sync_read`` of the pool
  to and from a peer process's pool over Mooncake's TCP transport on
  loopback, one block per request, against ``memcpy`` (numpy) of the same
  bytes in this process.

Run with the test environment's python (the Mooncake wheel is pinned
there), as root, with a hugetlbfs mount of 2 MiB pages and nothing else
running:

    cargo xtask hugepages up > /tmp/hp.env && . /tmp/hp.env
    ~/.cache/hostpool/py-*/bin/python crates/hostpool-py/bench/mooncake_register.py \\
        --dir "$HOSTPOOL_TEST_HUGETLBFS_2M"
    cargo xtask hugepages down

Prints one JSON object: medians over ``--repeat`` runs in seconds, rates in
bytes per second, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import hostpool
import hostpool.mooncake

MiB = 1 << 20


def engine():
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("TransferEngine.initialize failed on loopback")
    return e


def peer(size: int, block: int) -> None:
    """``--peer``: a pool registered with a transfer engine, until stdin closes."""
    e = engine()
    with hostpool.Pool(size=size, backing="anon", block_size=block) as pool:
        reg = hostpool.mooncake.register(pool, e)
        print(json.dumps({"rpc_port": e.get_rpc_port(), "addr": pool.addr}), flush=True)
        sys.stdin.read()
        reg.unregister()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master():
    import mooncake

    exe = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    rpc, http, metrics = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [exe, "--rpc_address=127.0.0.1", f"--rpc_port={rpc}", "--enable_http_metadata_server=true",
         f"--http_metadata_server_port={http}", f"--metrics_port={metrics}"],
        stdout=subprocess.DEVNULL, stderr=tempfile.TemporaryFile(),
    )
    end = time.monotonic() + 60
    for port in (rpc, http):
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    raise SystemExit("mooncake_master did not start") from None
                time.sleep(0.02)
    return proc, rpc, http


def segment_fill(size: int, huge_dir: str | None, obj: int) -> dict:
    """A fresh master and a store whose segment is Mooncake's own (``huge_dir``
    None: ``global_segment_size``) or a hostpool pool on 2 MiB pages mounted
    with ``hostpool.mooncake.mount``; the seconds to a ready segment and to
    fill three quarters of it with ``put_from`` from a client without one."""
    from mooncake.store import MooncakeDistributedStore

    proc, rpc, http = master()
    meta, addr = f"http://127.0.0.1:{http}/metadata", f"127.0.0.1:{rpc}"
    pools = []
    try:
        t = time.perf_counter()
        server = MooncakeDistributedStore()
        if server.setup("127.0.0.1", meta, size if huge_dir is None else 0, 16 * MiB, "tcp", "", addr) != 0:
            raise SystemExit("store setup failed")
        if huge_dir is not None:
            pools.append(hostpool.Pool(size=size, backing="hugetlbfs", dir=huge_dir))
            hostpool.mooncake.mount(pools[-1], server)
        ready = time.perf_counter() - t
        client = MooncakeDistributedStore()
        if client.setup("127.0.0.1", meta, 0, 16 * MiB, "tcp", "", addr) != 0:
            raise SystemExit("store setup failed")
        pools.append(hostpool.Pool(size=obj, backing="anon"))
        hostpool.mooncake.register(pools[-1], client)
        count = size * 3 // 4 // obj
        t = time.perf_counter()
        for i in range(count):
            if client.put_from(f"o{i}", pools[-1].addr, obj) != 0:
                raise SystemExit(f"put_from {i} of {count} failed")
        fill = time.perf_counter() - t
        for p in reversed(pools):
            p.close()
        client.close()
        server.close()
        return {"ready": ready, "fill": fill, "bytes": count * obj}
    finally:
        for p in pools:
            p.close()
        proc.kill()
        proc.wait()


def timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def register_times(pool, make, max_region, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        target = make()
        holder = {}
        times.append(timed(lambda: holder.setdefault("r", hostpool.mooncake.register(pool, target, max_region=max_region))))
        holder["r"].unregister()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GiB", help="each pool's size (default 1GiB)")
    ap.add_argument("--dir", help="a hugetlbfs mount of 2 MiB pages (default $HOSTPOOL_TEST_HUGETLBFS_2M)")
    ap.add_argument("--max-region", default="64MiB", help="the split measured beside one region")
    ap.add_argument("--transfer", default="256MiB", help="bytes moved each way per run")
    ap.add_argument("--block", default="2MiB", help="block size: one transfer request each")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    size = _size(args.size)
    block = _size(args.block)
    if args.peer:
        peer(_size(args.transfer), block)
        return
    huge_dir = args.dir or os.environ.get("HOSTPOOL_TEST_HUGETLBFS_2M")
    if not huge_dir:
        raise SystemExit("give --dir: a hugetlbfs mount of 2 MiB pages (cargo xtask hugepages up)")
    from mooncake.store import MooncakeDistributedStore

    out: dict = {"size": size, "max_region": args.max_region, "repeat": args.repeat}
    proc, rpc, http = master()
    try:
        def store():
            s = MooncakeDistributedStore()
            if s.setup("127.0.0.1", f"http://127.0.0.1:{http}/metadata", 0, 16 * MiB, "tcp", "", f"127.0.0.1:{rpc}") != 0:
                raise SystemExit("store setup failed")
            return s

        te = engine()
        st = store()
        for name, kwargs in (("2MiB", {"backing": "hugetlbfs", "dir": huge_dir}), ("4KiB", {"backing": "anon"})):
            with hostpool.Pool(size=size, block_size=block, **kwargs) as pool:
                for what, make in (("engine", lambda: te), ("store", lambda: st)):
                    for split in (None, args.max_region):
                        key = f"register_{what}_{name}" + ("_split" if split else "")
                        t = register_times(pool, make, split, args.repeat)
                        out[key] = statistics.median(t)
                        out[key + "_regions"] = len(hostpool.mooncake.regions(pool, split))
        for what in ("engine", "store"):
            for split in ("", "_split"):
                out[f"register_{what}{split}_ratio_2MiB_to_4KiB"] = (
                    out[f"register_{what}_2MiB{split}"] / out[f"register_{what}_4KiB{split}"]
                )
        st.close()
    finally:
        proc.kill()
        proc.wait()

    # A Store segment: Mooncake's own (global_segment_size, what the engines
    # ask for today) against a hostpool pool on 2 MiB pages mounted as the
    # segment; each filled to three quarters through put_from.
    own, ours = [], []
    for _ in range(args.repeat):
        own.append(segment_fill(size, None, block))
        ours.append(segment_fill(size, huge_dir, block))
    for key in ("ready", "fill"):
        out[f"segment_own_{key}"] = statistics.median(r[key] for r in own)
        out[f"segment_hostpool_{key}"] = statistics.median(r[key] for r in ours)
    out["segment_fill_bytes"] = own[0]["bytes"]
    out["segment_fill_own_to_hostpool"] = out["segment_own_fill"] / out["segment_hostpool_fill"]

    # Transfer against memcpy: this process's pool and a peer's, over TCP.
    n = _size(args.transfer)
    child = subprocess.Popen(
        [sys.executable, __file__, "--peer", "--transfer", str(n), "--block", str(block)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        info = json.loads(child.stdout.readline())
        target = f"127.0.0.1:{info['rpc_port']}"
        e = engine()
        with hostpool.Pool(size=2 * n, backing="anon", block_size=block) as pool:
            reg = hostpool.mooncake.register(pool, e)
            view = np.frombuffer(memoryview(pool), dtype=np.uint8)
            view[:n] = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)

            def move(write: bool) -> None:
                call = e.transfer_sync_write if write else e.transfer_sync_read
                for off in range(0, n, block):
                    if call(target, pool.addr + off, info["addr"] + off, block) != 0:
                        raise SystemExit("a transfer failed")

            writes = [timed(lambda: move(True)) for _ in range(args.repeat)]
            reads = [timed(lambda: move(False)) for _ in range(args.repeat)]
            copies = [timed(lambda: np.copyto(view[n:], view[:n])) for _ in range(args.repeat)]
            assert np.array_equal(view[:n], view[n:])
            del view
            reg.unregister()
        out["transfer_bytes"] = n
        out["write_Bps"] = n / statistics.median(writes)
        out["read_Bps"] = n / statistics.median(reads)
        out["memcpy_Bps"] = n / statistics.median(copies)
        out["write_to_memcpy"] = out["write_Bps"] / out["memcpy_Bps"]
        out["read_to_memcpy"] = out["read_Bps"] / out["memcpy_Bps"]
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    print(json.dumps(out, indent=1))


def _size(text: str) -> int:
    units = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    num = text.rstrip("BKMGi")
    return int(num) * units[text[len(num):] or ""]


if __name__ == "__main__":
    main()
