"""A data-parallel replica as a Ray actor (`--data-parallel-backend ray`, vLLM's flag).

The actor holds a whole LLMEngine (scheduler, sampler and its own TP × PP ranks, spawned on the
actor's node); `RayReplicaEngine` stands in for that engine in the API server, so the replica's
AsyncLLMEngine thread drives it as it drives a local one: each call is one Ray method call, in order.
A replica whose actor or node dies raises WorkerLostError from its next call; the data-parallel front
then routes around it.
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import WorkerLostError
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.stats import EngineStats
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.multimodal.items import EnginePrompt
from llmctl.engine.sampling_params import SamplingParams

logger = logging.getLogger("llmctl.engine")


class ReplicaActor:
    """The remote side: an LLMEngine and the calls the API server makes of it."""

    def __init__(self, config: EngineConfig) -> None:
        from llmctl.engine.front.llm_engine import LLMEngine

        self.engine = LLMEngine(config)

    def facts(self) -> tuple[Any, Any, Any, int, str, Any]:
        import ray

        loaded = self.engine.loaded
        return self.engine.tokenizer, loaded.source, loaded.spec, self.engine.max_model_len, \
            ray.util.get_node_ip_address(), self.engine.pooler

    def add_request(self, request_id: str, prompt: EnginePrompt, params: SamplingParams | None,
                    lora_request: LoRARequest | None) -> None:
        self.engine.add_request(request_id, prompt, params, lora_request)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def step(self) -> list[RequestOutput]:
        return self.engine.step()

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests

    def call(self, name: str, *args: Any) -> Any:
        """stats, tokenize, add_lora, remove_lora, and the structured-output check."""
        if name == "check_structured_outputs":
            return self.engine.structured.matcher(*args) and None
        return getattr(self.engine, name)(*args)

    def shutdown(self) -> None:
        self.engine.executor.shutdown()


class RayReplicaEngine:
    """The LLMEngine surface AsyncLLMEngine uses, over a ReplicaActor."""

    def __init__(self, actor: Any, ray: Any) -> None:
        self.ray, self.actor = ray, actor
        self._lost: str | None = None
        self._last_stats: EngineStats | None = None
        self.tokenizer, source, spec, self.max_model_len, self.node, self.pooler = \
            self._get(self.actor.facts.remote())
        self.loaded = SimpleNamespace(source=source, spec=spec)
        self.structured = SimpleNamespace(matcher=lambda params: self._call("check_structured_outputs", params))
        self.executor = SimpleNamespace(healthy=self._healthy, shutdown=self._shutdown)

    def _get(self, ref: Any) -> Any:
        """The call's result; the replica's own errors as they are, a lost actor or node as WorkerLostError."""
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            raise exc.as_instanceof_cause() from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            self._lost = f"the Ray replica's actor was lost ({str(exc).splitlines()[0][:200]})"
            raise WorkerLostError(self._lost) from None

    def _call(self, name: str, *args: Any) -> Any:
        return self._get(self.actor.call.remote(name, *args))

    def add_request(self, request_id: str, prompt: EnginePrompt, params: SamplingParams | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        self._get(self.actor.add_request.remote(request_id, prompt, params, lora_request))

    def abort(self, request_id: str) -> None:
        self._get(self.actor.abort.remote(request_id))

    def step(self) -> list[RequestOutput]:
        return self._get(self.actor.step.remote())

    @property
    def has_unfinished_requests(self) -> bool:
        return self._get(self.actor.has_unfinished_requests.remote())

    def stats(self) -> EngineStats:
        """The replica's counters; once it is lost, the last ones read with nothing running or waiting, so
        /metrics keeps each replica's label and its counters never go back."""
        if self._lost is None:
            try:
                self._last_stats = self._call("stats")
                return self._last_stats
            except WorkerLostError:
                pass
        last = self._last_stats or EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0)
        return dataclasses.replace(last, num_running=0, num_waiting=0, kv_cache_usage=0.0)

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        return self._call("tokenize", prompt)

    def add_lora(self, lora_request: LoRARequest) -> None:
        self._call("add_lora", lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self._call("remove_lora", lora_int_id)

    def _healthy(self) -> bool:
        return self._lost is None

    def _shutdown(self) -> None:
        if self._lost is None:
            try:
                self.ray.get(self.actor.shutdown.remote(), timeout=30)
            except Exception:  # already gone: nothing to stop
                pass
        self.ray.kill(self.actor)


def ray_replicas(config: EngineConfig) -> list[RayReplicaEngine]:
    """--dp D replicas as actors on the Ray cluster, each reserving its TP × PP ranks' GPUs (or CPUs)."""
    from llmctl.engine.errors import EngineConfigError
    from llmctl.engine.executor.ray_launch import bundle, connect, import_ray

    if config.enable_expert_parallel:
        raise EngineConfigError("--enable-expert-parallel across replicas steps them together in one process: use "
                                "--data-parallel-backend mp with it")
    ray = import_ray()
    connect(ray)
    ranks = config.tensor_parallel_size * config.pipeline_parallel_size
    resources = {name: amount * ranks for name, amount in bundle(config).items()}
    remote = ray.remote(ReplicaActor).options(num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0))
    # a replica's own ranks are spawned on its node (Ray actors of their own would need resources it holds)
    one = dataclasses.replace(config, data_parallel_size=1, distributed_executor_backend="mp")
    actors = [remote.remote(one) for _ in range(config.data_parallel_size)]  # they load side by side
    engines = [RayReplicaEngine(actor, ray) for actor in actors]
    for index, engine in enumerate(engines):
        logger.info("data-parallel replica %d on Ray node %s", index, engine.node)
    return engines
