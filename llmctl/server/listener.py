"""Where `llmctl serve` listens, under vLLM's flag names: a TCP host and port or a Unix socket (`--uds`),
TLS (`--ssl-keyfile`, `--ssl-certfile`, `--ssl-ca-certs`, `--ssl-cert-reqs`), and the path prefix a reverse
proxy strips before it forwards (`--root-path`). Checked before the model loads, so a wrong file is a
one-line error, not a server that dies after minutes of loading."""

from __future__ import annotations

import os
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import LlmctlError

CERT_REQS = {0: "none", 1: "optional", 2: "required"}  # ssl.CERT_NONE / CERT_OPTIONAL / CERT_REQUIRED


@dataclass(frozen=True)
class Listener:
    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    root_path: str = ""

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None

    def url(self) -> str:
        """Where clients reach the server, for the startup log."""
        if self.uds:
            return f"unix:{self.uds}" + (" (TLS)" if self.tls else "")
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}{self.root_path}"

    def validate(self) -> None:
        self._check_tls()
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise LlmctlError(f"--root-path {self.root_path!r}: give the prefix the proxy strips as /name "
                              "(a leading slash, none at the end)")
        if self.uds:
            _check_socket_path(Path(self.uds))

    def _check_tls(self) -> None:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise LlmctlError("TLS needs both --ssl-certfile (the certificate chain) and --ssl-keyfile (its key)")
        if self.ssl_cert_reqs not in CERT_REQS:
            raise LlmctlError(f"--ssl-cert-reqs {self.ssl_cert_reqs}: 0 (no client certificate), 1 (optional) or "
                              "2 (required), as Python's ssl.CERT_* values")
        if not self.tls:
            if self.ssl_ca_certs or self.ssl_cert_reqs:
                raise LlmctlError("--ssl-ca-certs and --ssl-cert-reqs check client certificates over TLS: give "
                                  "--ssl-certfile and --ssl-keyfile too")
            return
        if self.ssl_cert_reqs and not self.ssl_ca_certs:
            raise LlmctlError("--ssl-cert-reqs asks clients for certificates: give --ssl-ca-certs, the CA that "
                              "signs them")
        for flag, path in (("--ssl-certfile", self.ssl_certfile), ("--ssl-keyfile", self.ssl_keyfile),
                           ("--ssl-ca-certs", self.ssl_ca_certs)):
            if path is not None and not Path(path).is_file():
                raise LlmctlError(f"{flag} {path}: no such file")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        assert self.ssl_certfile is not None  # a context is made only for a certificate
        try:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            if self.ssl_ca_certs:
                context.load_verify_locations(self.ssl_ca_certs)
        except (ssl.SSLError, OSError) as exc:
            raise LlmctlError(f"--ssl-certfile {self.ssl_certfile} / --ssl-keyfile {self.ssl_keyfile}: {exc} "
                              "(PEM files, the key belonging to the certificate)") from None

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config's arguments for this listener."""
        where: dict[str, Any] = {"uds": self.uds} if self.uds else {"host": self.host, "port": self.port}
        return {**where, "root_path": self.root_path, "ssl_keyfile": self.ssl_keyfile,
                "ssl_certfile": self.ssl_certfile, "ssl_ca_certs": self.ssl_ca_certs,
                "ssl_cert_reqs": self.ssl_cert_reqs}


def _check_socket_path(path: Path) -> None:
    if not path.parent.is_dir():
        raise LlmctlError(f"--uds {path}: the folder {path.parent} does not exist")
    if path.exists() and not stat.S_ISSOCK(os.stat(path).st_mode):
        raise LlmctlError(f"--uds {path} is a file, not a socket: choose a free path (a stale socket is replaced)")
