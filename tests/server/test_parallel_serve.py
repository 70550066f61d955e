"""`llmctl serve --tp/--pp/--dp` as users run it: real processes, the openai client, lost ranks,
orphan-free shutdown, torchrun on two "nodes" of this machine, and plan's commands parse."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.server_helpers import free_port, start_server, terminate_all
from helpers.waiting import wait_until

pytestmark = pytest.mark.subprocess

PROMPT = "The capital of France is"


def child_pids(pid: int) -> set[int]:
    """Every descendant of pid, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def complete(url: str, max_tokens: int = 8) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    response = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT,
                                         max_tokens=max_tokens, temperature=0, logprobs=1)
    return response.choices[0].logprobs.tokens


@pytest.fixture(scope="module")
def single_tokens():
    server = start_server("--max-model-len", "256", "--disable-log-stats")
    try:
        return complete(server.url)
    finally:
        server.stop()


def test_smollm2_at_tp3_through_serve_and_the_openai_client(single_tokens):
    server = start_server("--tp", "3", "--max-model-len", "256", "--disable-log-stats", timeout=240)
    try:
        assert complete(server.url) == single_tokens
        workers = child_pids(server.process.pid)
        assert len([p for p in workers if alive(p)]) >= 2
    finally:
        assert server.stop() == 0
    wait_until(lambda: not [p for p in workers if alive(p)], "the worker ranks to exit with the server", timeout=30)


def test_pp2_and_dp2_through_serve(single_tokens):
    server = start_server("--pp", "2", "--max-model-len", "256", "--disable-log-stats", timeout=240)
    try:
        assert complete(server.url) == single_tokens
    finally:
        assert server.stop() == 0
    # --dp 2 (--data-parallel-backend mp, vLLM's default): a process per replica, gone with the server
    server = start_server("--dp", "2", "--max-model-len", "256", "--disable-log-stats", timeout=240)
    try:
        assert complete(server.url) == single_tokens
        assert 'engine="1"' in server.get("/metrics")[1]
        replicas = [pid for pid in child_pids(server.process.pid) if alive(pid) and is_spawned(pid)]
        assert len(replicas) == 2
    finally:
        assert server.stop() == 0
    wait_until(lambda: not [p for p in replicas if alive(p)], "the replica processes to exit with the server", timeout=30)


def test_a_killed_replica_process_makes_the_server_unhealthy():
    server = start_server("--dp", "2", "--max-model-len", "256", "--disable-log-stats", timeout=240)
    try:
        replicas = [pid for pid in child_pids(server.process.pid) if alive(pid) and is_spawned(pid)]
        os.kill(replicas[0], signal.SIGKILL)  # idle: no call of the server's finds it, its liveness does
        wait_until(lambda: server.get("/health")[0] == 503, "/health to say a replica is lost", timeout=30)
        assert server.process.wait(timeout=30) != 0  # the server stops itself, as for a lost worker rank
        wait_until(lambda: not alive(replicas[1]), "the other replica to exit with the server", timeout=30)
    finally:
        server.stop()


def is_spawned(pid: int) -> bool:
    """A process started by multiprocessing's spawn (a replica; not its resource tracker)."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return b"spawn_main" in handle.read()


def test_a_killed_worker_fails_requests_and_stops_the_server():
    import httpx2 as httpx

    server = start_server("--pp", "2", "--max-model-len", "512", "--disable-log-stats", timeout=240)
    try:
        workers = [p for p in child_pids(server.process.pid) if alive(p)]
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json={
                    "model": client.get("/v1/models").json()["data"][0]["id"], "prompt": PROMPT,
                    "max_tokens": 400, "ignore_eos": True, "stream": True}) as stream:
                lines = stream.iter_lines()
                next(line for line in lines if line.startswith("data:"))
                for pid in workers:
                    os.kill(pid, signal.SIGKILL)
                started = time.monotonic()
                rest = [line for line in lines if line.startswith("data:")]
            assert time.monotonic() - started < 30
            assert any('"error"' in line for line in rest)
            # The server stops at least a second after the loss; until then /health says so.
            assert client.get("/health").status_code == 503
        code = server.process.wait(timeout=30)
        assert code != 0
    finally:
        server.stop()


def test_two_torchrun_nodes_give_the_same_tokens(single_tokens, tmp_path):
    port, http = free_port(), free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(port)]
    serve = ["-m", "llmctl", "serve", "--pp", "2", "--max-model-len", "256", "--port", str(http),
             "--disable-log-stats"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    logs = [tmp_path / f"node{i}.log" for i in range(2)]  # files, not pipes: nothing blocks on a full buffer
    nodes = [subprocess.Popen(torchrun + ["--node-rank", str(i)] + serve, env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT, text=True) for i, log in enumerate(logs)]
    try:
        from helpers.server_helpers import Server

        server = Server(nodes[0], http)
        deadline = time.time() + 240
        while time.time() < deadline:
            try:
                if server.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            assert all(n.poll() is None for n in nodes), "\n".join(log.read_text() for log in logs)
            time.sleep(0.5)
        assert complete(server.url) == single_tokens
    finally:
        terminate_all(nodes)


def test_dp_under_torchrun_is_refused_with_the_ways_that_work(monkeypatch):
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.errors import EngineConfigError
    from llmctl.engine.executor.launch import run_torchrun_worker_if_not_driver

    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(EngineConfigError, match="one `llmctl serve` per machine") as refused:
        run_torchrun_worker_if_not_driver(EngineConfig(data_parallel_size=2, pipeline_parallel_size=2))
    assert "--dp 2 --data-parallel-backend ray" in str(refused.value)  # the Ray form, as the way across machines
    with pytest.raises(EngineConfigError, match="torchrun already started the ranks"):
        run_torchrun_worker_if_not_driver(EngineConfig(pipeline_parallel_size=2, distributed_executor_backend="ray"))


def test_every_serve_command_plan_prints_parses():
    """plan's llmctl commands for the models the seeds profile go through serve's own argument parser."""
    import typer

    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.cli import app
    from llmctl.plan.gpus import lookup_gpu
    from llmctl.plan.planner import PlanRequest, build_plan

    command = typer.main.get_command(app).commands["serve"]
    for model, gpus, extra in (("bigscience/bloom", 8, {}), ("Qwen/Qwen-72B", 8, {}),
                               ("bigscience/bloom", 16, {"nodes": 2}), ("Qwen/Qwen-72B", 4, {"quantization": "awq"}),
                               ("Qwen/Qwen-72B", 4, {"kv_cache_dtype": "fp8"})):
        spec = load_spec(resolve_model(model, weights=False))
        plan = build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=gpus, **extra), model)
        lines = [c for c in plan.commands if c.startswith("llmctl serve")]
        assert lines, plan.notes
        for line in lines:
            with command.make_context("serve", line.split()[2:]) as context:
                assert context.params["tensor_parallel_size"] >= 1
                assert context.params["kv_cache_dtype"] == extra.get("kv_cache_dtype", "auto")
