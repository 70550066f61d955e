"""llmctl on Ray. TP × PP ranks as actors (`--distributed-executor-backend ray`): on a local cluster that llmctl
starts itself, and on a real two-node cluster (`ray start --head` in one network namespace, `ray start --address`
in another) where pipeline stage 1 must land on the second node, a client there gets transformers' greedy tokens,
losing that node turns /health to 503, and SIGTERM leaves no actor or placement group behind. Data-parallel
replicas as actors (`--data-parallel-backend ray`): one on each node, and the server serves on when one goes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import netns
from helpers.models import random_model
from helpers.multihost import CLIENT, HEALTH, PROMPT, transformers_text
from helpers.server_helpers import free_port, terminate_all

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")
METRICS = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=30).read().decode())
"""
LEFTOVERS = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
from ray._private import state

actors = [a for a in state.actors().values() if a["State"] != "DEAD"]
groups = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
print(json.dumps([len(actors), len(groups)]))
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    folder = random_model(config, tmp_path_factory.mktemp("ray") / "llama", tokenizer)
    return folder, transformers_text(folder, tokenizer)


def test_tp_ranks_as_actors_of_a_local_ray_cluster(llama, caplog):
    """No cluster running: llmctl starts a local one, and stops it with the engine."""
    import logging

    import ray

    from llmctl.engine.front.llm import LLM
    from llmctl.engine.sampling_params import SamplingParams

    folder, expected = llama
    with caplog.at_level(logging.INFO, logger="llmctl.engine"):
        llm = LLM(str(folder), tensor_parallel_size=2, distributed_executor_backend="ray", max_model_len=256,
                  cpu_threads=1, kv_cache_memory=64 << 20)
        try:
            out = llm.generate([PROMPT], SamplingParams(max_tokens=8, min_tokens=8, temperature=0))[0]
            assert out.outputs[0].text == expected
            assert llm.engine.executor.healthy()
        finally:
            llm.shutdown()
    assert "2 ranks (TP 2 × PP 1), Ray actors" in caplog.text
    assert not ray.is_initialized()  # the local cluster went with the engine


def test_a_wrong_backend_is_one_line():
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.errors import EngineConfigError
    from llmctl.engine.front.ray_replica import ray_replicas

    with pytest.raises(EngineConfigError, match="--distributed-executor-backend 'slurm' is not mp"):
        EngineConfig(distributed_executor_backend="slurm").validate()
    with pytest.raises(EngineConfigError, match="--data-parallel-backend 'k8s' is not mp"):
        EngineConfig(data_parallel_backend="k8s").validate()
    with pytest.raises(EngineConfigError, match="use --data-parallel-backend mp with it"):
        ray_replicas(EngineConfig(data_parallel_size=2, data_parallel_backend="ray", enable_expert_parallel=True))


def ray_node(host: netns.Host, *args: str, log: Path, own_session_dir: bool = False) -> None:
    """`ray start` on one "host". A second node gets its own /tmp/ray (a tmpfs in its mount namespace), as a
    second machine would: Ray nodes sharing one session directory mix up their sockets."""
    env = {"GLOO_SOCKET_IFNAME": host.interface, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    private = ["sh", "-c", 'mkdir -p /tmp/ray && mount -t tmpfs none /tmp/ray && exec "$@"', "sh"] \
        if own_session_dir else []
    done = subprocess.run(host.command(*private, RAY, "start", "--node-ip-address", host.address, "--num-cpus", "1",
                                       "--object-store-memory", str(100 << 20), "--disable-usage-stats", *args,
                                       env=env), capture_output=True, text=True, timeout=120)
    log.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def leftovers(head: netns.Host, address: str) -> list[int]:
    """[live actors, placement groups] on the cluster, once Ray has cleaned up after the ended job (≤ 30 s)."""
    deadline = time.time() + 30
    while True:
        done = subprocess.run(head.command(sys.executable, "-c", LEFTOVERS, address), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        counts = json.loads(done.stdout.strip().splitlines()[-1])
        if counts == [0, 0] or time.time() > deadline:
            return counts
        time.sleep(2)


@dataclass
class Cluster:
    head: netns.Host
    other: netns.Host
    address: str  # the head's GCS
    http: int  # the API server's port, on the head
    servers: list[subprocess.Popen]

    @property
    def url(self) -> str:
        return f"http://{self.head.address}:{self.http}"


@contextlib.contextmanager
def two_node_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """`ray start --head` in one namespace, `ray start --address` in the other; everything stopped after."""
    gcs = free_port()
    with netns.two_hosts() as (head, other):
        cluster = Cluster(head, other, f"{head.address}:{gcs}", free_port(), [])
        try:
            ray_node(head, "--head", "--port", str(gcs), "--include-dashboard", "false", log=tmp_path / "head.log")
            ray_node(other, "--address", cluster.address, log=tmp_path / "worker.log", own_session_dir=True)
            yield cluster
        finally:
            terminate_all(cluster.servers)
            for host in (head, other):
                subprocess.run(host.command(RAY, "stop", "--force"), capture_output=True, timeout=60)


def serve(cluster: Cluster, folder: Path, log: Path, *layout: str) -> tuple[subprocess.Popen, Path]:
    """`llmctl serve` on the head node, healthy (TP 1 × PP 2 with Ray actors unless `layout` says otherwise)."""
    head = cluster.head
    env = {"RAY_ADDRESS": cluster.address, "GLOO_SOCKET_IFNAME": head.interface, "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1"}
    layout = layout or ("--pp", "2", "--distributed-executor-backend", "ray")
    command = head.command(sys.executable, "-m", "llmctl", "serve", str(folder), *layout, "--max-model-len", "256",
                           "--kv-cache-memory", "64MiB", "--host", head.address, "--port", str(cluster.http),
                           "--disable-log-stats", env=env)
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    cluster.servers.append(server)
    deadline = time.time() + 300
    while health(head, cluster.url) != 0:
        assert server.poll() is None and time.time() < deadline, log.read_text()[-4000:]
        time.sleep(1)
    return server, log


def complete(client: netns.Host, url: str) -> str:
    """A greedy completion of PROMPT by the openai client, run on `client`'s node."""
    done = subprocess.run(client.command(sys.executable, "-c", CLIENT, url, PROMPT), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def lose_node(host: netns.Host) -> None:
    """The node goes away: every process in its network namespace is killed (`ray stop` would find the other
    node's processes too: they share this machine's process table)."""
    pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True).stdout.split()
    subprocess.run(["kill", "-9", *pids], capture_output=True)


def generated_by_replica(host: netns.Host, url: str) -> dict[str, int]:
    """`llmctl:generation_tokens_total` of each replica (vLLM's engine="i" label), read from /metrics on `host`."""
    done = subprocess.run(host.command(sys.executable, "-c", METRICS, url), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    counts = {}
    for line in done.stdout.splitlines():
        if line.startswith("llmctl:generation_tokens_total{") and 'engine="' in line:
            counts[line.split('engine="')[1].split('"')[0]] = int(float(line.rsplit(" ", 1)[-1]))
    return counts


def health(host: netns.Host, url: str) -> int:
    return subprocess.run(host.command(sys.executable, "-c", HEALTH, url), capture_output=True).returncode


@pytest.mark.network_namespace
@pytest.mark.skipif(netns.unavailable() is not None, reason=f"no network namespaces: {netns.unavailable()}")
def test_pipeline_stages_on_two_ray_nodes(llama, tmp_path):
    folder, expected = llama
    with two_node_cluster(tmp_path) as cluster:
        head, other, url = cluster.head, cluster.other, cluster.url
        server, log = serve(cluster, folder, tmp_path / "serve.log")
        text = log.read_text()
        assert "Ray cluster of 2 node(s)" in text and "2 ranks (TP 1 × PP 2), Ray actors" in text
        assert f"pipeline stage 0 on Ray node {head.address}" in text
        assert f"pipeline stage 1 on Ray node {other.address}" in text
        assert complete(other, url) == expected  # a client on the other node
        terminate_all([server])  # SIGTERM: a graceful stop, and nothing left on the cluster
        assert server.returncode == 0, log.read_text()[-3000:]
        assert "SIGTERM received" not in log.read_text()  # Ray's crash handler (it aborted CI's run) is kept out
        assert leftovers(head, cluster.address) == [0, 0]  # no actor, no placement group

        server, log = serve(cluster, folder, tmp_path / "serve2.log")
        lose_node(other)
        deadline = time.time() + 30
        while health(head, url) == 0 and time.time() < deadline:
            time.sleep(1)
        assert health(head, url) != 0, "the server still says healthy 30 s after losing stage 1's node"
        server.wait(60)  # as with spawned ranks: the server stops, saying why
        assert "a worker rank was lost" in log.read_text()


@pytest.mark.network_namespace
@pytest.mark.skipif(netns.unavailable() is not None, reason=f"no network namespaces: {netns.unavailable()}")
def test_data_parallel_replicas_on_two_ray_nodes_survive_one(llama, tmp_path):
    """--dp 2 --data-parallel-backend ray: one replica per node behind one API server; when the second node
    goes, the server stays healthy and the first replica serves on."""
    folder, expected = llama
    with two_node_cluster(tmp_path) as cluster:
        head, other, url = cluster.head, cluster.other, cluster.url
        server, log = serve(cluster, folder, tmp_path / "serve.log", "--dp", "2", "--data-parallel-backend", "ray",
                            "--cpu-threads", "1")
        text = log.read_text()
        nodes = {line.rsplit(" ", 1)[-1] for line in text.splitlines() if "data-parallel replica" in line}
        assert nodes == {head.address, other.address}, text[-3000:]  # one replica on each node
        for _ in range(2):
            assert complete(other, url) == expected
        # the least-loaded pick gives idle-time requests to the first replica (vLLM's balancer also starts ties
        # at one engine); Ray places it on either node, and either way the head's replica must serve on
        by_replica = generated_by_replica(head, url)
        assert by_replica["0"] > 0 and by_replica.get("1", 0) == 0, by_replica
        lose_node(other)
        # two requests at once: while the lost replica still counts as running, the least-loaded pick (and, when
        # it is replica 0, the tokenization) may go to it, and must come back from the head's replica once Ray
        # reports the actor lost (however long Ray's health checks take); once it is known lost, all go there
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda _: complete(head, url), range(2))) == [expected] * 2, log.read_text()[-3000:]
        for _ in range(2):
            assert health(head, url) == 0
            assert complete(head, url) == expected, log.read_text()[-3000:]
        after = generated_by_replica(head, url)  # /metrics answers, the lost replica's label and counts kept
        assert set(after) == {"0", "1"} and after["1"] == 0 and after["0"] > by_replica["0"], after
        terminate_all([server])
        assert server.returncode == 0, log.read_text()[-3000:]
