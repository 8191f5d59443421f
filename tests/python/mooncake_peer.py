"""The Mooncake tests' other processes: :func:`start_master` (a
``mooncake_master`` on loopback ports it picks, for the tests here and the
engines' tests), and, run as a script, a peer: a hostpool pool
registered with a Mooncake TransferEngine on loopback (TCP), driven by one
command per line on stdin, answering one JSON line each on stdout.

    python mooncake_peer.py '{"size": ..., "backing": ..., "dir": ..., "block_size": ...}' MAX_REGION

First line out: ``{"rpc_port", "addr", "regions"}``. Commands:
``fill SEED`` (the pool's bytes from SEED), ``check SEED`` (whether they
are), ``write TARGET REMOTE SEED`` / ``read TARGET REMOTE`` (a transfer of
the whole pool to / from a peer, block by block), ``close``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Master:
    """A running ``mooncake_master``: its process and its loopback ports."""

    proc: subprocess.Popen
    rpc_port: int
    http_port: int
    metrics_port: int

    @property
    def address(self) -> str:
        """``master_server_addr`` of a store's setup."""
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata(self) -> str:
        """``metadata_server`` of a store's setup."""
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def metric(self, name: str) -> int:
        """One counter or gauge of its Prometheus page (``master_total_capacity_bytes``:
        the bytes of the segments it has mounted)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
        raise KeyError(f"mooncake_master reports no {name}")

    def stop(self) -> None:
        """SIGKILL it (if still running) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def start_master(deadline: float = 60, *args: str) -> Master:
    """Start the wheel's ``mooncake_master`` on loopback ports it picks, with
    its HTTP metadata server and any further ``args``; return once its RPC,
    metadata and metrics ports accept connections."""
    import mooncake  # the binary is in the wheel's package

    exe = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    ports = [free_port() for _ in range(3)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [
            exe,
            "--rpc_address=127.0.0.1",
            f"--rpc_port={ports[0]}",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_port={ports[1]}",
            f"--metrics_port={ports[2]}",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,  # a file: its glog lines would fill a pipe
    )
    master = Master(proc, *ports)
    end = time.monotonic() + deadline
    for port in ports:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"mooncake_master exited with {proc.returncode}: {log.read()[-2000:]!r}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > end:
                    master.stop()
                    raise TimeoutError(f"mooncake_master did not listen on {port} within {deadline} s") from None
                time.sleep(0.02)
    return master


def pattern(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def transfer(engine, pool, target: str, remote: int, write: bool) -> int:
    """The pool to (or from) `remote` at `target`, one block per call:
    Mooncake moves a request within one registered region."""
    step = pool.block_size or pool.mapped_bytes
    for off in range(0, pool.nbytes, step):
        n = min(step, pool.nbytes - off)
        call = engine.transfer_sync_write if write else engine.transfer_sync_read
        code = call(target, pool.addr + off, remote + off, n)
        if code != 0:
            return code
    return 0


def main() -> None:
    import hostpool
    import hostpool.mooncake
    from mooncake.engine import TransferEngine

    kwargs = json.loads(sys.argv[1])
    max_region = sys.argv[2] if len(sys.argv) > 2 else None
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    pool = hostpool.Pool(**kwargs)
    reg = hostpool.mooncake.register(pool, engine, max_region=max_region)
    view = np.frombuffer(memoryview(pool), dtype=np.uint8)

    def say(obj) -> None:
        print(json.dumps(obj), flush=True)

    say({**reg.peer, "addr": pool.addr})
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "fill":
            view[:] = pattern(int(args[0]), pool.nbytes)
            say({"filled": True})
        elif cmd == "check":
            say({"same": bool(np.array_equal(view, pattern(int(args[0]), pool.nbytes)))})
        elif cmd == "write":
            view[:] = pattern(int(args[2]), pool.nbytes)
            say({"code": transfer(engine, pool, args[0], int(args[1]), True)})
        elif cmd == "read":
            say({"code": transfer(engine, pool, args[0], int(args[1]), False)})
        elif cmd == "close":
            del view
            issues = pool.close()
            say({"closed": pool.closed, "registered": reg.registered, "issues": issues})
            return


if __name__ == "__main__":
    main()
