"""Soak: a real `llmctl serve` driven by `llmctl bench serve` at about twice its capacity.

1. start `llmctl serve` with a queue limit (--max-queue-len), so overload is refused with 503;
2. measure capacity: requests/s at the server's concurrency (--max-num-seqs), which also warms it up;
3. send `--minutes` of Poisson arrivals at `--overload` × that rate;
4. wait for the server to drain and report: requests sent, completed, refused with 503, failed
   (anything else: must be 0), the server's RSS after warm-up and at the end (growth must stay
   within --rss-growth), and KV blocks free at the end (must be the whole pool).

    python benchmarks/soak.py                 # 10 minutes
    python benchmarks/soak.py --minutes 1     # a short run

Exit status 1 when a check fails, so CI can run the short mode.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Server:
    process: subprocess.Popen
    url: str

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return values

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS for the server process")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace, log: Path) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "llmctl", "serve", *([args.model] if args.model else []), "--port", str(port),
               "--max-model-len", "512", "--max-num-seqs", str(args.max_num_seqs),
               "--max-queue-len", str(args.max_queue_len), "--disable-log-requests"]
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}")
    deadline = time.time() + 300
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llmctl serve exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit("llmctl serve did not become healthy in 300 s")


def bench(server: Server, args: argparse.Namespace, out: Path, *, prompts: int, rate: str,
          concurrency: str = "none") -> dict:
    command = [sys.executable, "-m", "llmctl", "bench", "serve", "--base-url", server.url,
               "--num-prompts", str(prompts),
               "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
               "--request-rate", rate, "--max-concurrency", concurrency, "--ignore-eos", "--save-result",
               "--result-filename", str(out), "--seed", str(int(time.time()))]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"llmctl bench serve failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(out.read_text())


def drain(server: Server, timeout: float = 120) -> dict[str, float]:
    deadline = time.time() + timeout
    while True:
        values = server.metrics()
        busy = values.get("llmctl:num_requests_running", 0) + values.get("llmctl:num_requests_waiting", 0)
        if not busy or time.time() > deadline:
            return values
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: llmctl's default model")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--overload", type=float, default=2.0, help="arrival rate as a multiple of capacity")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-queue-len", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rss-growth", type=float, default=0.05, help="allowed RSS growth, as a fraction")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="llmctl-soak-"))
    server = start_server(args, work / "server.log")
    try:
        capacity = bench(server, args, work / "capacity.json", prompts=4 * args.max_num_seqs, rate="inf",
                         concurrency=str(args.max_num_seqs))["request_throughput"]
        drain(server)
        rss_start = server.rss_bytes()
        rate = args.overload * capacity
        prompts = max(1, round(rate * args.minutes * 60))
        print(f"capacity {capacity:.2f} req/s; soaking at {rate:.2f} req/s for {args.minutes:g} min "
              f"({prompts} requests)", flush=True)
        started = time.perf_counter()
        soak = bench(server, args, work / "soak.json", prompts=prompts, rate=f"{rate:.4f}")
        seconds = time.perf_counter() - started
        final = drain(server)
        rss_end = server.rss_bytes()
        refused = sum(1 for e in soak["errors"] if e.startswith("HTTP 503"))
        failed = sum(1 for e in soak["errors"] if e and not e.startswith("HTTP 503"))
        usage = final.get("llmctl:kv_cache_usage_perc", -1.0)
        growth = rss_end / rss_start - 1
        rows = [
            ("duration", f"{seconds:.0f} s"),
            ("requests sent", str(prompts)),
            ("completed", str(soak["completed"])),
            ("refused with 503 (queue limit)", str(refused)),
            ("failed (must be 0)", str(failed)),
            ("output tokens/s", f"{soak['output_throughput']:.1f}"),
            ("RSS after warm-up", f"{rss_start / 2**20:.0f} MiB"),
            ("RSS at the end", f"{rss_end / 2**20:.0f} MiB ({100 * growth:+.1f} %)"),
            ("KV cache in use at the end", f"{100 * usage:.1f} % (0: every block is free)"),
        ]
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
        problems = []
        if failed:
            problems.append(f"{failed} requests failed: {sorted({e for e in soak['errors'] if e})[:3]}")
        if soak["completed"] + refused != prompts:
            problems.append("some requests were neither completed nor refused")
        if growth > args.rss_growth:
            problems.append(f"RSS grew by {100 * growth:.1f} %")
        if usage != 0.0:
            problems.append("KV blocks are still held after the server drained")
        for problem in problems:
            print("FAIL:", problem)
        return 1 if problems else 0
    finally:
        server.process.terminate()
        server.process.wait(timeout=60)
        print(f"server log and results: {work}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
