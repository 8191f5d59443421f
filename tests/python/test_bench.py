"""The build benchmark (crates/hostpool-py/bench/build_vs_cli.py) runs and
reports what it claims; its figures are measured by running it, not here."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_the_build_benchmark_pairs_the_cli_and_python(hostpool_bin):
    out = subprocess.run(
        [sys.executable, ROOT / "crates/hostpool-py/bench/build_vs_cli.py", "--size", "32MiB", "--repeat", "2", "--json"],
        capture_output=True, text=True, env={"HOSTPOOL_BIN": str(hostpool_bin), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert (r["backing"], r["repeat"]) == ("anon", 2)
    assert r["cli_build_s"] > 0 and r["ratio"] > 0
    # The wall time of Pool() contains its phases.
    assert r["python_wall_s"] >= r["python_phases_s"] and r["binding_overhead_s"] >= 0
