"""Pinning in the background, through the CUDA test double slowed per call
(`FAKE_CUDA_REGISTER_DELAY_MS`): the pool is usable while it is pinned,
pinned bytes grow chunk by chunk in address order, teardown during pinning
leaves nothing registered, and a failed chunk rolls back (required) or keeps
the prefix (best effort)."""

from __future__ import annotations

import json

from conftest import run_python, spawn_ranks

MiB = 1 << 20

SCRIPT = """
import json, time, hostpool
pool = hostpool.Pool(size="64MiB", block_size="4MiB", pin="cuda", pin_required=REQUIRED,
                     pin_background=True, background_chunk="8MiB")
out = {"first": pool.pin_status()}
mem = memoryview(pool)
mem[0], mem[pool.nbytes - 1] = 7, 9           # usable while pinning
out["usable"] = (mem[0], mem[pool.nbytes - 1]) == (7, 9)
del mem
seen = []
while True:
    s = pool.pin_status()
    seen.append((s["pinned_bytes"], [(r["offset"], r["len"]) for r in s["ranges"]]))
    if s["state"] != "pinning" or MODE == "close-early" and s["chunks"] >= 2:
        break
    time.sleep(0.02)
out["seen"] = seen
if MODE == "close-early":
    out["state_at_close"] = pool.pin_status()["state"]
    out["issues"] = pool.close()
    out["after_close"] = pool.pin_status()
else:
    try:
        out["waited"] = pool.wait_pinned(timeout=60)
    except hostpool.PinError as e:
        out["pin_error"] = str(e)
    out["pinned"] = pool.pinned
    out["issues"] = pool.close()
print(json.dumps(out))
"""


def _run(fake_cuda_dir, tmp_path, mode, required=True, **env):
    log = tmp_path / f"calls-{mode}.log"
    code = SCRIPT.replace("REQUIRED", str(required)).replace("MODE", repr(mode))
    out = run_python(code, {"LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log),
                            "FAKE_CUDA_REGISTER_DELAY_MS": "100", **env})
    assert out.returncode == 0, out.stderr
    calls = [line.split()[0] for line in log.read_text().splitlines() if "HostRegister" in line or "HostUnregister" in line]
    return json.loads(out.stdout), calls


def test_the_pool_is_usable_while_pinned_chunk_by_chunk_in_address_order(fake_cuda_dir, tmp_path):
    r, calls = _run(fake_cuda_dir, tmp_path, "wait")
    assert r["first"]["state"] == "pinning" and r["first"]["background"], r["first"]
    assert r["usable"]
    assert r["waited"]["state"] == "pinned" and r["waited"]["pinned_bytes"] == 64 * MiB and r["waited"]["chunks"] == 8
    assert r["pinned"] is True
    grown = [b for b, _ in r["seen"]]
    assert grown == sorted(grown) and len(set(grown)) >= 3, f"pinned bytes grow chunk by chunk: {grown}"
    for pinned, ranges in r["seen"]:
        # Always one prefix from offset 0: address order.
        assert ranges == ([] if pinned == 0 else [[0, pinned]]), (pinned, ranges)
    assert calls.count("cuMemHostRegister_v2") == calls.count("cuMemHostUnregister") == 8
    assert r["issues"] == []


def test_teardown_during_pinning_leaves_nothing_registered(fake_cuda_dir, tmp_path):
    r, calls = _run(fake_cuda_dir, tmp_path, "close-early")
    assert r["state_at_close"] == "pinning"
    assert r["issues"] == []
    registered = calls.count("cuMemHostRegister_v2")
    assert 2 <= registered < 8, calls
    assert calls.count("cuMemHostUnregister") == registered, "every chunk unregistered"
    assert calls[-1] == "cuMemHostUnregister", "no register after teardown began"


def test_a_failed_chunk_rolls_back_a_required_pin(fake_cuda_dir, tmp_path):
    r, calls = _run(fake_cuda_dir, tmp_path, "wait", FAKE_CUDA_FAIL_REGISTER_AT="5")
    assert "chunk 4 of 8 (offset 32 MiB, 8 MiB)" in r["pin_error"], r
    assert "CUDA_ERROR_OUT_OF_MEMORY" in r["pin_error"]
    assert "the 4 chunk(s) before it were unpinned in reverse" in r["pin_error"]
    assert r["pinned"] is False
    assert calls.count("cuMemHostRegister_v2") == 5 and calls.count("cuMemHostUnregister") == 4


def test_a_failed_chunk_keeps_the_prefix_of_a_best_effort_pin(fake_cuda_dir, tmp_path):
    r, calls = _run(fake_cuda_dir, tmp_path, "wait", required=False, FAKE_CUDA_FAIL_REGISTER_AT="5")
    w = r["waited"]
    assert w["state"] == "skipped" and w["pinned_bytes"] == 32 * MiB, w
    assert [(x["offset"], x["len"]) for x in w["ranges"]] == [(0, 32 * MiB)]
    assert "the first 32 MiB stay pinned" in w["error"]
    assert r["issues"] == [] and calls.count("cuMemHostUnregister") == 4


def test_bad_background_settings_are_config_errors():
    import hostpool
    import pytest

    with pytest.raises(hostpool.ConfigError, match="background pinning needs a pinner"):
        hostpool.Pool(size="4MiB", pin_background=True)
    with pytest.raises(hostpool.ConfigError, match="background_chunk is 0"):
        hostpool.Pool(size="4MiB", pin="mlock", pin_background=True, background_chunk=0)


def test_mlock_pins_in_the_background_too():
    import hostpool

    with hostpool.Pool(size="32MiB", pin="mlock", memlock_bound="ignore", pin_background=True, background_chunk="4MiB") as pool:
        s = pool.wait_pinned(timeout=60)
        assert s["background"] and s["state"] == "pinned", s
        assert s["pinned_bytes"] == 32 * MiB and s["chunks"] == 8


def _shard_rank(name, rank, out):
    import hostpool

    try:
        with hostpool.Pool(size="64MiB", shared=hostpool.Shared(name, 2, rank, attach_timeout=20.0),
                           pin="mlock", memlock_bound="ignore", pin_scope="shard",
                           pin_background=True, background_chunk="4MiB") as pool:
            s = pool.wait_pinned(timeout=60)
            out.put((rank, pool.shard, s["state"], [(r["offset"], r["len"]) for r in s["ranges"]]))
    except Exception as e:  # reported to the parent
        out.put((rank, None, f"{type(e).__name__}: {e}", []))


def test_each_rank_of_a_shared_pool_pins_its_own_shard_in_the_background():
    import os

    results = spawn_ranks(_shard_rank, f"py-bgpin-{os.getpid()}", 2)
    for rank, shard, state, ranges in results:
        assert state == "pinned", (rank, state)
        assert ranges == [tuple(shard)], f"rank {rank} pinned {ranges}, its shard is {shard}"
    assert results[0][1] != results[1][1]


FORK = """
import json, os, hostpool
pool = hostpool.Pool(size="64MiB", block_size="4MiB", pin="cuda", pin_required=True,
                     pin_background=True, background_chunk="8MiB")
mem = memoryview(pool); mem[0] = 7; del mem
assert pool.pin_status()["state"] == "pinning"
plain = hostpool.Pool(size="4MiB")  # no pinner: nothing to be inherited
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    # The child inherited the pool mid-pin: the pinning thread, the pins and
    # the registrations are the parent's.
    out = {"status": pool.pin_status(), "pinned": pool.pinned,
           "plain": plain.pin_status()["state"], "plain_issues": plain.close()}
    out["waited"] = pool.wait_pinned(timeout=None)["state"]   # no thread to wait for
    mem = memoryview(pool); out["reads"] = mem[0]; del mem
    addr = pool.addr
    out["issues"] = pool.close()
    del pool  # close() keeps the range reserved until the object goes
    import gc; gc.collect()
    out["still_mapped"] = any(int(l.split("-")[0], 16) == addr for l in open("/proc/self/maps"))
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(r, 1 << 16) or b"{}")
parent = {"exit": status, "waited": pool.wait_pinned(timeout=60)["state"]}
mem = memoryview(pool); parent["reads"] = mem[0]; del mem
parent["issues"] = pool.close() + plain.close()
print(json.dumps({"child": child, "parent": parent}))
"""


def test_a_child_forked_mid_pin_releases_only_its_view(fake_cuda_dir, tmp_path):
    """Engines fork (multiprocessing's default on Linux): a child that
    inherits a pool while it is pinned in the background once panicked
    joining a pinning thread that exists only in the parent. Now the child
    reports its copy unpinned, waits for nothing, and its close unmaps only
    its own view: no CUDA call from it, and the parent's pin goes on."""
    log = tmp_path / "calls-fork.log"
    out = run_python(FORK, {"LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log),
                            "FAKE_CUDA_REGISTER_DELAY_MS": "100"})
    assert out.returncode == 0, out.stderr
    assert "panicked" not in out.stderr, out.stderr
    r = json.loads(out.stdout)
    child, parent = r["child"], r["parent"]
    assert child["status"]["state"] == "skipped" and "inherited the pool from pid" in child["status"]["error"], child
    assert child["pinned"] is False and child["waited"] == "skipped"
    assert child["plain"] == "off" and child["plain_issues"] == [], child
    assert child["reads"] == 7 and child["issues"] == [] and not child["still_mapped"], child
    assert parent["exit"] == 0 and parent["waited"] == "pinned" and parent["reads"] == 7, parent
    assert parent["issues"] == []
    calls = [line.split()[0] for line in log.read_text().splitlines()]
    # Every register matched by one unregister: the child unregistered nothing.
    assert calls.count("cuMemHostRegister_v2") == calls.count("cuMemHostUnregister") == 8, calls


PAUSE = """
import json, os, time, hostpool
pool = hostpool.Pool(size="64MiB", block_size="4MiB", pin="cuda", pin_required=True,
                     pin_background=True, background_chunk="8MiB")

def registered():
    # The fake driver logs each cuMemHostRegister_v2 as it returns.
    with open(os.environ["FAKE_CUDA_LOG"]) as f:
        return sum("cuMemHostRegister_v2" in line for line in f)

def parked():
    # The chunk in flight at the pause (0.1 s) has finished and is counted
    # (the status has every chunk the driver registered), and the pinning
    # thread waits in the pause (`parked`): from here it pins nothing until
    # resumed.
    deadline = time.monotonic() + 20
    while True:
        s = pool.pin_status()
        if s["parked"] and s["chunks"] == registered():
            return s
        if time.monotonic() > deadline:
            raise SystemExit(f"the pinning thread never waited in the pause: {s}")
        time.sleep(0.01)

out = {}
while pool.pin_status()["chunks"] < 1:
    time.sleep(0.01)
out["paused_running"] = pool.pause_pinning()
at_pause = parked()
# Six chunks' time, waiting for the pin: none may be pinned meanwhile.
out["wait_while_paused"] = pool.wait_pinned(timeout=0.6)["state"]
out["at_pause"], out["later"] = at_pause, pool.pin_status()
out["still_parked"] = parked()["chunks"] == at_pause["chunks"]
if MODE == "resume":
    out["resumed_running"] = pool.resume_pinning()
    out["waited"] = pool.wait_pinned(timeout=60)
    out["pause_after"] = pool.pause_pinning()  # nothing left to pause
    time.sleep(0.1)
    out["seconds_after"] = pool.pin_status()["seconds"]  # the clock stopped at the end
out["issues"] = pool.close()
print(json.dumps(out))
"""


def _pause(fake_cuda_dir, tmp_path, mode):
    log = tmp_path / f"calls-pause-{mode}.log"
    out = run_python(PAUSE.replace("MODE", repr(mode)),
                     {"LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log),
                      "FAKE_CUDA_REGISTER_DELAY_MS": "100"})
    assert out.returncode == 0, out.stderr
    calls = [line.split()[0] for line in log.read_text().splitlines() if "HostRegister" in line or "HostUnregister" in line]
    return json.loads(out.stdout), calls


def test_a_paused_background_pin_pins_nothing_more_until_resumed(fake_cuda_dir, tmp_path):
    r, calls = _pause(fake_cuda_dir, tmp_path, "resume")
    assert r["paused_running"] is True and r["still_parked"]
    a, b = r["at_pause"], r["later"]
    assert a["paused"] and a["state"] == "pinning", a
    assert 1 <= a["chunks"] < 8 and b["chunks"] == a["chunks"], (a, b)
    assert b["pinned_bytes"] == a["pinned_bytes"]
    assert r["wait_while_paused"] == "pinning"
    assert r["resumed_running"] is True
    w = r["waited"]
    assert w["state"] == "pinned" and not w["paused"] and w["chunks"] == 8, w
    assert r["pause_after"] is False
    assert r["seconds_after"] == w["seconds"], (r["seconds_after"], w["seconds"])
    assert calls.count("cuMemHostRegister_v2") == calls.count("cuMemHostUnregister") == 8
    assert r["issues"] == []


def test_closing_a_paused_pin_unpins_what_it_pinned(fake_cuda_dir, tmp_path):
    r, calls = _pause(fake_cuda_dir, tmp_path, "close")
    pinned = r["at_pause"]["chunks"]
    assert r["at_pause"]["paused"] and 1 <= pinned < 8
    assert calls.count("cuMemHostRegister_v2") == pinned, "no chunk pinned after the pause"
    assert calls.count("cuMemHostUnregister") == pinned and calls[-1] == "cuMemHostUnregister"
    assert r["issues"] == []
