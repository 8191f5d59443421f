"""``python -m hostpool``: the ``hostpool`` CLI that the wheel installs beside
the package (same flags, output and exit statuses as the cargo-built one).

It runs with ``HOSTPOOL_PYTHON`` set to this interpreter (unless already
set), so ``python -m hostpool doctor`` asks the caller's environment whether
it imports Mooncake's engine."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig


def _cli() -> str:
    exe = os.path.join(sysconfig.get_path("scripts"), "hostpool")
    if os.path.isfile(exe) and os.access(exe, os.X_OK):
        return exe
    found = shutil.which("hostpool")
    if found:
        return found
    sys.exit(
        "hostpool: the hostpool CLI is not installed beside this package: the wheel that "
        "`cargo xtask wheel` builds ships it; from source, build it with "
        "`cargo build --release -p hostpool-cli` and put it on the PATH"
    )


def main() -> None:
    exe = _cli()
    if sys.executable:
        os.environ.setdefault("HOSTPOOL_PYTHON", sys.executable)
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
