"""The default suite's helpers (huge page mounts, the fake CUDA driver, the
leftovers check, `run_python`), for the engine tests and the workers they
spawn: `tests/python/conftest.py`, loaded by path (every conftest is named
conftest); and a Mooncake master (`tests/python/mooncake_peer.py`'s)."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "python" / "conftest.py"
_spec = importlib.util.spec_from_file_location("hostpool_default_conftest", _PATH)
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)

fake_cuda_dir = _conftest.fake_cuda_dir
nothing_left_behind = _conftest.nothing_left_behind
hugetlbfs_mount = _conftest.hugetlbfs_mount
free_hugepages = _conftest.free_hugepages
run_python = _conftest.run_python
shm_files = _conftest.shm_files

__all__ = ["installed_versions_are_the_readmes", "fake_cuda_dir", "nothing_left_behind", "hugetlbfs_mount", "free_hugepages", "run_python", "shm_files", "start_mooncake_master", "child_processes", "mooncake_master"]


def installed_versions_are_the_readmes(rows: dict[str, str]) -> None:
    """Each ``{README name: distribution}`` is installed at its pin, and the README's
    table of tested engines says that version, with the torch installed here."""
    import importlib.metadata as md

    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    torch = md.version("torch").split("+")[0]
    for name, dist in rows.items():
        version = md.version(dist)
        row = f"| {name} | {version} | {torch} |"
        assert row in readme, f"README's table of tested engines lacks {row!r}"


# ------------------------------------------------------------------ Mooncake

_PEER_PATH = _PATH.parent / "mooncake_peer.py"


def start_mooncake_master():
    """`start_master()` of tests/python/mooncake_peer.py (loaded by path): a
    `mooncake_master` on loopback ports it picks, with its HTTP metadata
    server; `.address`, `.metadata`, `.stop()`."""
    import sys

    peer = sys.modules.get("hostpool_mooncake_peer")
    if peer is None:
        spec = importlib.util.spec_from_file_location("hostpool_mooncake_peer", _PEER_PATH)
        peer = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = peer  # its dataclass looks its module up there
        spec.loader.exec_module(peer)
    return peer.start_master()


def child_processes() -> list[int]:
    """The pids of this process's children, alive or not yet reaped."""
    me = str(os.getpid())
    pids = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == me:
                pids.append(int(d.name))
    return pids


@pytest.fixture
def mooncake_master():
    """A `mooncake_master` for one test, stopped after it; the test leaves no
    child process behind."""
    before = set(child_processes())
    master = start_mooncake_master()
    try:
        yield master
    finally:
        master.stop()
    assert set(child_processes()) - before == set(), "a process was left behind"
