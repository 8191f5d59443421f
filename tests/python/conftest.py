"""Fixtures of the Python tests: huge page mounts from `cargo xtask test`,
the fake CUDA driver, the CLI binary, and checks that nothing is left behind.

`cargo xtask test` reserves huge pages, mounts hugetlbfs and exports
HOSTPOOL_TEST_HUGETLBFS_2M / _1G, with HOSTPOOL_REQUIRE_HUGEPAGES=1: then a
huge page test that finds no mount fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSFS = pathlib.Path("/sys/kernel/mm/hugepages")


def _target_file(name: str, env: str) -> pathlib.Path | None:
    if os.environ.get(env):
        return pathlib.Path(os.environ[env])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    found = [target / p / name for p in ("debug", "release") if (target / p / name).exists()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def hugetlbfs_mount(size: str) -> str:
    """The hugetlbfs mount for `size` ("2M" or "1G"), or skip (fail under xtask)."""
    mount = os.environ.get(f"HOSTPOOL_TEST_HUGETLBFS_{size}")
    if mount:
        return mount
    why = f"no hugetlbfs mount of {size} pages (HOSTPOOL_TEST_HUGETLBFS_{size} unset)"
    if size == "1G" and not (SYSFS / "hugepages-1048576kB").is_dir():
        pytest.skip(f"{why}: this kernel has no 1 GiB huge pages at all")
    if os.environ.get("HOSTPOOL_REQUIRE_HUGEPAGES") == "1":
        pytest.fail(f"{why}, but HOSTPOOL_REQUIRE_HUGEPAGES=1")
    pytest.skip(f"{why}: run under `cargo xtask test` as root")


def free_hugepages(kib: int) -> tuple[int, int]:
    """(free, reserved) pages of the `kib` KiB huge page pool."""
    d = SYSFS / f"hugepages-{kib}kB"
    return int((d / "free_hugepages").read_text()), int((d / "resv_hugepages").read_text())


@pytest.fixture(params=["anon", "shm", "hugetlbfs-2M", "hugetlbfs-1G"])
def backing_kwargs(request) -> dict:
    """Pool keyword arguments for each backing the tests run on."""
    if request.param == "anon":
        return {"backing": "anon"}
    if request.param == "shm":
        return {"dir": "/dev/shm"}
    size = request.param.split("-")[1]
    return {"backing": "hugetlbfs", "dir": hugetlbfs_mount(size)}


def shm_files() -> set[str]:
    """/dev/shm's entries, less multiprocessing's own semaphores (`sem.mp-*`,
    which its resource tracker removes)."""
    return {f for f in os.listdir("/dev/shm") if not f.startswith("sem.mp-")}


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Every test leaves /dev/shm and the huge page pools as it found them."""
    shm = shm_files()
    pages = {kib: free_hugepages(kib) for kib in (2048, 1048576) if (SYSFS / f"hugepages-{kib}kB").exists()}
    yield
    assert shm_files() - shm == set(), "files left in /dev/shm"
    for kib, before in pages.items():
        assert free_hugepages(kib) == before, f"{kib} KiB huge pages not given back"


@pytest.fixture(scope="session")
def fake_cuda_dir(tmp_path_factory) -> pathlib.Path:
    """A directory whose libcuda.so.1 is the test double (crates/fake-cuda)."""
    lib = _target_file("libfake_cuda.so", "HOSTPOOL_FAKE_CUDA")
    if lib is None:
        pytest.fail("libfake_cuda.so is not built: run `cargo build -p fake-cuda` (cargo xtask test does)")
    d = tmp_path_factory.mktemp("fakecuda")
    for name in ("libcuda.so.1", "libcuda.so"):
        (d / name).symlink_to(lib)
    return d


@pytest.fixture(scope="session")
def hostpool_bin() -> pathlib.Path:
    """The `hostpool` CLI built from this tree."""
    exe = _target_file("hostpool", "HOSTPOOL_BIN")
    if exe is None:
        pytest.fail("the hostpool binary is not built: run `cargo build -p hostpool-cli`")
    return exe


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (for LD_LIBRARY_PATH and signals)."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout
    )


def spawn_ranks(target, name: str, world: int, timeout: float = 90) -> list:
    """Run ``target(name, rank, queue)`` in ``world`` spawned processes (the
    ranks of one shared pool) and return what each put on the queue, sorted
    by rank (each puts a tuple whose first item is its rank)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(name, r, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    return sorted((out.get(timeout=5) for _ in procs), key=lambda r: r[0])


def socket_bound(name: str) -> bool:
    """Whether some process holds shared pool `name`'s socket name (its creator)."""
    sock = f"@hostpool/{os.geteuid()}/{name}"
    with open("/proc/net/unix") as f:
        return any(line.rstrip("\n").endswith(sock) for line in f)


def shared_mapped(pid: int) -> int:
    """Bytes process `pid` maps shared and writable (`rw-s`): a pool's files."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    total = 0
    for line in lines:
        fields = line.split()
        if fields[1] == "rw-s":
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            total += hi - lo
    return total


@pytest.fixture
def keeper(hostpool_bin):
    """Start `hostpool keep --name NAME --json ARGS`; stopped (SIGTERM, exit 0) afterwards."""
    started = []

    def start(name, *args):
        p = subprocess.Popen(
            [str(hostpool_bin), "keep", "--name", name, "--json", "--backing", "shm-segmented", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(p)
        line = p.stdout.readline()
        assert line, p.stderr.read()
        ready = json.loads(line)
        assert ready["name"] == name
        return ready

    yield start
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=10) == 0, p.stderr.read()
