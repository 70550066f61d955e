"""Where `llmctl serve` listens (vLLM's flags): TLS with a self-signed certificate made here by openssl,
client certificates required (--ssl-cert-reqs 2), --root-path behind a path-stripping proxy, and a Unix
socket (--uds) — each through the official openai client over a real uvicorn server — and the one-line
errors for files that cannot work."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from helpers.cli_process import run_cli
from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the openssl command line."""
    cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    assert shutil.which("openssl"), "openssl is part of this project's machines (Debian's openssl package)"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def _status(client: httpx.Client, url: str) -> int:
    """/health's status, 0 while the server cannot answer: a short timeout, as a probe that connects while the
    server is still starting would otherwise wait out the client's whole timeout."""
    try:
        return client.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_tls_with_client_certificates_and_a_root_path(tmp_path):
    cert, key = self_signed(tmp_path, "server")
    client_cert, client_key = self_signed(tmp_path, "client")  # self-signed: its own CA
    trusting = ssl.create_default_context(cafile=str(cert))  # trusts the server's certificate, shows none
    showing = ssl.create_default_context(cafile=str(cert))
    showing.load_cert_chain(str(client_cert), str(client_key))
    with_client = httpx.Client(verify=showing, timeout=60)
    server = start_server("--max-model-len", "512", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
                          "--ssl-ca-certs", str(client_cert), "--ssl-cert-reqs", "2", "--root-path", "/llm",
                          health=lambda s: _status(with_client, f"https://127.0.0.1:{s.port}/health"))
    try:
        base = f"https://127.0.0.1:{server.port}"
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", http_client=with_client)
        reply = client.completions.create(model=client.models.list().data[0].id, prompt="The capital of France is",
                                          max_tokens=4, temperature=0)
        assert reply.choices[0].text and reply.usage.completion_tokens == 4
        # a proxy strips /llm before forwarding; the links the server writes carry it back
        assert json.loads(with_client.get(base + "/openapi.json").text)["servers"] == [{"url": "/llm"}]
        assert 'href="/llm/openapi.json"' in with_client.get(base + "/docs").text
        with pytest.raises(httpx.HTTPError):  # no client certificate: the handshake fails
            httpx.get(base + "/health", verify=trusting, timeout=30)
        with pytest.raises(httpx.HTTPError):  # plain http on the TLS port gets no HTTP answer
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=30)
    finally:
        with_client.close()  # its keep-alive connection would hold the graceful shutdown open
        assert server.stop() == 0
    assert f"on https://127.0.0.1:{server.port}/llm (OpenAI API under /v1)" in server.log


def test_unix_socket(tmp_path):
    socket_path = tmp_path / "llmctl.sock"
    over_socket = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), timeout=60)
    server = start_server("--max-model-len", "512", "--uds", str(socket_path),
                          health=lambda s: _status(over_socket, "http://localhost/health"))
    try:
        client = openai.OpenAI(base_url="http://localhost/v1", api_key="none", http_client=over_socket)
        reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=3, temperature=0,
                                               messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens == 3
    finally:
        assert server.stop() == 0
    assert f"on unix:{socket_path} (OpenAI API" in server.log


@pytest.mark.parametrize("fields,message", [
    (dict(ssl_certfile="CERT"), "TLS needs both --ssl-certfile"),
    (dict(ssl_certfile="CERT", ssl_keyfile="MISSING"), "--ssl-keyfile MISSING: no such file"),
    (dict(ssl_certfile="CERT", ssl_keyfile="CERT"), "the key belonging to the certificate"),
    (dict(ssl_certfile="CERT", ssl_keyfile="KEY", ssl_cert_reqs=2), "give --ssl-ca-certs"),
    (dict(ssl_cert_reqs=3), "0 (no client certificate), 1 (optional) or 2"),
    (dict(ssl_ca_certs="CERT"), "give --ssl-certfile and --ssl-keyfile too"),
    (dict(root_path="llm/"), "--root-path 'llm/'"),
    (dict(uds="CERT"), "is a file, not a socket"),
    (dict(uds="NOFOLDER/x.sock"), "does not exist"),
])
def test_listener_mistakes_are_refused_with_the_fix(tmp_path, fields, message):
    from llmctl.errors import LlmctlError
    from llmctl.server.listener import Listener

    cert, key = self_signed(tmp_path, "server")
    paths = {"CERT": str(cert), "KEY": str(key), "NOFOLDER/x.sock": str(tmp_path / "no/x.sock")}
    with pytest.raises(LlmctlError, match=re.escape(message)):
        Listener(**{name: paths.get(value, value) for name, value in fields.items()}).validate()


def test_a_listener_mistake_is_a_one_line_error_before_loading(tmp_path):
    cert, _ = self_signed(tmp_path, "server")
    done = run_cli("serve", "--ssl-certfile", str(cert), "--ssl-keyfile", str(cert), timeout=120)
    assert done.returncode == 2 and "the key belonging to the certificate" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "loading" not in done.stderr.lower()


def test_ssl_cert_reqs_are_pythons_values():
    from llmctl.server.listener import CERT_REQS

    assert CERT_REQS == {ssl.CERT_NONE: "none", ssl.CERT_OPTIONAL: "optional", ssl.CERT_REQUIRED: "required"}
