"""Fixtures of the engine tests that run vLLM's and LMCache's released code.

These run in the environment of `tests/engines/vllm/requirements*.txt`
(`cargo xtask test` makes it), never in the default test environment.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

# The default suite's helpers (huge page mounts, the fake CUDA driver, the
# leftovers check), loaded by path: both files are named conftest.
_spec = importlib.util.spec_from_file_location("hostpool_test_support", ROOT / "tests/python/conftest.py")
_support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_support)
fake_cuda_dir = _support.fake_cuda_dir
nothing_left_behind = _support.nothing_left_behind
hugetlbfs_mount = _support.hugetlbfs_mount
free_hugepages = _support.free_hugepages
run_python = _support.run_python
shm_files = _support.shm_files


@pytest.fixture
def engine_id(request) -> str:
    """An engine id no other test or process uses."""
    return f"t{os.getpid()}-{request.node.name[-24:]}".replace("[", "-").replace("]", "")
