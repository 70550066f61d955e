"""Several machines for real: two network namespaces joined by a veth pair stand for two hosts, each with its
own address; only that link and loopback carry traffic. torchrun starts two ranks on each "host" (TP 2 inside a
host, PP 2 across them, as `llmctl plan --nodes` recommends) serving a small random Llama, and a client on the
other host must get transformers' greedy tokens. Skips only where the machine refuses namespaces, with the
reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from helpers import netns
from helpers.multihost import CLIENT, HEALTH, PROMPT, transformers_text
from helpers.server_helpers import free_port, terminate_all

REASON = netns.unavailable()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}"), pytest.mark.subprocess, pytest.mark.network_namespace, pytest.mark.slow]


def wait_healthy(host: netns.Host, url: str, nodes: list[subprocess.Popen], logs: list, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert all(n.poll() is None for n in nodes), "\n".join(log.read_text()[-3000:] for log in logs)
        if subprocess.run(host.command(sys.executable, "-c", HEALTH, url), capture_output=True).returncode == 0:
            return
        time.sleep(1)
    raise AssertionError("the two-host server did not become healthy:\n" + "\n".join(log.read_text() for log in logs))


def test_torchrun_across_two_hosts_tp_inside_pp_across(tmp_path, tokenizer):
    from transformers import LlamaConfig

    from helpers.models import random_model

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    folder = random_model(config, tmp_path / "llama", tokenizer)
    expected = transformers_text(folder, tokenizer)
    master_port, http = free_port(), free_port()
    with netns.two_hosts() as hosts:
        url = f"http://{hosts[0].address}:{http}"
        logs = [tmp_path / f"host{i}.log" for i in range(2)]
        nodes = []
        for index, (host, log) in enumerate(zip(hosts, logs)):
            env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": host.interface}
            command = host.command(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                                   "--nproc-per-node", "2", "--node-rank", str(index), "--master-addr",
                                   hosts[0].address, "--master-port", str(master_port), "-m", "llmctl", "serve",
                                   str(folder), "--tp", "2", "--pp", "2", "--max-model-len", "256", "--host", hosts[0].address,
                                   "--port", str(http), "--disable-log-stats", env=env)
            nodes.append(subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                          env={**os.environ}))
        try:
            wait_healthy(hosts[0], url, nodes, logs, timeout=400)
            done = subprocess.run(hosts[1].command(sys.executable, "-c", CLIENT, url, PROMPT),
                                  capture_output=True, text=True, timeout=300)  # a client on the other host
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout) == expected
            assert "4 ranks (TP 2 × PP 2), under torchrun" in logs[0].read_text()
        finally:
            terminate_all(nodes)
