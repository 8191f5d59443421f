"""hostpool.Pool(...) against `hostpool alloc` for the same pool, interleaved in one run.

The binding should add no measurable cost: the ratio is, per interleaved pair
of runs (the median over pairs), the CLI's build (the
sum of its map, prefault, attach, pin and register phases, timed inside the
process) over the wall time of the `hostpool.Pool(...)` call in Python
(config, plan, the build thread, progress polling, everything). 1.0 is
parity; the target is >= 0.95.

    python crates/hostpool-py/bench/build_vs_cli.py --size 2GiB [--dir /dev/shm] [--threads 2] [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import hostpool

BUILD_PHASES = ("map", "prefault", "barrier", "attach", "pin", "register")


def _cli() -> str:
    if os.environ.get("HOSTPOOL_BIN"):
        return os.environ["HOSTPOOL_BIN"]
    root = pathlib.Path(__file__).resolve().parents[3]
    for profile in ("release", "debug"):
        exe = root / "target" / profile / "hostpool"
        if exe.exists():
            return str(exe)
    sys.exit("build the CLI first: cargo build --release -p hostpool")


def _build_seconds(report: dict) -> float:
    return sum(report["phases"].get(p, 0.0) for p in BUILD_PHASES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--backing", default="auto")
    ap.add_argument("--dir")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    flags = ["--size", args.size, "--backing", args.backing]
    kwargs: dict = {"size": args.size, "backing": args.backing}
    if args.dir:
        flags += ["--dir", args.dir]
        kwargs["dir"] = args.dir
    if args.threads:
        flags += ["--threads", str(args.threads)]
        kwargs["threads"] = args.threads
    cli, py_wall, py_phases = [], [], []

    def run_cli() -> None:
        out = subprocess.run([_cli(), "alloc", *flags, "--json"], capture_output=True, text=True, check=True)
        cli.append(_build_seconds(json.loads(out.stdout)))

    def run_python() -> tuple[str, int]:
        start = time.perf_counter()
        pool = hostpool.Pool(**kwargs)
        py_wall.append(time.perf_counter() - start)
        py_phases.append(_build_seconds(pool.report))
        pool.close()
        return pool.backing, pool.page_size

    for i in range(args.repeat):
        # Pairs in alternating order, so neither side always runs on a
        # freshly released pool.
        if i % 2 == 0:
            run_cli()
            backing, page = run_python()
        else:
            backing, page = run_python()
            run_cli()
    pair_ratios = [c / p for c, p in zip(cli, py_wall)]
    result = {
        "size": args.size,
        "backing": backing,
        "page_size": page,
        "threads": args.threads,
        "repeat": args.repeat,
        "cli_build_s": statistics.median(cli),
        "python_wall_s": statistics.median(py_wall),
        "python_phases_s": statistics.median(py_phases),
        # The median of each pair's ratio, and the ratio of the best runs
        # (the least disturbed by the shared machine).
        "ratio": statistics.median(pair_ratios),
        # What the binding itself adds around the build's phases.
        "binding_overhead_s": statistics.median(w - p for w, p in zip(py_wall, py_phases)),
        "ratio_best": min(cli) / min(py_wall),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['backing']:<14} {page >> 10:>8} KiB  {args.size:>6}  CLI build {result['cli_build_s'] * 1e3:8.1f} ms"
            f"  Pool() {result['python_wall_s'] * 1e3:8.1f} ms  (its phases {result['python_phases_s'] * 1e3:8.1f} ms)"
            f"  ratio {result['ratio']:.3f} (best runs {result['ratio_best']:.3f});"
            f" binding overhead {result['binding_overhead_s'] * 1e3:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
