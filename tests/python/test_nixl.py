"""NIXL from Python: the pool's descriptors, registration with an engine's
own agent (the real ``nixl_cu12`` package, over loopback), rollback, and
hostpool's own ``nixl`` registrar pointed at the engine's library.

Processes that load NIXL end with ``os._exit``: the nixl-cu12 1.5.1 wheel's
UCX crashes in ``exit()`` where libibverbs is installed (see docs/design.md,
"NIXL across nodes")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import hostpool
import hostpool.nixl
from conftest import run_python

MiB = 1 << 20
LOOPBACK = {"UCX_NET_DEVICES": "lo"}


def test_nixl_descs_split_the_pool_on_block_boundaries():
    with hostpool.Pool(size=10 * MiB, block_size="1MiB") as pool:
        descs = pool.nixl_descs(dev_id=3, max_region="3584KiB")
        assert [d[1] for d in descs] == [3 * MiB, 3 * MiB, 3 * MiB, MiB]
        assert descs[0][0] == pool.addr and all(d[2] == 3 for d in descs)
        assert all(a + n == b for (a, n, _), (b, _, _) in zip(descs, descs[1:]))
        assert pool.nixl_descs() == [(pool.addr, pool.mapped_bytes, 0)]
        with pytest.raises(hostpool.ConfigError):
            pool.nixl_descs(max_region="512KiB")  # smaller than one block
    with pytest.raises(hostpool.Error, match="closed"):
        pool.nixl_descs()


class FakeAgent:
    """Records calls; the Nth register_memory fails."""

    def __init__(self, fail_at: int | None = None):
        self.calls: list[tuple[str, int]] = []
        self.fail_at = fail_at

    def register_memory(self, descs, mem_type):
        assert mem_type == "DRAM"
        if len([c for c in self.calls if c[0] == "reg"]) + 1 == self.fail_at:
            raise RuntimeError("NIXL_ERR_BACKEND")
        self.calls.append(("reg", descs[0][0]))
        return descs[0][0]

    def deregister_memory(self, reg):
        self.calls.append(("dereg", reg))


def test_register_holds_the_pool_until_deregistered_and_rolls_back_a_failure():
    with hostpool.Pool(size=8 * MiB, block_size="1MiB") as pool:
        agent = FakeAgent()
        reg = hostpool.nixl.register(agent, pool, max_region="2MiB")
        assert [c[0] for c in agent.calls] == ["reg"] * 4 and reg.registered
        with pytest.raises(hostpool.PoolBusyError):
            pool.close()  # NIXL still holds the memory
        reg.deregister()
        assert [c[1] for c in agent.calls[4:]] == [c[1] for c in agent.calls[:4]][::-1]
        failing = FakeAgent(fail_at=3)
        with pytest.raises(hostpool.Error, match=r"region 2 of 4 .* the 2 region\(s\) before it were deregistered in reverse"):
            hostpool.nixl.register(failing, pool, max_region="2MiB")
        assert [c[0] for c in failing.calls] == ["reg", "reg", "dereg", "dereg"]
    assert pool.closed  # nothing held it after the failure


def _hold_pool(tmp_path, hostpool_bin, size=256 * MiB):
    md = tmp_path / "agent.md"
    proc = subprocess.Popen(
        [hostpool_bin, "alloc", "--size", str(size), "--register", "nixl", "--hold", "--json", "--nixl-metadata-out", md],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **LOOPBACK},
    )
    lines = []
    while True:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        lines.append(line)
        if line == "}\n":
            break
    return proc, json.loads("".join(lines)), md


ENGINE = """
import base64, json, os, sys, numpy as np, hostpool, hostpool.nixl
from nixl_cu12 import nixl_agent, nixl_agent_config
md_file, remote_addr, size = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3])
agent = nixl_agent("py-engine", nixl_agent_config(backends=["UCX"]))
pool = hostpool.Pool(size=size)
reg = hostpool.nixl.register(agent, pool)
peer = agent.add_remote_agent(base64.b64decode(open(md_file).read()))
local = np.frombuffer(pool, dtype=np.uint8)
pattern = (np.arange(size, dtype=np.uint64) % 251).astype(np.uint8)

def move(op, notif=b""):
    src = agent.get_xfer_descs([(pool.addr, size, 0)], "DRAM")
    dst = agent.get_xfer_descs([(remote_addr, size, 0)], "DRAM")
    h = agent.initialize_xfer(op, src, dst, peer, notif)
    state = agent.transfer(h)
    while state == "PROC":
        state = agent.check_xfer_state(h)
    agent.release_xfer_handle(h)
    assert state == "DONE", state

local[:] = pattern
move("WRITE")
local[:] = 0
move("READ", b"py-engine-done")
ok = bool((local == pattern).all())
del local
try:
    pool.close()
    busy = False
except hostpool.PoolBusyError:
    busy = True
reg.deregister()
agent.remove_remote_agent(peer)
print(json.dumps({"peer": peer.decode() if isinstance(peer, bytes) else peer, "verified": ok, "busy_while_registered": busy, "issues": pool.close()}), flush=True)
os._exit(0)
"""


def test_an_engines_own_agent_moves_data_to_and_from_a_hostpool_pool(tmp_path, hostpool_bin):
    a, report, md = _hold_pool(tmp_path, hostpool_bin)
    try:
        region = report["registrations"][0]["details"]["regions"][0]
        out = subprocess.run(
            [sys.executable, "-c", ENGINE, md, region["addr"], str(256 * MiB)],
            capture_output=True, text=True, timeout=120, env={**os.environ, **LOOPBACK},
        )
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["verified"] and result["busy_while_registered"] and result["issues"] == []
        assert result["peer"] == report["registrations"][0]["details"]["agent"]
        deadline = time.monotonic() + 20
        a.send_signal(signal.SIGTERM)
        _, err = a.communicate(timeout=max(1, deadline - time.monotonic()))
        assert "notification from `py-engine`: py-engine-done" in err, err
        assert a.returncode == 0, err
        assert not md.exists()
    finally:
        if a.poll() is None:
            a.kill()


REGISTRAR = """
import json, os, nixl_cu12, hostpool, hostpool.nixl
lib = hostpool.nixl.use_engine_library()
pool = hostpool.Pool(size="64MiB", register=("nixl",))
d = pool.report["registrations"][0]["details"]
print(json.dumps({"lib": str(lib), "used": d["library"], "status": d["status"], "regions": len(d["regions"]),
                  "issues": pool.close()}), flush=True)
os._exit(0)
"""


def test_hostpools_registrar_uses_the_nixl_the_engine_imported():
    env = {k: v for k, v in os.environ.items() if k != "HOSTPOOL_NIXL_LIB"}
    out = subprocess.run([sys.executable, "-c", REGISTRAR], capture_output=True, text=True, timeout=120, env={**env, **LOOPBACK})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["lib"].endswith("libnixl_capi.so") and r["used"] == r["lib"]
    assert (r["status"], r["regions"], r["issues"]) == ("registered", 1, [])


FETCH = """
import os, sys, time
from nixl_cu12 import nixl_agent, nixl_agent_config
name, port, own_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# NIXL's metadata exchange runs on each side's listener thread.
b = nixl_agent("fetcher", nixl_agent_config(enable_listen_thread=True, listen_port=own_port, backends=["UCX"]))
b.fetch_remote_metadata(name, "127.0.0.1", port)
for _ in range(200):
    if b.check_remote_metadata(name):
        print("FETCHED", flush=True)
        break
    time.sleep(0.05)
os._exit(0)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_peer_fetches_the_pools_metadata_from_its_listener(tmp_path, hostpool_bin):
    port = _free_port()
    cfg = tmp_path / "pool.toml"
    cfg.write_text(f'size = "64MiB"\nregister = ["nixl"]\n[nixl]\nagent = "listener-a"\nlisten_port = {port}\n')
    a = subprocess.Popen([hostpool_bin, "alloc", "--config", cfg, "--hold", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **LOOPBACK})
    try:
        lines = []
        while (line := a.stdout.readline()) != "}\n":
            assert line, a.stderr.read()
            lines.append(line)
        assert json.loads("".join(lines) + "}")["registrations"][0]["details"]["listen_port"] == port
        out = subprocess.run([sys.executable, "-c", FETCH, "listener-a", str(port), str(_free_port())],
                             capture_output=True, text=True, timeout=60, env={**os.environ, **LOOPBACK})
        assert "FETCHED" in out.stdout, out.stderr
    finally:
        a.send_signal(signal.SIGTERM)
        a.communicate(timeout=30)
    assert a.returncode == 0
