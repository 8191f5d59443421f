"""The wheel's ``vllm.general_plugins`` entry point (``hostpool``), which vLLM runs in
every process it starts: LMCache's adapter where ``HOSTPOOL_LMCACHE`` holds a pool
config (:mod:`hostpool.lmcache`), and HiSparse's hook where this vLLM has HiSparse
(:mod:`hostpool.hisparse`: a no-op without a ``hostpool`` table in the
HiSparseConnector's config). Neither raises into vLLM."""

from __future__ import annotations

__all__ = ["general_plugin"]


def general_plugin() -> None:
    """Install what the process's environment and vLLM ask for; never raises."""
    from hostpool import hisparse, lmcache

    lmcache._vllm_general_plugin()
    hisparse._vllm_general_plugin()
