"""A small HTTP server on 127.0.0.1 that answers like the Hugging Face hub for a few repos.

It speaks the parts of the hub protocol huggingface_hub uses: repo info, HEAD/GET on
`resolve` URLs with X-Repo-Commit/ETag headers, Range requests (206), and X-Error-Code
headers for gated and missing repos. Every request is logged so tests can prove what was
(and was not) downloaded.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    failing: dict[str, int] = field(default_factory=dict)  # file name -> HTTP status answered for it


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo]
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, range)
    hosts: set[str] = field(default_factory=set)  # the Host headers seen: the hub's, or a proxied one

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def _answer(self, send_body: bool) -> None:
                # a proxied request names the whole URL (GET http://host/path): answer it as the hub would
                path = urlsplit(self.path).path if "://" in self.path else self.path.split("?")[0]
                hub.requests.append((self.command, path, self.headers.get("Range")))
                hub.hosts.add(self.headers.get("Host", ""))
                info = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
                tree = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
                resolve = re.match(r"^/(?:datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                route = info or tree or resolve
                repo_id = route.group(1) if route else None
                repo = hub.repos.get(repo_id) if repo_id else None
                if repo is None:
                    return self._error(404, "RepoNotFound", "Repository not found")
                if repo.gated:
                    return self._error(403, "GatedRepo", "Access to this repo is restricted")
                if info:
                    body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                                       "siblings": [{"rfilename": n} for n in sorted(repo.files)]}).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, send_body)
                if tree:
                    body = json.dumps([{"type": "file", "path": n, "size": len(d),
                                        "oid": hashlib.sha1(d).hexdigest()} for n, d in sorted(repo.files.items())])
                    return self._send(200, body.encode(), {"Content-Type": "application/json"}, send_body)
                filename = resolve.group(3)
                if filename in repo.failing:
                    return self._error(repo.failing[filename], "", "failing on purpose")
                if filename not in repo.files:
                    return self._error(404, "EntryNotFound", "Entry not found")
                self._send_file(repo, repo.files[filename], send_body)

            def _send_file(self, repo: FakeRepo, data: bytes, send_body: bool) -> None:
                headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                wanted = self.headers.get("Range")
                match = re.match(r"bytes=(\d+)-(\d*)", wanted or "")
                if match:
                    start = int(match.group(1))
                    end = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    return self._send(206, data[start:end + 1], headers, send_body)
                self._send(200, data, headers, send_body)

            def _error(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message,
                                          "Content-Type": "application/json"}, True)

            def _send(self, status: int, body: bytes, headers: dict[str, str], send_body: bool) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
