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
from typing import Any

from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import WorkerLostError
from llmctl.engine.front.remote_replica import RemoteReplicaEngine, ReplicaServer

logger = logging.getLogger("llmctl.engine")


class ReplicaActor(ReplicaServer):
    """The Ray actor: a ReplicaServer that also says which node it runs on."""

    def node(self) -> str:
        import ray

        return ray.util.get_node_ip_address()


class RayReplicaEngine(RemoteReplicaEngine):
    """The LLMEngine surface AsyncLLMEngine uses, over a ReplicaActor."""

    def __init__(self, actor: Any, ray: Any) -> None:
        super().__init__()
        self.ray, self.actor = ray, actor
        self._take_facts()
        self.node = self._invoke("node")

    def _invoke(self, method: str, *args: Any) -> Any:
        """The call's result; the replica's own errors as they are, a lost actor or node as WorkerLostError."""
        ray = self.ray
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except ray.exceptions.RayTaskError as exc:
            raise exc.as_instanceof_cause() from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            self._lost = f"the Ray replica's actor was lost ({str(exc).splitlines()[0][:200]})"
            raise WorkerLostError(self._lost) from None

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
