"""Who is charged for a 1 GiB CPU tier (issue 42): hostpool's kept pool
against vLLM's own ``SharedOffloadRegion``, in the same run, each process in a
memory cgroup of its own.

1. **hostpool**: a real ``hostpool keep --tenants 2`` of 1 GiB
   (``shm-segmented``, 4 KiB pages) in one group; two engines (Python,
   ``hostpool.Pool(keeper=NAME)``), each in a group of its own, lease it at
   once and each reads all of it.
2. **vLLM**: ``SharedOffloadRegion`` of 1 GiB built CPU-only as vLLM's
   worker builds it (``CPUOffloadingSpec.create_worker`` on a CUDA platform:
   ``rank`` = the worker's index, ``kv_bytes_per_chunk`` = world x
   ``cpu_page_size``, a barrier of all workers, ``num_segments =
   REGION_SEGMENTS``), by two workers of one engine (world 2), each in a
   group of its own: rank 0 creates the ``/dev/shm`` file, rank 1 opens it,
   they meet at the barrier (here a line on a pipe, for vLLM's
   ``torch.distributed`` barrier), each prefaults its own slots as vLLM's
   worker does, then each reads all of the region.

Each process is moved into its group before it runs (so everything it
allocates is charged there), imports what it needs, and is measured before it
builds or leases (``before``) and once it holds the memory and has read all
of it (``after``). Per group: ``memory.usage_in_bytes`` (v1) or
``memory.current`` (v2) before and after, ``memory.stat``'s ``shmem`` after,
and the process's ``RssShmem`` (what it maps). The factor of a group is
(after - before) / 1 GiB; of a side, the sum over its groups.

Run as root, in the vLLM environment, nothing else running:

    HOSTPOOL_BIN=target/debug/hostpool \\
        ~/.cache/hostpool/engine-vllm-0.34.0-*/bin/python crates/hostpool-py/bench/charge.py

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

GIB = 1 << 30
ROOT = Path("/sys/fs/cgroup")


# ---------------------------------------------------------------- cgroups


def own_group(v2: bool, name: str) -> str | None:
    """This process's group in the hierarchy of controller ``name`` (v1), or the unified one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        ident, controllers, path = line.split(":", 2)
        if (v2 and ident == "0" and not controllers) or (not v2 and name in controllers.split(",")):
            return path
    return None


class Hierarchy:
    """Where the memory controller is, and this process's group in it (the parent of ours)."""

    def __init__(self) -> None:
        self.delegated = False
        own = own_group(False, "memory")
        if own is not None:
            self.v2 = False
            self.parent = ROOT / "memory" / own.lstrip("/")
        else:
            mounts = [m for m in (ROOT / "unified", ROOT) if "memory" in _words(m / "cgroup.controllers")]
            own = own_group(True, "")
            if not mounts or own is None:
                sys.exit("no cgroup hierarchy here has the memory controller")
            self.v2 = True
            self.parent = mounts[0] / own.lstrip("/")
            control = self.parent / "cgroup.subtree_control"
            if "memory" not in _words(control):
                control.write_text("+memory")
                self.delegated = True
        self.usage_file = "memory.current" if self.v2 else "memory.usage_in_bytes"
        self.groups: list[Path] = []

    def group(self, tag: str) -> Path:
        g = self.parent / f"hostpool-charge-{os.getpid()}-{tag}"
        g.mkdir()
        self.groups.append(g)
        return g

    def usage(self, g: Path) -> int:
        return int((g / self.usage_file).read_text())

    def stat(self, g: Path) -> dict[str, int]:
        out = {}
        for line in (g / "memory.stat").read_text().splitlines():
            k, v = line.split()
            out[k] = int(v)
        return out

    def close(self) -> None:
        """Remove our groups (any process left moved to the parent first), undo a delegation."""
        for g in self.groups:
            for pid in _words(g / "cgroup.procs"):
                try:
                    (self.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            deadline = time.monotonic() + 5
            while g.exists():
                try:
                    g.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        print(f"could not remove {g}", file=sys.stderr)
                        break
                    time.sleep(0.02)
        if self.delegated:
            (self.parent / "cgroup.subtree_control").write_text("-memory")


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


# ---------------------------------------------------------------- children


def say(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def wait_for(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        sys.exit(f"expected {word!r} from the parent, got {line!r}")


def rss_shmem(pid: int | str = "self") -> int:
    """``RssShmem`` of a process, in bytes: the shared memory it maps."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    return 0


def child_hostpool(keeper: str) -> None:
    """An engine: lease the kept pool, read all of it, hold it until told."""
    import hostpool
    import numpy as np

    say({"state": "imported"})
    wait_for("go")
    pool = hostpool.Pool(keeper=keeper)
    view = np.frombuffer(pool, dtype=np.uint64)
    total = int(view.sum())
    say({"state": "held", "rss_shmem": rss_shmem(), "sum": total, "nbytes": pool.nbytes})
    wait_for("exit")
    del view
    pool.close()


def child_vllm(engine_id: str, rank: int, world: int, size: int, row: int) -> None:
    """A worker of one vLLM engine: build the region as vLLM's worker does, read all of it."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    import numpy as np
    from vllm.v1.kv_offload.cpu.shared_offload_region import (
        REGION_SEGMENTS,
        SharedOffloadRegion,
    )

    say({"state": "imported"})
    wait_for("go")

    def barrier() -> None:
        say({"state": "barrier"})
        wait_for("pass")

    region = SharedOffloadRegion(
        engine_id=engine_id,
        num_chunks=size // (row * world),
        rank=rank,
        kv_bytes_per_chunk=row * world,
        cpu_page_size=row,
        barrier=barrier,
        num_segments=REGION_SEGMENTS,
    )
    view = np.frombuffer(region.create_kv_memoryview(), dtype=np.uint64)
    total = int(view.sum())
    say({"state": "held", "rss_shmem": rss_shmem(), "sum": total, "nbytes": region.total_size_bytes})
    wait_for("exit")
    del view
    region.cleanup()


# ---------------------------------------------------------------- parent


class Child:
    """A process started inside cgroup ``group``, spoken to by lines."""

    def __init__(self, argv: list[str], group: Path, *, keeper: bool = False) -> None:
        # A shell moves itself into the group, then execs: the process is
        # there, under the same pid, before it allocates anything.
        self.proc = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "HOSTPOOL_LOG": "warning"},
        )
        self.group = group
        self.keeper = keeper

    def expect(self, state: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"pid {self.proc.pid} ended (status {self.proc.wait()}) before {state!r}")
        msg = json.loads(line)
        if msg.get("state") != state:
            raise RuntimeError(f"pid {self.proc.pid}: expected {state!r}, got {msg}")
        return msg

    def send(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        """Tell it to exit (a keeper: SIGTERM, which drains) and reap it; killed if it does not."""
        if self.proc.poll() is None:
            try:
                if self.keeper:
                    self.proc.send_signal(signal.SIGTERM)
                else:
                    self.send("exit")
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def figures(h: Hierarchy, g: Path, before: int, held: dict | None) -> dict:
    after = h.usage(g)
    stat = h.stat(g)
    out = {
        "group": g.name,
        "before": before,
        "after": after,
        "charged": after - before,
        "factor": round((after - before) / GIB, 4),
        "shmem": stat.get("shmem"),
        "anon": stat.get("rss", stat.get("anon")),
    }
    if held is not None:
        out["rss_shmem"] = held["rss_shmem"]
    return out


def run_hostpool(h: Hierarchy, size: int, children: list[Child]) -> dict:
    name = f"charge-{uuid.uuid4().hex[:8]}"
    kg = h.group("hostpool-keeper")
    before = h.usage(kg)
    binary = os.environ.get("HOSTPOOL_BIN", "hostpool")
    keeper = Child([binary, "keep", "--name", name, "--size", str(size), "--backing", "shm-segmented",
                    "--tenants", "2", "--json"], kg, keeper=True)
    children.append(keeper)
    ready = json.loads(keeper.proc.stdout.readline() or "null")
    if not ready:
        raise RuntimeError(f"the keeper ended (status {keeper.proc.wait()})")
    engines = []
    for tag in ("a", "b"):
        g = h.group(f"hostpool-engine-{tag}")
        e = Child([sys.executable, __file__, "--child", "hostpool", "--keeper", name], g)
        children.append(e)
        e.expect("imported")
        engines.append((e, h.usage(g)))
    held = []
    for e, _ in engines:
        e.send("go")
        held.append(e.expect("held"))
    assert all(m["nbytes"] == size for m in held), held
    out = {
        "keeper": figures(h, kg, before, {"rss_shmem": rss_shmem(keeper.proc.pid)}),
        "engines": [figures(h, e.group, b, m) for (e, b), m in zip(engines, held)],
    }
    for e, _ in engines:
        e.finish()
    keeper.finish()
    out["factor"] = round(out["keeper"]["factor"] + sum(e["factor"] for e in out["engines"]), 4)
    return out


def run_vllm(h: Hierarchy, size: int, row: int, children: list[Child]) -> dict:
    engine_id = f"charge{os.getpid()}"
    ranks = []
    try:
        for rank in (0, 1):
            g = h.group(f"vllm-rank{rank}")
            c = Child([sys.executable, __file__, "--child", "vllm", "--engine-id", engine_id, "--rank", str(rank),
                       "--world", "2", "--size", str(size), "--row", str(row)], g)
            children.append(c)
            c.expect("imported")
            ranks.append((c, h.usage(g)))
        # Rank 0 creates and sizes the file before rank 1 opens it, as the first worker to win O_EXCL.
        for c, _ in ranks:
            c.send("go")
            c.expect("barrier")
        for c, _ in ranks:
            c.send("pass")
        held = [c.expect("held") for c, _ in ranks]
        assert all(m["nbytes"] == size for m in held), held
        out = {"ranks": [figures(h, c.group, b, m) for (c, b), m in zip(ranks, held)]}
        for c, _ in ranks:
            c.finish()
    finally:
        for leftover in Path("/dev/shm").glob(f"vllm_offload_{engine_id}.mmap*"):
            leftover.unlink()
    out["factor"] = round(sum(r["factor"] for r in out["ranks"]), 4)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=GIB)
    p.add_argument("--row", type=int, default=2 << 20, help="vLLM's cpu_page_size (one worker's slot of a chunk)")
    p.add_argument("--child", choices=["hostpool", "vllm"], help=argparse.SUPPRESS)
    p.add_argument("--keeper", help=argparse.SUPPRESS)
    p.add_argument("--engine-id", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child == "hostpool":
        child_hostpool(a.keeper)
        return 0
    if a.child == "vllm":
        child_vllm(a.engine_id, a.rank, a.world, a.size, a.row)
        return 0
    if os.geteuid() != 0:
        sys.exit("needs root: it makes memory cgroups")
    h = Hierarchy()
    children: list[Child] = []
    try:
        out = {
            "cgroup_version": 2 if h.v2 else 1,
            "usage_file": h.usage_file,
            "size": a.size,
            "vllm_row": a.row,
            "hostpool": run_hostpool(h, a.size, children),
            "vllm": run_vllm(h, a.size, a.row, children),
            "cpus": os.cpu_count(),
        }
    finally:
        for c in children:
            c.finish()
        h.close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
