"""Local OpenTelemetry collectors for the tracing tests: OTLP over HTTP (protobuf bodies on POST /v1/traces) and
over gRPC (the TraceService), each decoding what arrives with opentelemetry-proto's own messages — the format's
reference, not llmctl's code — and keeping the spans."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from helpers.server_helpers import free_port


class Collector:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.service_names: set[str] = set()
        self._lock = threading.Lock()

    def keep(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                for attribute in resource_spans.resource.attributes:
                    if attribute.key == "service.name":
                        self.service_names.add(attribute.value.string_value)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)

    def wait_for(self, count: int, timeout: float = 30) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.spans)} spans arrived, {count} expected")


class HttpCollector(Collector):
    """OTLP/HTTP on 127.0.0.1: `endpoint` is the URL to give the exporter."""

    def __init__(self) -> None:
        super().__init__()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.keep(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()


class GrpcCollector(Collector, trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC on 127.0.0.1 (plain text: the exporter takes an http:// endpoint as insecure)."""

    def __init__(self) -> None:
        super().__init__()
        import grpc

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        self._server.start()

    def Export(self, request, context):  # noqa: N802 — the gRPC service's method
        self.keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def stop(self) -> None:
        self._server.stop(grace=None)


def attributes(span: Span) -> dict[str, object]:
    """A span's attributes as Python values."""
    values = {}
    for attribute in span.attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value"))
    return values
