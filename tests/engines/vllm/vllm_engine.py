"""A vLLM engine without a GPU, for the kept-CPU-tier tests: vLLM's own
``Scheduler`` with its ``OffloadingConnector`` (scheduler role), and the
connector's worker role over CPU tensors standing in for the GPU KV cache.

Replaced, only because no GPU exists here: the platform check (CUDA-alike)
and the transfer handler (``SingleDirectionOffloadingHandler`` asserts CUDA
tensors; :class:`CpuCopyHandler` copies the same sub-blocks with torch on the
CPU). The model's forward pass is :func:`fill_blocks`: each computed block's
bytes are a function of its block hash, so a loaded block can be checked.

``kept_engine.py`` runs it, one process per engine generation, after
:func:`install`; the test process imports this module only for
:func:`model_dir`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

BLOCK = 16  # tokens per block
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
KV_HEADS, HEAD_SIZE = 2, 16


class CpuCopyHandler:
    """vLLM's ``SingleDirectionOffloadingHandler`` on the CPU: the same sub-block
    addressing (a chunk holds ``blocks_per_chunk`` GPU-block pages, the first chunk
    of a transfer may start at ``block_indices % blocks_per_chunk``), a copy on the
    CPU instead of a CUDA kernel, finished at once.

    vLLM 0.33 hands it the GPU tensors and two block-id specs; 0.34 hands it the
    device pointers vLLM resolved (``DevicePointers``; here the addresses of the CPU
    tensors standing in for the GPU's) and the CPU spec."""

    def __init__(self, *, cpu_tensors, blocks_per_chunk, gpu_to_cpu, gpu_tensors=None, layer_refs_per_group=None, **_: Any) -> None:
        self.gpu, self.cpu = gpu_tensors, cpu_tensors
        self.refs = layer_refs_per_group
        self.per_chunk, self.to_cpu = blocks_per_chunk, gpu_to_cpu
        self.done: list[int] = []

    def transfer_async(self, job_id: int, src: Any, dst: Any) -> bool:
        if self.gpu is None:
            self._by_pointers(job_id, src, dst)
        else:
            self._by_tensors(job_id, src, dst)
        if self.to_cpu and STORE_HOOK is not None:
            STORE_HOOK("copied", job_id)
        self.done.append(job_id)
        return True

    def _by_tensors(self, job_id: int, src_spec: Any, dst_spec: Any) -> None:
        gpu_spec = src_spec if self.to_cpu else dst_spec
        cpu_spec = dst_spec if self.to_cpu else src_spec
        gpu_blocks = [int(b) for b in gpu_spec.block_ids]
        chunks = [int(c) for c in cpu_spec.block_ids]
        skip = int(gpu_spec.block_indices[0]) % self.per_chunk
        for gpu_t, cpu_t in zip(self.gpu, self.cpu):
            page = gpu_t.shape[1]
            for i, block in enumerate(gpu_blocks):
                chunk, sub = divmod(skip + i, self.per_chunk)
                host = cpu_t[chunks[chunk], sub * page : (sub + 1) * page]
                if self.to_cpu:
                    if STORE_HOOK is not None:
                        STORE_HOOK("copying", job_id)
                    host.copy_(gpu_t[block])
                else:
                    gpu_t[block].copy_(host)

    def _by_pointers(self, job_id: int, device_ptrs: Any, cpu_spec: Any) -> None:
        import ctypes

        from vllm.v1.kv_offload.pointer_utils import iter_pointer_groups

        chunks = [int(c) for c in cpu_spec.block_ids]
        first = 0
        for g in iter_pointer_groups(device_ptrs, self.per_chunk):
            for d, ref in enumerate(self.refs[g.group_idx]):
                cpu_t = self.cpu[ref.tensor_idx]
                at = g.dev_ptr_offset + d * g.group_size
                for i in range(g.group_size):
                    ptr, size = int(device_ptrs.ptrs[at + i]), int(device_ptrs.sizes[at + i])
                    chunk, sub = divmod(g.skip + i, self.per_chunk)
                    host = cpu_t[chunks[first + chunk], sub * size : (sub + 1) * size]
                    assert host.numel() == size and host.is_contiguous()
                    if self.to_cpu:
                        if STORE_HOOK is not None:
                            STORE_HOOK("copying", job_id)
                        ctypes.memmove(host.data_ptr(), ptr, size)
                    else:
                        ctypes.memmove(ptr, host.data_ptr(), size)
            first += g.n_chunks

    def get_finished(self) -> list[Any]:
        from vllm.v1.kv_offload.base import TransferResult

        done, self.done = self.done, []
        return [TransferResult(job_id=j, success=True, transfer_size=0, transfer_time=0.0) for j in done]

    def wait(self, job_ids: set[int]) -> None:
        pass

    def shutdown(self) -> None:
        pass


STORE_HOOK = None


def install() -> None:
    """What cannot run here, replaced in this process (an engine's, never pytest's):
    vLLM's platform says CUDA-alike, and its transfer handler is :class:`CpuCopyHandler`."""
    from vllm.platforms import current_platform
    from vllm.v1.kv_offload.cpu import gpu_worker

    current_platform.is_cuda_alike = lambda: True
    current_platform.is_rocm = lambda: False
    gpu_worker.SingleDirectionOffloadingHandler = CpuCopyHandler

MODEL_DIR_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": KV_HEADS,
    "num_hidden_layers": len(LAYERS),
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
    "rms_norm_eps": 1e-5,
}


def model_dir(root: str, name: str = "tiny-llama") -> str:
    """A model directory vLLM reads offline (a config, no weights: nothing runs it)."""
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(MODEL_DIR_CONFIG, f)
    return path


def _events(args: dict[str, Any]) -> dict[str, Any]:
    """vLLM's KV cache events on (``--kv-events-config``, published nowhere: the
    engine's tests read what would be) when ``args["events"]``."""
    if not args.get("events"):
        return {}
    from vllm.config import KVEventsConfig

    return {"kv_events_config": KVEventsConfig(enable_kv_cache_events=True, publisher="null")}


def vllm_config(args: dict[str, Any]) -> Any:
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    model = ModelConfig(
        model=args["model"], skip_tokenizer_init=True, dtype=args.get("dtype", "float16"), max_model_len=2048
    )
    extra = {
        "spec_name": "HostPoolOffloadingSpec",
        "spec_module_path": "hostpool.vllm",
        "cpu_bytes_to_use": args["cpu_bytes"],
        "hostpool": args["table"],
    }
    parallel = ParallelConfig(tensor_parallel_size=args.get("tp", 1))
    config = VllmConfig(
        model_config=model,
        device_config=DeviceConfig(device="cpu"),
        parallel_config=parallel,
        cache_config=CacheConfig(
            block_size=args.get("block", BLOCK),
            prefix_caching_hash_algo=args.get("hash", "sha256"),
            # Off: every request's blocks go to the connector, none is served
            # from the engine's own GPU prefix cache (a test of the CPU tier).
            enable_prefix_caching=args.get("prefix_caching", True),
        ),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=2048, max_num_seqs=16, max_model_len=2048, is_encoder_decoder=False
        ),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", engine_id=args["engine"], kv_connector_extra_config=extra
        ),
        **_events(args),
    )
    config.parallel_config.rank = args.get("rank", 0)
    # A replica of a data-parallel deployment (vLLM's engine core sets it
    # from its DP rank, with engine_id suffixed `_dp<rank>`).
    config.parallel_config.data_parallel_index = args.get("dp_index", 0)
    return config


def kv_cache_config(config: Any, num_blocks: int) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

    tp = config.parallel_config.tensor_parallel_size
    dtype = config.model_config.dtype
    spec = FullAttentionSpec(
        block_size=config.cache_config.block_size, num_kv_heads=KV_HEADS // tp, head_size=HEAD_SIZE, dtype=dtype
    )
    page = spec.page_size_bytes
    config.cache_config.num_gpu_blocks = num_blocks
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(size=page * num_blocks * len(LAYERS), layers=list(LAYERS), layer_stride=page * num_blocks, block_stride=page)
        ],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)],
    )


class Worker:
    """The connector's worker role over CPU tensors (the engine's GPU KV cache)."""

    def __init__(self, config: Any, kcc: Any) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

        self.config = config
        tp = config.parallel_config.tensor_parallel_size
        block = config.cache_config.block_size
        self.kv = {
            layer: torch.zeros((kcc.num_blocks, 2, block, KV_HEADS // tp, HEAD_SIZE), dtype=config.model_config.dtype)
            for layer in LAYERS
        }
        self.connector = OffloadingConnector(config, KVConnectorRole.WORKER, kcc)
        with set_current_vllm_config(config):
            self.connector.register_kv_caches(self.kv)
        self.rank = config.parallel_config.rank

    def block_bytes(self, block_id: int) -> bytes:
        return b"".join(self.kv[layer][block_id].view(torch.int8).numpy().tobytes() for layer in LAYERS)

    def fill(self, block_id: int, block_hash: bytes) -> None:
        """The 'forward pass': block ``block_id`` gets the bytes of ``block_hash`` (this rank's)."""
        for i, layer in enumerate(LAYERS):
            t = self.kv[layer][block_id].view(torch.int8).reshape(-1)
            t.copy_(torch.frombuffer(bytearray(expected(block_hash, i, self.rank, t.numel())), dtype=torch.int8))

    def step(self, scheduler_output: Any, forward: list[tuple[int, bytes]]) -> Any:
        """What vLLM's model runner does with the connector in one step."""
        from vllm.forward_context import get_forward_context, set_forward_context
        from vllm.v1.outputs import KVConnectorOutput

        c = self.connector
        meta = scheduler_output.kv_connector_metadata
        c.handle_preemptions(meta)
        c.bind_connector_metadata(meta)
        with set_forward_context(None, self.config):
            c.start_load_kv(get_forward_context())
            for block_id, block_hash in forward:
                self.fill(block_id, block_hash)
            c.wait_for_save()
        results = c.get_transfer_results(scheduler_output.finished_req_ids)
        out = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            kv_connector_worker_meta=c.build_connector_worker_meta(),
        )
        c.clear_connector_metadata()
        return out


def runner_output(**fields: Any) -> Any:
    """vLLM's ``ModelRunnerOutput`` of ``fields``, less those this release does not
    have (0.34 dropped ``req_id_to_index``)."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    known = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    return ModelRunnerOutput(**{k: v for k, v in fields.items() if k in known})


def expected(block_hash: bytes, layer: int, rank: int, n: int) -> bytes:
    """The bytes the 'model' writes for a block: a stream seeded by its hash, layer and rank."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(block_hash + bytes([layer, rank]) + counter.to_bytes(4, "little")).digest()
        counter += 1
    return bytes(out[:n])


class Scheduler:
    """vLLM's scheduler with the connector's scheduler role, and requests of known tokens."""

    def __init__(self, config: Any, kcc: Any) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
        from vllm.v1.structured_output import StructuredOutputManager

        self.config = config
        block = config.cache_config.block_size
        self.sched = VllmScheduler(
            vllm_config=config,
            kv_cache_config=kcc,
            structured_output_manager=StructuredOutputManager(config),
            log_stats=True,
            block_size=block,
        )
        # As vLLM's EngineCore: the hash's seed after the scheduler is built.
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block, hash_fn)
        self.requests: dict[str, Any] = {}
        self.external_hits: dict[str, int] = {}

    @property
    def manager(self) -> Any:
        return self.sched.connector.connector_scheduler.manager

    def add(self, req_id: str, tokens: list[int]) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=1)
        params.update_from_generation_config({}, 999)
        req = Request(
            request_id=req_id, prompt_token_ids=tokens, sampling_params=params, pooling_params=None, block_hasher=self.hasher
        )
        self.requests[req_id] = req
        self.sched.add_request(req)

    def schedule(self) -> tuple[Any, list[tuple[int, bytes]]]:
        """vLLM's step, and what the forward pass computes: (GPU block, block hash)."""
        out = self.sched.schedule()
        block = self.config.cache_config.block_size
        forward: list[tuple[int, bytes]] = []
        for new in out.scheduled_new_reqs:
            self.external_hits.setdefault(new.req_id, new.num_computed_tokens)
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.requests[req_id]
            # vLLM's schedule() has already counted this step's tokens as computed.
            start = req.num_computed_tokens - n
            blocks = self.sched.kv_cache_manager.get_block_ids(req_id)[0]
            # Blocks this step computes in full (the prompt's): the forward pass fills them.
            for i in range(start // block, (start + n) // block):
                if i < len(req.block_hashes) and i < len(blocks):
                    forward.append((blocks[i], bytes(req.block_hashes[i])))
        return out, forward

    def update(self, out: Any, kv_output: Any) -> None:
        req_ids = list(out.num_scheduled_tokens)
        mro = runner_output(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[7] for _ in req_ids],
            kv_connector_output=kv_output,
        )
        self.sched.update_from_output(out, mro)

    def busy(self) -> bool:
        m = self.manager
        return self.sched.has_requests() or getattr(m, "_num_write_pending_chunks", 0) > 0


class LocalWorkers:
    """The workers of an engine in this process (vLLM's ``UniProcExecutor``): the same
    calls as ``kept_engine.RemoteWorkers``, one reply per rank."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    def step(self, out: Any, forward: list[tuple[int, bytes]]) -> list[Any]:
        return [w.step(out, forward) for w in self.workers]

    def blocks(self, block_ids: list[int]) -> list[dict[int, bytes]]:
        return [{b: w.block_bytes(b) for b in block_ids} for w in self.workers]


class Engine:
    """One engine's steps: vLLM's scheduler, its workers (local or remote), and the
    executor's merge of their connector outputs (vLLM's ``KVOutputAggregator``)."""

    def __init__(self, sched: Scheduler, workers: Any, world: int) -> None:
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator

        self.sched, self.workers = sched, workers
        self.aggregator = KVOutputAggregator(expected_finished_count=world)

    def finish(self, out: Any, forward: list[tuple[int, bytes]]) -> None:
        """The workers run step ``out``, and the scheduler learns what they did."""
        runs = [
            runner_output(req_ids=[], req_id_to_index={}, kv_connector_output=kv)
            for kv in self.workers.step(out, forward)
        ]
        self.sched.update(out, self.aggregator.aggregate(runs).kv_connector_output)

    def run(self, max_steps: int = 400) -> None:
        """Steps until every request finished and every store completed."""
        for _ in range(max_steps):
            if not self.sched.busy():
                return
            self.finish(*self.sched.schedule())
        raise RuntimeError("the engine did not settle")
