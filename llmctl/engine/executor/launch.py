"""Starting the ranks: llmctl spawns them on one machine, or torchrun starts one process per
rank on each machine and every process finds its place from RANK / WORLD_SIZE / MASTER_ADDR.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import os
import signal
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from llmctl.engine.config import EngineConfig
from llmctl.engine.distributed.group import Rank
from llmctl.engine.worker.threads import use_threads
from llmctl.errors import LlmctlError, debug_enabled

logger = logging.getLogger("llmctl.engine")
STARTUP_TIMEOUT = 600.0  # loading a big checkpoint shard can take minutes
BOOTSTRAP_TIMEOUT = 120.0  # a spawned process imports torch and llmctl, then marks the store
MAIN_GUARD_ADVICE = ("a process spawned for TP/PP re-runs your script's top level: put the code that builds the "
                     "LLM under `if __name__ == \"__main__\":` (as with vLLM and any spawned multiprocessing)")


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ
                                                   and "MASTER_ADDR" in os.environ)


def torchrun_rank(tp: int, pp: int) -> Rank:
    world = int(os.environ["WORLD_SIZE"])
    if world != tp * pp:
        from llmctl.engine.errors import EngineConfigError

        raise EngineConfigError(f"torchrun started {world} processes; --tp {tp} × --pp {pp} needs {tp * pp}: "
                                f"use --nnodes × --nproc-per-node = {tp * pp}")
    return Rank(int(os.environ["RANK"]), tp, pp)


@dataclass
class Launch:
    """The store every rank meets at, and the worker processes llmctl started itself."""

    store: dist.Store
    host: str
    port: int
    processes: list[multiprocessing.process.BaseProcess] = field(default_factory=list)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def dead(self) -> list[str]:
        return [p.name for p in self.processes if not p.is_alive()]

    def wait_until_started(self, timeout: float = BOOTSTRAP_TIMEOUT) -> None:
        """Every spawned worker marks the store once it runs llmctl's code; one that exits before failed to
        start (most often a script without a main guard), and the driver, which would otherwise wait for it
        in the ranks' rendezvous for STARTUP_TIMEOUT, says so at once."""
        deadline = time.monotonic() + timeout
        waiting = dict(enumerate(self.processes, start=1))
        while waiting:
            for index, process in list(waiting.items()):
                if self.store.check([f"started/{index}"]):
                    del waiting[index]
                elif not process.is_alive():
                    self.stop(timeout=1)
                    raise LlmctlError(f"{process.name} exited (code {process.exitcode}) before it started: "
                                      f"{MAIN_GUARD_ADVICE}; its own error is printed above")
            if waiting and time.monotonic() > deadline:
                self.stop(timeout=1)
                raise LlmctlError(f"{', '.join(p.name for p in waiting.values())} did not start within "
                                  f"{timeout:.0f} s")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        for process in self.processes:
            process.join(timeout)
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(2)


def open_store(rank: Rank) -> tuple[dist.Store, str, int]:
    """torchrun's store (or MASTER_ADDR:MASTER_PORT's), or a new one on a free local port."""
    timeout = datetime.timedelta(seconds=STARTUP_TIMEOUT)
    if under_torchrun():
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        is_master = rank.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        store = dist.TCPStore(host, port, rank.world_size if is_master else None, is_master, timeout=timeout,
                              wait_for_workers=False)
        return dist.PrefixStore("llmctl/", store), host, port
    store = dist.TCPStore("127.0.0.1", 0, rank.world_size, True, timeout=timeout, wait_for_workers=False)
    return store, "127.0.0.1", store.port


def spawn_workers(config: EngineConfig, driver: Rank, threads: int) -> Launch:
    """The other ranks: torchrun's own processes, or processes spawned here (`--distributed-executor-backend
    mp`, the default; Ray's actors are llmctl.engine.executor.ray_launch's)."""
    store, host, port = open_store(driver)
    launch = Launch(store, host, port)
    if under_torchrun():
        return launch
    context = multiprocessing.get_context("spawn")
    for index in range(1, driver.world_size):
        process = context.Process(target=worker_main, name=f"llmctl-rank{index}", daemon=True,
                                  args=(config, Rank(index, driver.tp, driver.pp), host, port, threads))
        process.start()
        launch.processes.append(process)
    return launch


def die_with_parent() -> None:
    """The worker exits when the process that started it is gone (no orphans). A watcher thread,
    not prctl(PR_SET_PDEATHSIG): that fires when the parent *thread* ends, and the server
    starts its engine on a loader thread that ends once the model is up."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="llmctl-parent-watch", daemon=True).start()


def worker_main(config: EngineConfig, rank: Rank, host: str, port: int, threads: int) -> None:
    """Entry point of a spawned rank (also of a non-zero torchrun rank, through run_worker)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the driver, which stops us in order
    torch.set_num_threads(threads)
    store = dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT))
    store.set(f"started/{rank.rank}", "1")
    run_worker(config, rank, store)


def run_worker(config: EngineConfig, rank: Rank, store: dist.Store) -> None:
    from llmctl.engine.executor.stage import build_stage

    try:
        stage = build_stage(config, rank, store)
    except Exception as exc:  # the driver reports it: one line, the same a single process would print
        report_startup_error(store, rank.rank, exc)
        raise SystemExit(1) from None
    stage.serve_forever()


def report_startup_error(store: dist.Store, rank: int, exc: Exception) -> None:
    """What went wrong, for the driver: a user error as its one line; a bug marked as one, with its
    traceback under LLMCTL_DEBUG."""
    if isinstance(exc, LlmctlError):
        store.set(f"error/{rank}", f"rank {rank}: {exc}")
        return
    message = f"rank {rank}: {type(exc).__name__}: {exc}"
    if debug_enabled():
        message += "\n" + "".join(traceback.format_exception(exc))
    store.set(f"error/{rank}", message)
    store.set(f"internal/{rank}", "1")


def run_torchrun_worker_if_not_driver(config: EngineConfig) -> bool:
    """Under torchrun every process runs `llmctl serve …`: rank 0 goes on as the driver and API
    server; the other ranks become workers here and return True when the driver stops them."""
    if under_torchrun() and config.distributed_executor_backend == "ray":
        from llmctl.engine.errors import EngineConfigError

        raise EngineConfigError("--distributed-executor-backend ray under torchrun: torchrun already started the "
                                "ranks; drop one of the two (Ray: run `llmctl serve` once, on a node of the cluster)")
    if under_torchrun() and config.data_parallel_size > 1:
        from llmctl.engine.errors import EngineConfigError

        raise EngineConfigError(
            f"--dp {config.data_parallel_size} under torchrun: torchrun's processes form one TP × PP engine. For "
            "replicas across machines use a Ray cluster: `ray start` on each machine, then one `llmctl serve … --dp "
            f"{config.data_parallel_size} --data-parallel-backend ray` (docs/parallel.md), or run one `llmctl serve` "
            "per machine behind a load balancer")
    if not under_torchrun() or int(os.environ.get("RANK", "0")) == 0:
        return False
    rank = torchrun_rank(config.tensor_parallel_size, config.pipeline_parallel_size)
    use_threads(config)
    store, _, _ = open_store(rank)
    run_worker(config, rank, store)
    return True
