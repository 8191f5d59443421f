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

__all__ = ["fake_cuda_dir", "nothing_left_behind", "hugetlbfs_mount", "free_hugepages", "run_python", "shm_files"]
