"""examples/vllm_offload_region.py runs as documented and fails loudly."""

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm_offload_region.py"


def run_example(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True, text=True, timeout=240, env={**os.environ, **(env or {})},
    )


def test_four_ranks_share_one_region_and_see_each_others_writes():
    proc = run_example("--world", "4", "--size", "64MiB")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    oks = [line for line in proc.stdout.splitlines() if line.startswith("rank ")]
    assert sorted(line.split(":")[0] for line in oks) == [f"rank {r}" for r in range(4)], proc.stdout
    shards = {line.split("shard ")[1].split(", pinned")[0] for line in oks}
    assert len(shards) == 4, proc.stdout  # each rank prefaulted its own shard
    assert "all 4 ranks see each other's writes" in proc.stdout


def test_the_example_pins_when_a_driver_is_there(fake_cuda_dir):
    proc = run_example("--world", "2", "--size", "8MiB", env={"LD_LIBRARY_PATH": str(fake_cuda_dir)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("pinned=True") == 2


def test_a_region_too_small_for_one_row_fails_with_nonzero_exit():
    proc = run_example("--world", "2", "--size", "64KiB", "--page", str(64 << 10), "--timeout", "60")
    assert proc.returncode != 0
    assert "ConfigError" in proc.stderr and "at least one row" in proc.stderr and "FAILED" in proc.stderr
