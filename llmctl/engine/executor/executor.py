"""How the driver runs steps: in its own process, or over TP × PP ranks.

The engine submits batches and collects their logits in order. A local executor has one
batch in flight; a pipeline of PP stages keeps up to PP batches in flight, so every stage
has work while the others compute.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Protocol

import torch.distributed as dist

from llmctl.engine.config import EngineConfig
from llmctl.engine.core.step_messages import SampledTokens, StepBatch, StepFailed, StepLogits
from llmctl.engine.distributed.channel import Groups
from llmctl.engine.distributed.expert_exchange import expert_placement
from llmctl.engine.distributed.group import Rank
from llmctl.engine.errors import RemoteStepError, WorkerLostError
from llmctl.engine.executor.launch import Launch, spawn_workers, torchrun_rank, under_torchrun
from llmctl.engine.executor.results import ResultReceiver
from llmctl.engine.executor.stage import LendExperts, Stop, build_stage
from llmctl.engine.worker.cuda_graphs import step_graphs
from llmctl.engine.worker.loaded_model import LoadedModel, Placement
from llmctl.engine.worker.loader import device_for, load_model, read_weights_again
from llmctl.engine.worker.model_runner import make_runner
from llmctl.engine.worker.sleep import Sleeper
from llmctl.engine.worker.threads import thread_governor, use_threads
from llmctl.errors import InternalError, LlmctlError
from llmctl.units import GiB

logger = logging.getLogger("llmctl.engine")


class Executor(Protocol):
    loaded: LoadedModel
    max_in_flight: int
    samples_on_last_stage: bool  # a batch may carry its sampling inputs and come back as SampledTokens

    def submit(self, batch: StepBatch) -> None: ...

    def lend_experts(self) -> None: ...  # EP across replicas: a step without a batch of this replica's own

    def collect(self) -> StepLogits | SampledTokens: ...

    def healthy(self) -> bool: ...

    def shutdown(self) -> None: ...


class LocalExecutor:
    """Every layer in this process; a batch's logits are ready when submit returns."""

    max_in_flight = 1
    samples_on_last_stage = False

    def __init__(self, config: EngineConfig) -> None:
        self.threads = use_threads(config)
        device = device_for(config.device, Rank(0))
        experts = expert_placement(config.enable_expert_parallel, config.replica_group, 0, 1, device)
        self.loaded = load_model(config, Placement(experts=experts))
        self.governor = thread_governor(config, self.threads, self.loaded.device)
        if self.loaded.device.type == "cpu":
            logger.info("%d CPU threads%s (--cpu-threads or OMP_NUM_THREADS to fix the count)", self.threads,
                        ", fewer while other processes keep cores busy" if self.governor else "")
        self.runner = make_runner(self.loaded, config.block_size)
        self.runner.graphs = step_graphs(self.loaded, config)
        self.rank_memory = [(self.loaded.weights_bytes, self.loaded.kv_cache_bytes)]
        self._ready: deque[StepLogits] = deque()
        self.sleeper = Sleeper(self.loaded, lambda: read_weights_again(self.loaded, config),
                               lambda: self.capture_again(config)) if config.enable_sleep_mode else None

    def capture_again(self, config: EngineConfig) -> None:
        """CUDA graphs captured again: after waking (they hold the addresses of storage made again; CPUs kept
        theirs), or once a speculative head has the model keep hidden states (the first capture kept none)."""
        if self.runner.graphs is not None and self.runner.graphs.graphs:
            self.runner.graphs = step_graphs(self.loaded, config)

    def submit(self, batch: StepBatch) -> None:
        if self.governor is not None:
            self.governor.before_step()
        self._ready.append(self.runner.logits(batch, self.runner.forward(batch)))
        if self.governor is not None:
            self.governor.after_step()

    def lend_experts(self) -> None:
        self.runner.lend_experts()

    def collect(self) -> StepLogits:
        return self._ready.popleft()

    def healthy(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass


class ParallelExecutor:
    """The driver: rank 0 runs stage 0 / TP rank 0 itself and drives the other ranks."""

    def __init__(self, config: EngineConfig) -> None:
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        self.config_backend = config.distributed_executor_backend
        self.rank = torchrun_rank(tp, pp) if under_torchrun() else Rank(0, tp, pp)
        self.threads = use_threads(config)  # the driver is a rank too: it must not take every core
        started = time.perf_counter()
        self.launch: Launch = start_ranks(config, self.rank, self.threads)
        self.launch.wait_until_started()
        try:
            self.stage = build_stage(config, self.rank, self.launch.store)
        except LlmctlError:
            self.launch.stop(timeout=1)
            raise
        except Exception as exc:
            self.launch.stop(timeout=1)
            raise self._startup_error(exc) from None
        self.loaded = self.stage.loaded
        self.groups: Groups = self.stage.groups
        self.rank_memory = self.stage.rank_memory
        self.max_in_flight = pp
        self.samples_on_last_stage = pp > 1  # with PP 1 the driver holds the last stage's logits itself
        self._ready: deque[StepLogits] = deque()
        self._results = ResultReceiver(self.groups.results, self.rank.last_stage_leader)
        self._log_layout(time.perf_counter() - started)

    def _startup_error(self, exc: Exception) -> Exception:
        """A worker's own error (it wrote it to the store before exiting), else what the driver saw;
        a worker's bug stays an internal error, not a user's mistake."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for index in range(1, self.rank.world_size):
                key = f"error/{index}"
                if self.launch.store.check([key]):
                    message = self.launch.store.get(key).decode()
                    internal = self.launch.store.check([f"internal/{index}"])
                    return InternalError(message) if internal else LlmctlError(message)
            time.sleep(0.2)
        if isinstance(exc, dist.DistError):  # the ranks never met (a timeout, a refused connection)
            return LlmctlError(f"the worker ranks did not start: {exc}")
        return exc  # the driver's own bug: main() reports it as one (LLMCTL_DEBUG shows its traceback)

    def submit(self, batch: StepBatch) -> None:
        try:
            logits = self.stage.run(batch)
        except RuntimeError as exc:
            raise self._lost(exc) from exc
        if logits is not None:
            self._ready.append(logits)
        else:
            self._results.expect()

    def lend_experts(self) -> None:
        try:
            self.stage.run(LendExperts())
        except RuntimeError as exc:
            raise self._lost(exc) from exc

    def collect(self) -> StepLogits | SampledTokens:
        if self._ready:
            return self._ready.popleft()
        try:
            result = self._results.next()
        except RuntimeError as exc:
            raise self._lost(exc) from exc
        if isinstance(result, StepFailed):
            raise RemoteStepError(result.reason)
        return result

    def _lost(self, exc: Exception) -> WorkerLostError:
        dead = self.launch.dead()
        what = f"{', '.join(dead)} exited" if dead else "a rank stopped answering"
        return WorkerLostError(f"{what} ({str(exc).splitlines()[0][:200]})")

    def healthy(self) -> bool:
        return self.launch.alive()

    def shutdown(self) -> None:
        self._results.close()
        if self.launch.alive():
            try:
                self.stage.run(Stop())
                self.stage.outbox.flush()
            except RuntimeError:
                pass
        self.launch.stop()

    def _log_layout(self, seconds: float) -> None:
        rank = self.rank
        logger.info("%d ranks (TP %d × PP %d), %s, %d CPU threads per rank; started in %.2f s",
                    rank.world_size, rank.tp, rank.pp,
                    "under torchrun" if under_torchrun() else "Ray actors" if self.config_backend == "ray" else
                    "spawned by llmctl", self.threads, seconds)
        for index, (weights, kv) in enumerate(self.rank_memory):
            logger.info("rank %d (stage %d, TP rank %d): weights %.3f GiB, KV cache %.3f GiB", index,
                        index // rank.tp, index % rank.tp, weights / GiB, kv / GiB)


def start_ranks(config: EngineConfig, driver: Rank, threads: int) -> Launch:
    """The other ranks: Ray actors with `--distributed-executor-backend ray`, else torchrun's or spawned ones."""
    if config.distributed_executor_backend == "ray" and not under_torchrun():
        from llmctl.engine.executor.ray_launch import spawn_ray_workers

        return spawn_ray_workers(config, driver, threads)  # type: ignore[return-value]  (the same interface)
    return spawn_workers(config, driver, threads)


def create_executor(config: EngineConfig) -> Executor:
    executor = _ranks_executor(config)
    if not config.async_scheduling or config.speculative_config:
        return executor  # speculative decoding proposes from each step's tokens: every step waits for them
    from llmctl.engine.executor.overlap import OverlappedExecutor

    return OverlappedExecutor(executor)


def _ranks_executor(config: EngineConfig) -> Executor:
    if config.tensor_parallel_size * config.pipeline_parallel_size == 1 and not under_torchrun():
        return LocalExecutor(config)
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.executor.layout import check_layout

    spec = load_spec(resolve_model(config.model, config.revision, weights=False))
    check_layout(spec, config, config.device)
    return ParallelExecutor(config)

