"""Data parallelism: D engine replicas (each its own TP × PP ranks) behind one API server.

Each request goes to the replica with the least outstanding work (prompt tokens plus the
tokens still to generate of the requests it is serving), as vLLM's DP coordinator
balances by queue length. Each replica is a process of its own (process_replica; Ray actors with
`--data-parallel-backend ray`) and they share nothing — except with --enable-expert-parallel, where
a MoE model's experts spread over every replica's ranks (EP = TP × DP) and the replicas step
together in this process (llmctl.engine.front.lockstep). A local replica that dies makes the whole server unhealthy,
as one engine would; Ray replicas (`--data-parallel-backend ray`) survive each other's loss: requests,
tokenization, grammar checks and adapters go to those still running.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from llmctl.checkpoint.source import ModelSource
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import WorkerLostError
from llmctl.engine.front.async_engine import AsyncLLMEngine
from llmctl.engine.front.engine_client import EngineClient
from llmctl.engine.front.llm_engine import LLMEngine
from llmctl.engine.front.lockstep import LockstepExecutor, LockstepRounds
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.stats import EngineStats
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.multimodal.items import EnginePrompt
from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.params import PoolingParams, PoolingRequestOutput
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.structured.params import StructuredOutputsParams
from llmctl.engine.worker.threads import threads_per_rank

T = TypeVar("T")


def replica_configs(config: EngineConfig) -> tuple[list[EngineConfig], Any]:
    """One config per replica, their ranks sharing this machine's cores; with expert parallelism each joins
    the store (returned, to be kept alive) where the replicas' MoE layers meet."""
    single = dataclasses.replace(config, data_parallel_size=1, cpu_threads=threads_per_rank(config))
    count = config.data_parallel_size
    if not config.enable_expert_parallel:
        return [single] * count, None
    import torch.distributed as dist

    from llmctl.engine.distributed.expert_exchange import ReplicaGroup
    from llmctl.engine.executor.layout import check_expert_replicas

    check_expert_replicas(config)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return [dataclasses.replace(single, replica_group=ReplicaGroup("127.0.0.1", store.port, index, count))
            for index in range(count)], store


def in_lockstep(engines: list[LLMEngine]) -> LockstepRounds:
    """The replicas' forwards from now on in rounds (their loads and warm-ups kept to their own tokens)."""
    rounds = LockstepRounds(len(engines))
    for index, engine in enumerate(engines):
        engine.executor = LockstepExecutor(engine.executor, rounds, index)
    return rounds


def create_engine_client(config: EngineConfig) -> EngineClient:
    if config.data_parallel_size == 1:
        return AsyncLLMEngine(LLMEngine(config))
    return DataParallelEngine(config)


class DataParallelEngine:
    """The EngineClient interface over several replicas."""

    def __init__(self, config: EngineConfig) -> None:
        self.on_ray = config.data_parallel_backend == "ray"  # replicas as Ray actors survive each other's loss
        if self.on_ray:
            from llmctl.engine.front.ray_replica import ray_replicas

            engines, self._store, self._rounds = ray_replicas(config), None, None
        elif config.enable_expert_parallel:
            # the replicas' MoE layers exchange tokens: they step together, in this process
            configs, self._store = replica_configs(config)
            engines = [LLMEngine(one) for one in configs]
            self._rounds = in_lockstep(engines)
        else:  # a process per replica, as vLLM's engine-core processes
            from llmctl.engine.front.process_replica import process_replicas

            engines, self._store, self._rounds = process_replicas(replica_configs(config)[0]), None, None
        self.replicas = [AsyncLLMEngine(engine) for engine in engines]
        self._outstanding = [0] * len(self.replicas)
        self._serving: dict[str, int] = {}  # request id -> the replica generating it
        self._lock = threading.Lock()

    # Tokenizer, model facts and limits are the same in every replica, and held here: replica 0's.
    @property
    def tokenizer(self) -> Any:
        return self.replicas[0].tokenizer

    @property
    def max_model_len(self) -> int:
        return self.replicas[0].max_model_len

    @property
    def source(self) -> ModelSource:
        return self.replicas[0].source

    @property
    def spec(self) -> ModelSpec:
        return self.replicas[0].spec

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        return self._ask_one(lambda replica: replica.tokenize(prompt))

    def check_structured_outputs(self, params: StructuredOutputsParams) -> None:
        self._ask_one(lambda replica: replica.check_structured_outputs(params))

    def stats(self) -> list[EngineStats]:
        return [stats for replica in self.replicas for stats in replica.stats()]  # a lost one's: its last

    def add_lora(self, lora_request: LoRARequest) -> None:
        for replica in self._live():
            replica.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> None:
        for replica in self._live():
            replica.remove_lora(lora_int_id)

    def _live(self) -> list[AsyncLLMEngine]:
        """The replicas whose calls can be answered: on Ray those still running (a lost one's fail), else all."""
        return [replica for replica in self.replicas if not self.on_ray or replica.is_running]

    def _ask_one(self, call: Callable[[AsyncLLMEngine], T]) -> T:
        """`call` of the first live replica; on Ray, one found lost by it hands the call to the next."""
        for replica in self._live() or self.replicas[:1]:
            try:
                return call(replica)
            except WorkerLostError:
                if not self.on_ray or not any(r.is_running for r in self.replicas):
                    raise
        raise WorkerLostError("every data-parallel replica was lost")

    def lost_workers(self) -> str | None:
        lost = [reason for reason in (r.lost_workers() for r in self.replicas) if reason is not None]
        if self.on_ray and len(lost) < len(self.replicas):
            return None  # the other replicas go on serving
        return lost[0] if lost else None

    @property
    def is_running(self) -> bool:
        running = [replica.is_running for replica in self.replicas]
        return any(running) if self.on_ray else all(running)

    @property
    def dead_error(self) -> BaseException | None:
        return next((r.dead_error for r in self.replicas if r.dead_error is not None), None)

    def pick(self) -> int:
        """The replica with the least outstanding work (on Ray: of those still running)."""
        candidates = [i for i, r in enumerate(self.replicas) if not self.on_ray or r.is_running] or [0]
        with self._lock:
            return min(candidates, key=lambda i: self._outstanding[i])

    @property
    def pooler(self) -> PoolerConfig | None:
        return self.replicas[0].pooler

    async def encode(self, prompt: str | list[int], params: PoolingParams,
                     request_id: str | None = None) -> AsyncIterator[PoolingRequestOutput]:
        async for output in self.generate(prompt, params, request_id):  # type: ignore[arg-type]
            yield output  # type: ignore[misc]

    async def generate(self, prompt: EnginePrompt, params: SamplingParams, request_id: str | None = None,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        outputs = (params.max_tokens or 0) * params.n if isinstance(params, SamplingParams) else 0
        work = (len(prompt) if isinstance(prompt, list) else 1) + outputs
        for _ in self.replicas:
            index = self.pick()
            with self._lock:
                self._outstanding[index] += work
                if request_id is not None:
                    self._serving[request_id] = index
            produced = False
            try:
                async for output in self.replicas[index].generate(prompt, params, request_id, lora_request):
                    produced = True
                    yield output
                return
            except WorkerLostError as error:
                # a Ray replica found lost at this request, before any output: another running one takes it
                if produced or not self.on_ray or not any(r.is_running for r in self.replicas):
                    raise
                lost = error
            finally:
                with self._lock:
                    self._outstanding[index] -= work
                    self._serving.pop(request_id, None)
        raise lost  # every replica was tried

    def abort(self, request_id: str) -> None:
        with self._lock:
            index = self._serving.get(request_id)
        if index is not None:
            self.replicas[index].abort(request_id)

    @property
    def engines(self) -> list[LLMEngine]:
        return [replica.engine for replica in self.replicas]

    def shutdown(self, timeout: float = 10.0) -> None:
        if self._rounds is not None:
            self._rounds.stop()
        for replica in self.replicas:
            replica.shutdown(timeout)
