"""Ctrl-C stops the build of the thread it interrupts, and no other.

Each build has a cancel token of its own (nothing process-wide): a process
building two pools, one in a thread of its own and one in the main thread,
that gets SIGINT half way raises `KeyboardInterrupt` in the main thread,
tears down that build, and the other thread's build goes on to the end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import shared_mapped, socket_bound

MiB = 1 << 20

TWO_BUILDS = """
import os, threading, hostpool, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
pid = os.getpid()
other = {}
def build_other():
    # Rank 0 of pool B waits for its rank 1, which the main thread becomes
    # once its own build was interrupted.
    try:
        with hostpool.Pool(size="64MiB", shared=hostpool.Shared(f"py-two-b-{pid}", 2, 0, attach_timeout=60.0)) as p:
            other["built"] = p.report["sharing"]["rank"]
            other["ready"].wait(60)
    except BaseException as e:
        other["error"] = repr(e)
other["ready"] = threading.Event()
t = threading.Thread(target=build_other)
t.start()
try:
    # Pool A: rank 1 never comes, so this build waits until Ctrl-C.
    hostpool.Pool(size="64MiB", shared=hostpool.Shared(f"py-two-a-{pid}", 2, 0, attach_timeout=60.0))
    print("A BUILT", flush=True)
except KeyboardInterrupt:
    print("A INTERRUPTED", flush=True)
with hostpool.Pool(size="64MiB", shared=hostpool.Shared(f"py-two-b-{pid}", 2, 1, attach_timeout=60.0)) as p:
    print("B JOINED", p.report["sharing"]["rank"], flush=True)
    other["ready"].set()
    t.join(60)
print("B", other.get("built"), other.get("error"), flush=True)
"""


def test_ctrl_c_in_one_thread_stops_its_build_and_leaves_the_other_built():
    proc = subprocess.Popen([sys.executable, "-c", TWO_BUILDS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Both builds wait for their rank 1: both creators bound their socket
        # names and mapped their 64 MiB.
        deadline = time.monotonic() + 30
        while not (
            socket_bound(f"py-two-a-{proc.pid}")
            and socket_bound(f"py-two-b-{proc.pid}")
            and shared_mapped(proc.pid) >= 128 * MiB
        ):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"{shared_mapped(proc.pid)} B mapped"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "A INTERRUPTED", out + err
    assert lines[1] == "B JOINED 1", out + err
    # The other thread's build was not torn down by the main thread's Ctrl-C:
    # it completed when its rank 1 came, after the interrupt.
    assert lines[2] == "B 0 None", out + err
