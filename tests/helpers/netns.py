"""Two network "hosts" on this machine: network namespaces joined by a veth pair, each with its own address
(10.77.0.1, 10.77.0.2) and loopback, nothing routed out. Needs root and iproute2; `unavailable()` says why not."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str
    interface: str  # the veth end inside the namespace: what GLOO_SOCKET_IFNAME names

    def command(self, *args: str, env: dict[str, str] | None = None) -> list[str]:
        """args run inside this host's namespace (with env set there)."""
        settings = [f"{k}={v}" for k, v in (env or {}).items()]
        return ["ip", "netns", "exec", self.namespace, "env", *settings, *args]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def unavailable() -> str | None:
    """None where namespaces can be made here, else the reason (for the skip)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"llmctl-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"this machine refuses network namespaces: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@contextlib.contextmanager
def two_hosts() -> Iterator[list[Host]]:
    tag = f"l{os.getpid() % 100000}"
    hosts = [Host(f"{tag}-n{i}", f"10.77.0.{i + 1}", f"{tag}v{i}") for i in range(2)]
    try:
        for host in hosts:
            _ip("netns", "add", host.namespace)
        _ip("link", "add", hosts[0].interface, "type", "veth", "peer", "name", hosts[1].interface)
        for host in hosts:
            _ip("link", "set", host.interface, "netns", host.namespace)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
        yield hosts
    finally:
        for host in hosts:  # deleting a namespace deletes its veth end, and so the pair
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
