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

__all__ = ["die_once_prefaulted", "engine_objects", "assert_same_objects", "doctor_engines", "installed_versions_are_the_readmes", "fake_cuda_dir", "nothing_left_behind", "hugetlbfs_mount", "free_hugepages", "run_python", "shm_files", "start_mooncake_master", "child_processes", "mooncake_master"]


def installed_versions_are_the_readmes(rows: dict[str, str]) -> None:
    """Each ``{README name: distribution}`` is installed at its pin, and the README's
    table of tested engines says that version, with the torch installed here."""
    import importlib.metadata as md

    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    torch = md.version("torch").split("+")[0]
    from hostpool import _engines

    engines_md = (root / "docs" / "engines.md").read_text()
    for name, dist in rows.items():
        version = md.version(dist)
        row = f"| {name} | {version} | {torch} |"
        assert row in readme, f"README's table of tested engines lacks {row!r}"
        # The one list of tested versions (doctor reads it) has it, and so does the
        # compatibility table of docs/engines.md.
        engine = next(e for e, dists in _engines.DISTRIBUTIONS.items() if dist in dists)
        assert _engines.is_tested(engine, version), f"hostpool._engines.TESTED[{engine!r}] lacks {version}"
        assert f"| {name.split(' (')[0]} {version} |" in engines_md, (
            f"docs/engines.md's compatibility table lacks a row for {name} {version}"
        )


def die_once_prefaulted() -> None:
    """Make this process a rank that dies mid-setup: it stalls before the shared pool's
    barrier (a failpoint of the test build) and SIGKILLs itself once its shard is
    prefaulted, in the next ``hostpool.Pool.from_config`` it makes."""
    import signal

    import hostpool

    os.environ["HOSTPOOL_TEST_FAILPOINTS"] = "shared-before-barrier=stall"
    real = hostpool.Pool.from_config

    def dying(source, **kw):
        def progress(phase, done, total):
            if phase == "prefault" and done == total:
                os.kill(os.getpid(), signal.SIGKILL)

        return real(source, progress=progress)

    hostpool.Pool.from_config = dying


def engine_objects(*prefixes: str) -> dict[tuple[str, ...], object]:
    """Every attribute of every loaded module under ``prefixes`` (e.g. ``"vllm"``), and of
    every class those modules define, by (module, [class,] name): what an adapter could
    replace. Values are the objects themselves, compared by identity."""
    import sys

    out: dict[tuple[str, ...], object] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == p or name.startswith(p + ".") for p in prefixes):
            continue
        for attr, value in list(vars(module).items()):
            out[(name, attr)] = value
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                for cattr, cvalue in list(vars(value).items()):
                    if cattr not in ("__dict__", "__weakref__", "__abstractmethods__", "_abc_impl"):
                        out[(name, attr, cattr)] = cvalue
    return out


def assert_same_objects(before: dict, after: dict, what: str) -> None:
    """``after`` holds the same objects as ``before`` for every key ``before`` has (a
    module loaded in between may add keys), and no key of a module of ``before`` more."""
    changed = [k for k, v in before.items() if k in after and after[k] is not v]
    gone = [k for k in before if k not in after]
    modules = {k[0] for k in before}
    added = [k for k in after if k not in before and k[0] in modules]
    assert not (changed or gone or added), f"{what}: replaced {changed[:8]}, removed {gone[:8]}, added {added[:8]}"


def doctor_engines() -> dict[str, dict]:
    """`hostpool doctor --json`'s engine findings for this interpreter (as `python -m
    hostpool doctor` asks it), by engine name."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [os.environ["HOSTPOOL_BIN"], "doctor", "--json"],
        env={**os.environ, "HOSTPOOL_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=120,
    )
    report = json.loads(out.stdout)
    findings = report["findings"] if isinstance(report, dict) else report
    return {
        f["item"]: f
        for f in findings
        if f.get("area") == "engines" and f.get("item") != "python"
    }


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
