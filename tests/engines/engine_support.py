"""The default suite's helpers (huge page mounts, the fake CUDA driver, the
leftovers check, `run_python`), for the engine tests and the workers they
spawn: `tests/python/conftest.py`, loaded by path (every conftest is named
conftest)."""

from __future__ import annotations

import importlib.util
import pathlib

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

__all__ = ["installed_versions_are_the_readmes", "fake_cuda_dir", "nothing_left_behind", "hugetlbfs_mount", "free_hugepages", "run_python", "shm_files"]


def installed_versions_are_the_readmes(rows: dict[str, str]) -> None:
    """Each ``{README name: distribution}`` is installed at its pin, and the README's
    table of tested engines says that version, with the torch installed here."""
    import importlib.metadata as md

    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    torch = md.version("torch").split("+")[0]
    for name, dist in rows.items():
        version = md.version(dist)
        row = f"| {name} | {version} | {torch} |"
        assert row in readme, f"README's table of tested engines lacks {row!r}"
