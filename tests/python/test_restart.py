"""A keeper that restarts gets its pool back (issue 48): under systemd, a keeper
stores its pool's files in the service's file descriptor store (FDSTORE=1 on
$NOTIFY_SOCKET) and the keeper systemd starts again adopts them (LISTEN_FDS,
LISTEN_PID, LISTEN_FDNAMES): the same memory, its bytes and its CPU tier's index.
A stand-in for systemd speaks the protocol here: a datagram socket that keeps the
descriptors sent with FDSTORE=1, and starts the next keeper with them as fds 3.."""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import hostpool

SLOTS = 16
BLOCK = 64 * 1024
FP = {"model": "m", "block_size": "16"}


class Systemd:
    """The parts of systemd a keeper meets: $NOTIFY_SOCKET, the file descriptor
    store, and a start with LISTEN_FDS."""

    def __init__(self) -> None:
        self.address = f"hostpool-test-notify-{os.getpid()}-{time.monotonic_ns()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.address)
        self.store: dict[str, int] = {}
        """FDNAME -> descriptor, as systemd keeps them."""

    def env(self) -> dict[str, str]:
        return {**os.environ, "NOTIFY_SOCKET": "@" + self.address}

    def until_ready(self, deadline: float = 60.0) -> list[str]:
        """Take messages (storing descriptors) until READY=1; the states said."""
        said = []
        self.sock.settimeout(deadline)
        while True:
            msg, fds, _, _ = socket.recv_fds(self.sock, 4096, 16)
            state = dict(line.split("=", 1) for line in msg.decode().splitlines() if "=" in line)
            said.append(msg.decode())
            if state.get("FDSTORE") == "1":
                assert len(fds) == 1, (state, fds)
                old = self.store.pop(state["FDNAME"], None)
                if old is not None:
                    os.close(old)
                self.store[state["FDNAME"]] = fds[0]
            else:
                for fd in fds:
                    os.close(fd)
            if state.get("READY") == "1":
                return said

    def start(self, argv: list[str], with_store: bool) -> subprocess.Popen:
        """Start `argv` as systemd starts a service: the store's descriptors as
        fds 3.., named in LISTEN_FDNAMES, LISTEN_PID its own pid."""
        names = sorted(self.store) if with_store else []
        env = self.env()
        if names:
            env["LISTEN_FDS"] = str(len(names))
            env["LISTEN_FDNAMES"] = ":".join(names)
        # Out of the way of 3.., then moved there in the child.
        high = [os.dup(self.store[n]) for n in names]
        moved = []
        for fd in high:
            moved.append(os.dup2(fd, 200 + len(moved)))
            os.close(fd)

        def place():
            for i, fd in enumerate(moved):
                os.dup2(fd, 3 + i)

        # `exec` keeps the shell's pid, which LISTEN_PID names.
        script = 'LISTEN_PID=$$; export LISTEN_PID; [ -n "$LISTEN_FDS" ] || unset LISTEN_PID; exec "$@"'
        try:
            return subprocess.Popen(
                ["/bin/sh", "-c", script, "sh", *argv],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=place,
                pass_fds=tuple(range(3, 3 + len(moved))),
            )
        finally:
            for fd in moved:
                os.close(fd)

    def close(self) -> None:
        for fd in self.store.values():
            os.close(fd)
        self.store.clear()
        self.sock.close()


ENGINE = """
import sys, hostpool
pool = hostpool.Pool(keeper=sys.argv[1])
index = pool.tier_open(int(sys.argv[2]), {"model": "m", "block_size": "16"})
[(what, slot, _)] = pool.tier_store([b"kept"])
assert what == "granted", what
pool.view(slot * int(sys.argv[3]), 8)[:] = b"kept-set"
assert pool.tier_stored([slot]) == 1
print(slot, flush=True)
sys.stdin.read()
print(pool.tier_link[0], flush=True)
pool.close()
"""


def _kill_all(procs) -> None:
    """SIGKILL and reap what a test started and left running."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _remove_dir(path: str) -> None:
    """Remove a persist directory the test made, whatever is in it."""
    for f in os.listdir(path):
        os.unlink(os.path.join(path, f))
    os.rmdir(path)


def _ready(proc) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def _until(check, what, deadline=30.0):
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def test_a_keeper_restarted_by_systemd_adopts_its_pool_bytes_and_tier(hostpool_bin):
    name = f"py-fdstore-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    argv = [str(hostpool_bin), "keep", "--name", name, "--json", "--backing", "shm-segmented",
            "--size", str(size), "--content", "keep", "--tenants", "2"]
    systemd = Systemd()
    procs = []
    try:
        first = systemd.start(argv, with_store=False)
        procs.append(first)
        ready = _ready(first)
        assert ready["came_back"] == "built", ready
        said = systemd.until_ready()
        assert any("FDSTORE=1" in s for s in said), said
        assert all(n.startswith(f"hostpool.{name}.") for n in systemd.store), systemd.store
        # An engine from before the restart stores a block, and lives on
        # through the keeper's SIGKILL.
        engine = subprocess.Popen(
            [sys.executable, "-c", ENGINE, name, str(SLOTS), str(BLOCK)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        procs.append(engine)
        line = engine.stdout.readline()
        assert line, engine.stderr.read()
        slot = int(line)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL

        second = systemd.start(argv, with_store=True)
        procs.append(second)
        ready = _ready(second)
        assert ready["came_back"] == "fdstore", ready
        assert ready["index"]["records"] == 1, ready["index"]
        systemd.until_ready()
        with hostpool.Pool(keeper=name) as b:
            index = b.tier_open(SLOTS, FP)
            assert index.warm, index.cold_reason
            assert index.find(b"kept") == slot
            assert bytes(b.view(slot * BLOCK, 8)) == b"kept-set"
            # The engine from before maps the pool still: no chunk is granted
            # to a writer (it may still write one the keeper before granted it).
            assert b.tier_store([b"new"]) == [("no_room", None, None)]
            assert b.tier_store([b"kept"]) == [("stored", slot, None)]
            engine.stdin.close()
            said = engine.stdout.readline().strip()
            assert said == "lost", engine.stderr.read()
            assert engine.wait(timeout=30) == 0, engine.stderr.read()

            def granted():
                puts = b.tier_store([b"new"])
                if puts[0][0] == "granted":
                    b.tier_abort([puts[0][1]])
                    return True
                return False

            _until(granted, "chunks are granted again once the engine from before is gone")
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, second.stderr.read()
    finally:
        _kill_all(procs)
        systemd.close()


def test_files_that_are_not_the_configs_pool_are_refused_naming_what_differs(hostpool_bin):
    name = f"py-fdstore-bad-{os.getpid()}"
    base = [str(hostpool_bin), "keep", "--name", name, "--json", "--backing", "shm-segmented",
            "--content", "keep"]
    systemd = Systemd()
    procs = []
    try:
        first = systemd.start([*base, "--size", "64MiB"], with_store=False)
        procs.append(first)
        _ready(first)
        systemd.until_ready()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        # The same name with another size: the files are refused, nothing mapped.
        second = systemd.start([*base, "--size", "32MiB"], with_store=True)
        procs.append(second)
        assert second.wait(timeout=60) == 1
        err = second.stderr.read()
        assert "are not the pool its config plans" in err, err
    finally:
        _kill_all(procs)
        systemd.close()


# --- a persist directory: the pool's files outlive every process ------------------

from conftest import hugetlbfs_mount  # noqa: E402


def _keep(hostpool_bin, name, mount, persist, *extra):
    return subprocess.Popen(
        [str(hostpool_bin), "keep", "--name", name, "--json", "--backing", "hugetlbfs", "--dir", mount,
         "--size", "4MiB", "--content", "keep", "--tenants", "2", "--persist", persist, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_a_persisted_pool_on_2m_pages_is_found_again_after_every_process_is_gone(hostpool_bin):
    mount = hugetlbfs_mount("2M")
    name = f"py-persist-{os.getpid()}"
    persist = os.path.join(mount, f"persist-{os.getpid()}")
    os.mkdir(persist, 0o700)
    slots = 16
    try:
        first = _keep(hostpool_bin, name, mount, persist)
        assert _ready(first)["came_back"] == "built"
        engine = subprocess.run(
            [sys.executable, "-c", ENGINE, name, str(slots), str(BLOCK)],
            input="", capture_output=True, text=True, timeout=120,
        )
        assert engine.returncode == 0, engine.stderr
        slot = int(engine.stdout.split()[0])
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0, first.stderr.read()
        # Every process that mapped the pool is gone; its files stay, 0600.
        files = sorted(os.listdir(persist))
        assert files and all(f.startswith(f"hostpool.kept.{name}.") for f in files), files
        assert all(os.stat(os.path.join(persist, f)).st_mode & 0o777 == 0o600 for f in files)
        second = _keep(hostpool_bin, name, mount, persist)
        ready = _ready(second)
        assert ready["came_back"] == "persist" and ready["index"]["records"] == 1, ready
        with hostpool.Pool(keeper=name) as b:
            assert b.page_size == 2 << 20
            index = b.tier_open(slots, FP)
            assert index.warm and index.find(b"kept") == slot, index.cold_reason
            assert bytes(b.view(slot * BLOCK, 8)) == b"kept-set"
            # No process from before maps it: chunks are granted at once.
            puts = b.tier_store([b"new"])
            assert puts[0][0] == "granted", puts
            b.tier_abort([puts[0][1]])
        # Forgetting it is refused while its keeper runs, then explicit.
        out = subprocess.run([str(hostpool_bin), "keep", "forget", "--name", name, "--persist", persist],
                             capture_output=True, text=True)
        assert out.returncode == 1 and "stop it first" in out.stderr, out.stderr
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, second.stderr.read()
        out = subprocess.run([str(hostpool_bin), "keep", "forget", "--name", name, "--persist", persist, "--json"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert len(json.loads(out.stdout)["removed"]) == len(files)
        assert os.listdir(persist) == []
    finally:
        _remove_dir(persist)


def test_a_link_planted_in_the_persist_directory_is_refused_naming_it(hostpool_bin, tmp_path):
    # tmpfs (hugetlbfs takes no symbolic links at all).
    name = f"py-planted-{os.getpid()}"
    persist = f"/dev/shm/planted-{os.getpid()}"
    os.mkdir(persist, 0o700)
    try:
        target = tmp_path / "secret"
        target.write_bytes(b"x" * 4096)
        link = os.path.join(persist, f"hostpool.kept.{name}.0")
        os.symlink(target, link)
        proc = subprocess.Popen(
            [str(hostpool_bin), "keep", "--name", name, "--json", "--backing", "shm-segmented", "--size", "4MiB",
             "--content", "keep", "--persist", persist],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert proc.wait(timeout=60) == 1
        err = proc.stderr.read()
        assert link in err and "symbolic link, which is never followed" in err, err
        assert target.read_bytes() == b"x" * 4096
        assert os.listdir(persist) == [os.path.basename(link)], "nothing made beside it"
    finally:
        _remove_dir(persist)


# --- the third source: a keeper's tenants hand the pool back ------------------------


def test_a_keeper_takes_its_pool_back_from_a_tenant_and_refuses_another_pool(hostpool_bin):
    name = f"py-handback-{os.getpid()}"
    other = f"py-handback-other-{os.getpid()}"
    size = SLOTS * BLOCK + hostpool.index_bytes(SLOTS)
    base = [str(hostpool_bin), "keep", "--json", "--backing", "shm-segmented", "--content", "keep", "--tenants", "2"]
    procs = []

    def keep(n, *extra):
        p = subprocess.Popen([*base, "--name", n, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    try:
        first = keep(name, "--size", str(size))
        _ready(first)
        wrong = keep(other, "--size", str(2 * size))
        _ready(wrong)
        with hostpool.Pool(keeper=name) as a, hostpool.Pool(keeper=other) as w:
            index = a.tier_open(SLOTS, FP)
            [(_, slot, _)] = a.tier_store([b"kept"])
            a.view(slot * BLOCK, 8)[:] = b"kept-set"
            assert a.tier_stored([slot]) == 1
            first.send_signal(signal.SIGKILL)
            assert first.wait(timeout=30) == -signal.SIGKILL
            # Nobody to hand it to: an error, not a hang.
            with pytest.raises(hostpool.KeeperError):
                a.hand_back(name)
            second = keep(name, "--size", str(size), "--adopt-within", "60")
            # A pool of another size is refused; the keeper goes on waiting.
            t = time.monotonic()

            def once_it_listens(pool):
                end = time.monotonic() + 30
                while True:
                    try:
                        return pool.hand_back(name)
                    except hostpool.KeeperError:
                        assert time.monotonic() < end, "the keeper never listened"
                        time.sleep(0.02)

            assert once_it_listens(w) is False
            assert a.hand_back(name) is True
            ready = _ready(second)
            assert ready["came_back"] == "tenants" and ready["came_back_blocks"] == 1, ready
            assert time.monotonic() - t < 30
            with hostpool.Pool(keeper=name) as b:
                again = b.tier_open(SLOTS, FP)
                assert again.warm and again.find(b"kept") == slot
                assert bytes(b.view(slot * BLOCK, 8)) == b"kept-set"
                # The same memory: a's mapping sees b's write.
                b.view(slot * BLOCK, 8)[:] = b"from-b!!"
                assert bytes(a.view(slot * BLOCK, 8)) == b"from-b!!"
            del index
        # Nothing handed back within the window: the keeper builds.
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, second.stderr.read()
        third = keep(name, "--size", str(size), "--adopt-within", "0.5")
        assert _ready(third)["came_back"] == "built"
        for p in (third, wrong):
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0, p.stderr.read()
    finally:
        _kill_all(procs)
