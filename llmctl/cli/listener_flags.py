"""Where `llmctl serve` listens, as one group of vLLM's flags (host, port, Unix socket, TLS, root path) that
the command receives built into a Listener."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from llmctl.cli.flags import F, Flag, FlagGroup, with_flags
from llmctl.server.listener import Listener

LISTENER_FLAGS: dict[str, Flag] = {  # Listener field -> its flag, in --help order
    "host": Flag(("--host",), str, "address to listen on (0.0.0.0: all interfaces)"),
    "port": Flag(("--port",), int, "port to listen on"),
    "uds": Flag(("--uds",), Optional[str], "listen on this Unix socket instead of --host/--port"),
    "ssl_keyfile": Flag(("--ssl-keyfile",), Optional[str], "TLS: the server's private key (PEM)"),
    "ssl_certfile": Flag(("--ssl-certfile",), Optional[str], "TLS: the server's certificate chain (PEM); serves https"),
    "ssl_ca_certs": Flag(("--ssl-ca-certs",), Optional[str],
                         "TLS: CA certificates that client certificates are checked against"),
    "ssl_cert_reqs": Flag(("--ssl-cert-reqs",), int,
                          "client certificates: 0 none, 1 optional, 2 required (Python's ssl.CERT_*)"),
    "root_path": Flag(("--root-path",), str, "the path prefix a reverse proxy strips before forwarding, e.g. /llm "
                                             "(for /docs and /openapi.json links)"),
}


def _listener(values: dict[str, Any]) -> Listener:
    return Listener(**values)


LISTENER_GROUP = FlagGroup("listener", LISTENER_FLAGS, Listener, _listener)


def with_listener_flags() -> Callable[[F], F]:
    """Add the listener flags to a command with a `listener: Listener` parameter."""
    return with_flags(LISTENER_GROUP)
