"""Fixtures of the engine tests, which run the engines' released code.

Each folder runs in the environment of its `requirements*.txt` (`cargo xtask
test` makes them), never in the default test environment: `vllm` (vLLM and
LMCache), `sglang`.
"""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
# engine_support, for the tests and for the workers they spawn (which inherit sys.path).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from engine_support import fake_cuda_dir, nothing_left_behind  # noqa: E402,F401  (fixtures)


def pytest_configure(config) -> None:
    # `cargo xtask test` runs the engine's older pinned environments with
    # -m "not newest_only": a slow fault test may run on the newest release alone.
    config.addinivalue_line("markers", "newest_only: runs in the engine's newest pinned environment alone")


@pytest.fixture
def engine_id(request) -> str:
    """An engine id no other test or process uses."""
    return f"t{os.getpid()}-{request.node.name[-24:]}".replace("[", "-").replace("]", "")
