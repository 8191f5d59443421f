"""Pinning from Python through the real FFI path, against the test double
of the CUDA driver (crates/fake-cuda loaded as libcuda.so.1): chunks,
rollback of a failed chunk, and best effort against required."""

from __future__ import annotations

import json

from conftest import run_python

POOL = """
import json, hostpool
try:
    pool = hostpool.Pool.from_config({"size": "96MiB", "block_size": "4MiB", "cuda": {"chunk_size": "32MiB"},
                                      "pin": {"kind": "cuda", "required": REQUIRED}})
except hostpool.Error as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e), "exit_code": e.exit_code}))
else:
    info = {"pinned": pool.pinned, "reason": pool.pin_reason, "chunks": (pool.report["pin"]["details"] or {}).get("chunks")}
    info["issues"] = pool.close()
    print(json.dumps(info))
"""


def _run(fake_cuda_dir, required: bool, **env):
    log = fake_cuda_dir / f"calls-{required}-{len(env)}.log"
    log.unlink(missing_ok=True)
    out = run_python(
        POOL.replace("REQUIRED", str(required)),
        {"LD_LIBRARY_PATH": str(fake_cuda_dir), "FAKE_CUDA_LOG": str(log), **env},
    )
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return json.loads(out.stdout), calls


def _count(calls, name):
    return sum(1 for c in calls if c.startswith(name))


def test_the_fake_driver_pins_the_pool_in_chunks_and_close_unpins_them(fake_cuda_dir):
    info, calls = _run(fake_cuda_dir, True)
    assert info["pinned"] is True and info["reason"] is None
    assert len(info["chunks"]) == 3, info
    assert info["issues"] == []
    assert (_count(calls, "cuMemHostRegister"), _count(calls, "cuMemHostUnregister")) == (3, 3), calls


def test_a_failed_chunk_rolls_back_and_fails_a_required_pin_with_pin_error(fake_cuda_dir):
    info, calls = _run(fake_cuda_dir, True, FAKE_CUDA_FAIL_REGISTER_AT="3")
    assert info["error"] == "PinError", info
    assert "chunk 2 (offset 64 MiB, 32 MiB)" in info["message"], info
    assert "CUDA_ERROR_OUT_OF_MEMORY" in info["message"]
    assert "were unregistered in reverse" in info["message"]
    assert info["exit_code"] == 1
    assert _count(calls, "cuMemHostUnregister") == 2, "the two registered chunks are rolled back"


def test_a_failed_chunk_leaves_a_best_effort_pool_pageable_with_the_reason(fake_cuda_dir):
    info, calls = _run(fake_cuda_dir, False, FAKE_CUDA_FAIL_REGISTER_AT="2")
    assert info["pinned"] is False
    assert "CUDA_ERROR_OUT_OF_MEMORY" in info["reason"]
    assert _count(calls, "cuMemHostRegister") == 2 and _count(calls, "cuMemHostUnregister") == 1


def test_no_device_is_not_available_when_required(fake_cuda_dir):
    info, _ = _run(fake_cuda_dir, True, FAKE_CUDA_DEVICES="0")
    assert info["error"] == "NotAvailableError", info
