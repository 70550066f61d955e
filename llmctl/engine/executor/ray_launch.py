"""Ranks as Ray actors (`--distributed-executor-backend ray`, vLLM's flag).

Ray only places and supervises: rank 0 stays in the server process as the driver, every other rank
is an actor that joins the driver's store and runs the same stage loop a spawned process runs, with
the same torch.distributed collectives. Each pipeline stage is one placement group of TP bundles,
STRICT_PACK (a TP group never spans machines); stages may land on different nodes, and stage 0's
first bundle, the driver's, is pinned to the driver's node. `ray.init()` joins the cluster that
`ray start` made on this machine (or RAY_ADDRESS); with none, it starts a local one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from llmctl.engine.config import EngineConfig
from llmctl.engine.distributed.group import Rank
from llmctl.engine.errors import EngineConfigError

logger = logging.getLogger("llmctl.engine")
PLACEMENT_TIMEOUT = 60.0  # seconds to wait for the cluster to hold every bundle


def import_ray() -> Any:
    # Ray's C++ crash handler also takes SIGTERM in the driver: it calls the server's graceful-stop handler,
    # then aborts the process on the way out (exit -6 instead of 0). Read by Ray when it is first imported.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError:
        raise EngineConfigError("--distributed-executor-backend ray and --data-parallel-backend ray need Ray: pip "
                                "install 'llmctl[ray]' (or ray>=2.52) on every node, or use the default, mp") from None
    return ray


def connect(ray: Any) -> None:
    """Join the running cluster (RAY_ADDRESS, or the one `ray start` made on this machine), else start a
    local one; `ray.shutdown()` at the end leaves a joined cluster running and stops a local one."""
    if not ray.is_initialized():
        ray.init(log_to_driver=True, include_dashboard=False, configure_logging=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    logger.info("Ray cluster of %d node(s): %s", len(nodes), ", ".join(sorted(n["NodeManagerAddress"] for n in nodes)))


def driver_node_ip(ray: Any) -> str:
    """The address other nodes reach this process's node at (the node Ray registered, not 127.0.0.1)."""
    node_id = ray.get_runtime_context().get_node_id()
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)


def bundle(config: EngineConfig) -> dict[str, float]:
    """What one rank reserves: a GPU on CUDA (as vLLM), else one CPU."""
    from llmctl.engine.worker.loader import device_for

    return {"GPU": 1.0} if device_for(config.device, Rank(0)).type == "cuda" else {"CPU": 1.0}


@dataclass
class RayLaunch:
    """The store every rank meets at, the rank actors and their placement groups (one per stage)."""

    store: dist.Store
    host: str
    port: int
    ray: Any
    groups: list[Any] = field(default_factory=list)
    actors: list[Any] = field(default_factory=list)  # rank 1, 2, … in order
    loops: list[Any] = field(default_factory=list)  # each actor's running stage loop (an ObjectRef)

    def dead(self) -> list[str]:
        """Ranks whose loop ended (an actor that died, or a node that went away)."""
        if not self.loops:
            return []
        done, _ = self.ray.wait(self.loops, num_returns=len(self.loops), timeout=0)
        return [f"rank {self.loops.index(ref) + 1} (Ray actor)" for ref in done]

    def alive(self) -> bool:
        return not self.dead()

    def wait_until_started(self) -> None:
        """Ray reports an actor that fails to start when it is created (ray_launch.spawn_ray_workers)."""

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the loops to end (after Stop), kill what is left, and disconnect: the placement groups and
        actors belong to this job, so Ray removes them when it ends (removing a group one by one blocks
        while a node of it is gone)."""
        ray = self.ray
        if self.loops:
            ray.wait(self.loops, num_returns=len(self.loops), timeout=timeout)
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.loops, self.groups = [], [], []
        ray.shutdown()


def place_stages(ray: Any, driver: Rank, resources: dict[str, float], driver_ip: str) -> list[Any]:
    """One STRICT_PACK placement group per pipeline stage; stage 0's first bundle on the driver's node."""
    from ray.util.placement_group import placement_group

    groups = []
    for stage in range(driver.pp):
        bundles = [dict(resources) for _ in range(driver.tp)]
        if stage == 0:
            bundles[0][f"node:{driver_ip}"] = 0.001
        groups.append(placement_group(bundles, strategy="STRICT_PACK", name=f"llmctl-stage{stage}"))
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=PLACEMENT_TIMEOUT)
    if len(ready) < len(groups):
        from ray.util.placement_group import remove_placement_group

        for group in groups:
            remove_placement_group(group)
        raise EngineConfigError(
            f"the Ray cluster cannot place {driver.pp} stage(s) of {driver.tp} × {resources} on one node each "
            f"within {PLACEMENT_TIMEOUT:.0f} s (`ray status` shows what it has): add nodes or resources, or "
            "lower --tp / --pp")
    _log_placement(ray, groups)
    return groups


def _log_placement(ray: Any, groups: list[Any]) -> None:
    from ray.util.placement_group import placement_group_table

    addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    for stage, group in enumerate(groups):
        node = placement_group_table(group)["bundles_to_node_id"][0]
        logger.info("pipeline stage %d on Ray node %s", stage, addresses.get(node, node))


def spawn_ray_workers(config: EngineConfig, driver: Rank, threads: int) -> RayLaunch:
    """The driver's store on this node's address, and one actor per non-driver rank in its stage's group."""
    ray = import_ray()
    connect(ray)
    host = driver_node_ip(ray)
    store = dist.TCPStore(host, 0, driver.world_size, True, wait_for_workers=False,
                          timeout=_startup_timeout())
    launch = RayLaunch(store, host, store.port, ray)
    resources = bundle(config)
    launch.groups = place_stages(ray, driver, resources, host)
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor_class = ray.remote(RankActor)
    for index in range(1, driver.world_size):
        rank = Rank(index, driver.tp, driver.pp)
        strategy = PlacementGroupSchedulingStrategy(launch.groups[rank.pp_rank],
                                                    placement_group_bundle_index=rank.tp_rank)
        actor = actor_class.options(num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0),
                                    scheduling_strategy=strategy).remote()
        launch.actors.append(actor)
        launch.loops.append(actor.serve.remote(config, rank, host, store.port, threads))
    return launch


def _startup_timeout() -> Any:
    import datetime

    from llmctl.engine.executor.launch import STARTUP_TIMEOUT

    return datetime.timedelta(seconds=STARTUP_TIMEOUT)


class RankActor:
    """One rank in a Ray worker process: the loop a spawned rank runs, until the driver sends Stop."""

    def serve(self, config: EngineConfig, rank: Rank, host: str, port: int, threads: int) -> None:
        import torch

        from llmctl.engine.executor.launch import run_worker

        torch.set_num_threads(threads)
        store = dist.TCPStore(host, port, None, False, timeout=_startup_timeout())
        try:
            run_worker(config, rank, store)
        except SystemExit:  # the driver has the error from the store; the loop just ends
            pass
