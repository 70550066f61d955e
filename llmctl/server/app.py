"""The OpenAI-compatible API over the async engine (starlette; run by uvicorn in `llmctl serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import hmac
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from llmctl import __version__
from llmctl.engine.front.data_parallel import create_async_engine
from llmctl.engine.front.async_engine import AsyncLLMEngine, EngineDeadError
from llmctl.engine.config import EngineConfig
from llmctl.engine.front.llm_engine import LLMEngine, StepFailedError
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.sampling_params import InvalidRequestError
from llmctl.errors import LlmctlError
from llmctl.server.admission import AdmittedStream, InFlight
from llmctl.server.lora import AdapterLoadError, LoRAModulePath, ServedAdapters
from llmctl.server.metrics import ServerMetrics
from llmctl.server.openapi import openapi_schema
from llmctl.server.operability import RequestLog, StatsLogger, request_id_of
from llmctl.server.protocol import (
    APIError,
    Fields,
    bad,
    chat_messages,
    completion_prompts,
    prompt_list,
    sampling_request,
)
from llmctl.server.responses import (
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    echo_logprobs,
    usage,
)

logger = logging.getLogger("llmctl.server")


@dataclass
class ServerSettings:
    engine_config: EngineConfig
    served_model_names: list[str]
    api_key: str | None = None
    chat_template: str | None = None  # Jinja source; None: the model's own
    max_queue_len: int | None = None  # sequences beyond max_num_seqs that may wait
    max_request_bytes: int = 16 * 1024**2  # larger bodies get 413
    body_timeout: float = 30.0  # seconds a client may take to send its request body (408 after)
    metrics_auth: bool = False  # with api_key: /metrics needs the key too
    allowed_origins: list[str] = field(default_factory=list)  # CORS: off unless origins are given
    log_requests: bool = True  # one access-log line per request
    stats_interval: float | None = 10.0  # seconds between engine stats lines; None: off
    lora_modules: list[LoRAModulePath] = field(default_factory=list)  # adapters served from startup (--enable-lora)
    allow_runtime_lora_updating: bool = False  # /v1/load_lora_adapter and /v1/unload_lora_adapter


@dataclass
class ServerState:
    settings: ServerSettings
    engine: AsyncLLMEngine | None = None
    embedder: Any = None  # an EmbeddingModel when the served model is an encoder
    template: str | None = None  # the chat template, resolved once at startup
    adapters: ServedAdapters | None = None  # LoRA adapters by name
    load_error: str | None = None
    in_flight: InFlight | None = None
    metrics: ServerMetrics | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    # Engine ids stay unique when clients reuse an X-Request-Id: the response id is theirs, the engine's is ours.
    engine_ids: Iterator[int] = field(default_factory=itertools.count)

    @property
    def model_name(self) -> str:
        return self.settings.served_model_names[0]


async def _exit_when_ranks_are_lost(state: ServerState, stop: Any) -> None:
    """A lost worker rank cannot come back: once in-flight requests have their errors, stop the
    server with a failure so a supervisor restarts it (a single-process engine stays up, 503)."""
    from llmctl.engine.parallel.executor import WorkerLostError

    while True:
        await asyncio.sleep(0.5)
        engine = state.engine
        if engine is None or stop is None:
            continue
        lost = [r for r in engine.replicas if not r.engine.executor.healthy()
                or isinstance(r.dead_error, WorkerLostError)]
        if lost:
            reason = lost[0].dead_error or "a worker rank exited"
            logger.error("engine ranks lost (%s): failing in-flight requests and stopping", reason)
            await asyncio.sleep(1.0)  # let the error responses of in-flight requests go out
            stop(WorkerLostError(f"a worker rank was lost: {reason}"))
            return


def create_app(settings: ServerSettings, engine: LLMEngine | None = None,
               on_load_failure: Any = None) -> Starlette:
    """The app; the engine loads on a background thread (or is given), /health says when it is ready."""
    state = ServerState(settings, adapters=ServedAdapters(settings.served_model_names))
    state.in_flight = InFlight(settings.engine_config.max_num_seqs, settings.max_queue_len)
    state.metrics = ServerMetrics(lambda: [r.engine for r in state.engine.replicas] if state.engine else [],
                                  state.model_name)

    def load() -> None:
        try:
            if engine is None and load_embedder(state):
                return
            state.engine = AsyncLLMEngine(engine) if engine is not None else \
                create_async_engine(settings.engine_config)
            load_static_adapters(state)
            state.template = chat_template(state)
            if state.template is None:
                logger.warning("%s has no chat template: /v1/chat/completions will answer 400 until the server is "
                               "started with --chat-template (a file, or chatml / bloom)", state.model_name)
        except Exception as exc:  # reported by /health and the serve command
            state.load_error = str(exc)
            logger.error("engine failed to start: %s", exc)
            if on_load_failure is not None:
                on_load_failure(exc)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        threading.Thread(target=load, name="llmctl-load", daemon=True).start()
        stats = StatsLogger(lambda: state.engine.engine if state.engine else None, settings.stats_interval) \
            if settings.stats_interval else None
        if stats:
            stats.start()
        watcher = asyncio.create_task(_exit_when_ranks_are_lost(state, on_load_failure))
        yield
        watcher.cancel()
        if stats:
            stats.stop()
        if state.engine is not None:
            state.engine.shutdown()

    def api(handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            return await guarded(state, request, handler)
        return endpoint

    def plain(make: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            return make()
        return endpoint

    async def metrics_endpoint(request: Request) -> Response:
        if settings.metrics_auth:
            try:
                check_api_key(state, request, always=True)
            except APIError as exc:
                return error_response(exc)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    routes = [
        Route("/health", plain(lambda: health(state)), methods=["GET"]),
        Route("/version", plain(lambda: JSONResponse({"version": __version__})), methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/v1/models", api(models), methods=["GET"]),
        Route("/v1/completions", api(completions), methods=["POST"]),
        Route("/v1/chat/completions", api(chat_completions), methods=["POST"]),
        Route("/v1/embeddings", api(embeddings), methods=["POST"]),
        Route("/tokenize", api(tokenize), methods=["POST"]),
        Route("/detokenize", api(detokenize), methods=["POST"]),
        *([Route("/v1/load_lora_adapter", api(load_lora_adapter), methods=["POST"]),
           Route("/v1/unload_lora_adapter", api(unload_lora_adapter), methods=["POST"])]
          if settings.allow_runtime_lora_updating else []),
        Route("/openapi.json", plain(lambda: JSONResponse(openapi_schema(settings.allow_runtime_lora_updating))), methods=["GET"]),
        Route("/docs", plain(lambda: HTMLResponse(DOCS_PAGE)), methods=["GET"]),
    ]
    middleware = [Middleware(RequestLog, enabled=settings.log_requests)]
    if settings.allowed_origins:  # CORS only when asked for: browsers elsewhere cannot call the API by default
        middleware.append(Middleware(CORSMiddleware, allow_origins=settings.allowed_origins, allow_methods=["*"],
                                     allow_headers=["*"]))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware, exception_handlers={
        404: lambda r, e: error_response(APIError(f"no route {r.url.path}", 404)),
        405: lambda r, e: error_response(APIError(f"method {r.method} is not allowed on {r.url.path}", 405)),
    })
    app.state.llmctl = state
    return app


def load_static_adapters(state: ServerState) -> None:
    """--lora-modules: each is read and checked now; one that does not fit stops the server."""
    engines = [replica.engine for replica in state.engine.replicas]
    for module in state.settings.lora_modules:
        try:
            state.adapters.load(engines, module.name, module.path, module.base_model_name)
        except AdapterLoadError as exc:
            raise LlmctlError(f"--lora-modules {module.name}={module.path}: {exc}") from None


def load_embedder(state: ServerState) -> bool:
    """Serve an encoder (e.g. all-MiniLM-L6-v2) through /v1/embeddings; False for generation models."""
    from llmctl.engine.front.embedding import EmbeddingModel, is_embedding_model
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model

    config = state.settings.engine_config
    source = resolve_model(config.model, config.revision, weights=True, show_progress=False)
    spec = load_spec(source)
    if not is_embedding_model(spec):
        return False
    state.embedder = EmbeddingModel(source, spec, config.max_model_len,
                                    allow_pickle_weights=config.allow_pickle_weights)
    logger.info("embedding model %s (%s pooling%s), %d dimensions", source.name, state.embedder.pooling.mode,
                ", normalized" if state.embedder.pooling.normalize else "", spec.hidden_size)
    return True


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def health(state: ServerState) -> Response:
    if state.embedder is not None or (state.engine is not None and state.engine.is_running):
        return Response(status_code=200)
    reason = state.load_error or ("the engine stopped" if state.engine else "the model is loading")
    return JSONResponse({"status": reason}, status_code=503)


async def guarded(state: ServerState, request: Request, handler: Any) -> Response:
    """Auth, readiness, queue limit and error mapping around every API handler."""
    try:
        check_api_key(state, request)
        if state.embedder is not None:
            if handler not in (embeddings, models):
                raise bad(f"{state.model_name} is an embedding model: it answers /v1/embeddings only")
            return await handler(state, request)
        if state.engine is None or not state.engine.is_running:
            why = state.load_error or ("the engine stopped" if state.engine else "the model is still loading")
            raise APIError(f"not ready: {why}", 503, headers={"Retry-After": "5"})
        return await handler(state, request)
    except Exception as exc:
        return error_response(as_api_error(exc, f"{request.url.path} request_id={request_id_of(request.scope)}"))


def as_api_error(exc: Exception, where: str) -> APIError:
    """The OpenAI-shaped error for anything a handler or a stream raised, with the right status and type."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return bad(str(exc), exc.param)
    if isinstance(exc, AdapterLoadError):
        return APIError(str(exc), exc.status)
    if isinstance(exc, LlmctlError):  # e.g. an adapter that does not fit: what the user must change
        return bad(str(exc))
    if isinstance(exc, (EngineDeadError, StepFailedError)):  # 500 as vLLM answers; the engine logged the traceback
        return APIError(str(exc), 500, error_type="internal_server_error")
    logger.error("internal error on %s", where, exc_info=exc)  # a bug of ours: the log has the traceback
    return APIError(f"internal error: {type(exc).__name__}: {exc}", 500, error_type="internal_server_error")


def check_api_key(state: ServerState, request: Request, always: bool = False) -> None:
    key = state.settings.api_key
    if not key or not (always or request.url.path.startswith("/v1")):
        return
    header = request.headers.get("authorization", "")
    # Constant time: how long the comparison takes says nothing about how much of the key was right.
    if not hmac.compare_digest(header.encode(), f"Bearer {key}".encode()):
        raise APIError("invalid or missing API key: send 'Authorization: Bearer <key>'", 401,
                       code="invalid_api_key")


async def read_json(request: Request) -> Fields:
    settings = request.app.state.llmctl.settings
    try:
        raw = await asyncio.wait_for(read_body(request, settings.max_request_bytes), settings.body_timeout)
    except asyncio.TimeoutError:
        raise APIError(f"the request body did not arrive within {settings.body_timeout:g} s", 408) from None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad(f"the request body is not valid JSON: {exc}") from None
    return Fields(body)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(f"the request body is larger than {limit} bytes (--max-request-bytes)", 413)


def check_model(state: ServerState, fields: Fields) -> str:
    """The base model's name or an adapter's; anything else is 404, as for OpenAI's unknown models."""
    name = fields.str("model")
    if name is None:
        return state.model_name
    if name not in state.settings.served_model_names and state.adapters.get(name) is None:
        served = state.settings.served_model_names + list(state.adapters.by_name)
        raise APIError(f"the model '{name}' does not exist; this server serves {', '.join(served)}", 404,
                       param="model", code="model_not_found")
    return name


async def models(state: ServerState, request: Request) -> Response:
    if state.embedder is not None:
        root, max_len = str(state.embedder.source.path), state.embedder.max_model_len
    else:
        root, max_len = str(state.engine.engine.loaded.source.path), state.engine.engine.max_model_len
    data = [{"id": name, "object": "model", "created": state.created, "owned_by": "llmctl", "root": root,
             "parent": None, "max_model_len": max_len} for name in state.settings.served_model_names]
    return JSONResponse({"object": "list", "data": data + state.adapters.cards(state.created)})


async def load_lora_adapter(state: ServerState, request: Request) -> Response:
    """vLLM's runtime load: {"lora_name", "lora_path"}; answers plain text, as vLLM does."""
    fields = await read_json(request)
    name, path = fields.str("lora_name"), fields.str("lora_path")
    if not name or not path:
        raise bad("Both 'lora_name' and 'lora_path' must be provided.")
    engines = [replica.engine for replica in state.engine.replicas]
    await asyncio.to_thread(state.adapters.load, engines, name, path)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    name = fields.str("lora_name")
    if not name:
        raise bad("'lora_name' must be provided.")
    state.adapters.unload([replica.engine for replica in state.engine.replicas], name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


async def completions(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    prompts = completion_prompts(fields)
    sampling = sampling_request(fields, chat=False)
    if fields.raw("max_tokens") is None:
        sampling.params.max_tokens = 16  # OpenAI's default for completions
        sampling.params.min_tokens = min(sampling.params.min_tokens, 16)
    if sampling.echo and sampling.params.logprobs is not None:
        sampling.params.prompt_logprobs = sampling.params.logprobs
    engine = state.engine.engine
    prepared = [engine.tokenize(p) for p in prompts]
    return await run(state, request, model, prepared, sampling, chat=False)


async def chat_completions(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    messages = chat_messages(fields)
    sampling = sampling_request(fields, chat=True)
    template = state.template
    if template is None:
        raise bad("this model has no chat template: start the server with --chat-template FILE or a built-in name "
                  "(chatml, bloom), or use /v1/completions", "messages")
    tokenizer = state.engine.engine.tokenizer
    text = tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                         tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return await run(state, request, model, [(text, ids)], sampling, chat=True)


def chat_template(state: ServerState) -> str | None:
    """--chat-template, else the model's own, else llmctl's for its family (e.g. BLOOM)."""
    if state.settings.chat_template is not None:
        return state.settings.chat_template
    engine = state.engine.engine
    own = getattr(engine.tokenizer, "chat_template", None)
    if isinstance(own, str) and own:
        return own
    from llmctl.checkpoint.tokenizer import resolve_chat_template

    return resolve_chat_template(engine.loaded.source, engine.loaded.spec.model_type).text


async def run(state: ServerState, request: Request, model: str, prompts: list[tuple[str | None, list[int]]],
              sampling: Any, *, chat: bool) -> Response:
    admission = state.in_flight.admit(len(prompts) * sampling.params.n)
    request_id = ("chatcmpl-" if chat else "cmpl-") + request_id_of(request.scope)
    number = next(state.engine_ids)
    lora = state.adapters.get(model)
    if lora is not None:
        state.metrics.lora_requests.labels(state.model_name, model).inc()
    streams = [state.engine.generate(ids, sampling.params, f"{request_id}-{number}-{i}", lora)
               for i, (_, ids) in enumerate(prompts)]
    if sampling.stream:
        return AdmittedStream(admission, stream_events(state, request_id, model, prompts, streams, sampling, chat))
    try:
        return await collect(state, request, request_id, model, prompts, streams, sampling, chat)
    finally:
        admission.release()


async def collect(state: ServerState, request: Request, request_id: str, model: str, prompts: list, streams: list,
                  sampling: Any, chat: bool) -> Response:
    finals = await until_disconnect(request, asyncio.gather(*(last_output(state, s) for s in streams)))
    if finals is None:  # the client went away: the generators were cancelled and aborted
        return Response(status_code=499)
    body = (chat_response if chat else completion_response)(request_id, model, state.created, finals, sampling,
                                                           state.engine.engine.tokenizer, prompts)
    return JSONResponse(body)


async def last_output(state: ServerState, stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final, token_times = None, []
    async for output in stream:
        final = output
        token_times.append(time.perf_counter())
    record(state, final, token_times)
    return final


def record(state: ServerState, output: RequestOutput | None, token_times: list[float]) -> None:
    if output is None or output.metrics is None:
        return
    m = output.metrics
    state.metrics.observe_finished(m.ttft, token_times, m.e2e, [c.finish_reason or "abort" for c in output.outputs])


async def until_disconnect(request: Request, work: asyncio.Future) -> Any:
    """Await `work`, or cancel it (aborting its requests) when the client disconnects first."""
    work = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        watcher.cancel()
        return work.result()
    work.cancel()
    try:
        await work
    except (asyncio.CancelledError, Exception):
        pass
    return None


async def stream_events(state: ServerState, request_id: str, model: str, prompts: list, streams: list,
                        sampling: Any, chat: bool) -> AsyncIterator[str]:
    """SSE: one event per new text of any choice, then usage (when asked) and [DONE]."""
    n = sampling.params.n
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        token_times: list[float] = []
        final = None
        try:
            async for output in stream:
                token_times.append(time.perf_counter())
                final = output
                await queue.put((index, output))
        except Exception as exc:  # an engine error ends the stream with an error event
            await queue.put((index, exc))
        finally:
            record(state, final, token_times)
            await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    sent: dict[int, tuple[str, int]] = {}  # choice index -> (text sent, tokens sent)
    closed: set[int] = set()  # choices whose finish_reason was sent
    finished: dict[int, RequestOutput] = {}
    greeted = False  # chat: the role chunk was sent
    try:
        echoed: dict[int, int] = {}  # prompt index -> length of its echoed text (sent with its first output)
        remaining = len(streams)
        tokenizer = state.engine.engine.tokenizer
        while remaining:
            index, item = await queue.get()
            if chat and not greeted:  # the role chunk goes out with the first output, as vLLM sends it
                greeted = True
                for choice in range(n * len(streams)):
                    yield sse(chat_chunk(request_id, model, state.created, choice,
                                         {"role": "assistant", "content": ""}))
            if item is None:
                remaining -= 1
                continue
            if isinstance(item, Exception):
                yield sse(as_api_error(item, request_id).body())
                continue
            if sampling.echo and not chat and index not in echoed:
                chunks = echo_chunks(request_id, model, state.created, index, n, prompts[index][0], item, sampling,
                                     tokenizer)
                echoed[index] = len(chunks[0]["choices"][0]["text"])
                for chunk in chunks:
                    yield sse(chunk)
            if item.finished:
                finished[index] = item
            for completion in item.outputs:
                choice = index * n + completion.index
                if choice in closed:
                    continue
                text_sent, tokens_sent = sent.get(choice, ("", 0))
                delta = completion.text[len(text_sent):]
                if not delta and not completion.finish_reason and len(completion.token_ids) == tokens_sent:
                    continue
                logprobs = completion.logprobs[tokens_sent:] if completion.logprobs is not None else None
                if chat:
                    yield sse(chat_chunk(request_id, model, state.created, choice, {"content": delta} if delta else {},
                                         completion.finish_reason, completion.stop_reason, logprobs, tokenizer))
                else:
                    yield sse(completion_chunk(request_id, model, state.created, choice, delta,
                                               completion.finish_reason, completion.stop_reason, logprobs, tokenizer,
                                               echoed.get(index, 0) + len(text_sent)))
                sent[choice] = (completion.text, len(completion.token_ids))
                if completion.finish_reason:
                    closed.add(choice)
        if sampling.include_usage and finished:
            yield sse({"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                       "created": state.created, "model": model, "choices": [],
                       "usage": usage(list(finished.values()))})
        yield "data: [DONE]\n\n"
    finally:
        # A cancelled pump raises inside its engine stream, whose own cleanup aborts the request; nothing
        # here awaits, because a client that went away cancels this generator and every await in it.
        for task in tasks:
            task.cancel()


def echo_chunks(request_id: str, model: str, created: int, index: int, n: int, text: str | None,
                output: RequestOutput, sampling: Any, tokenizer: Any) -> list[dict]:
    """The prompt of each of a prompt's n choices, with its logprobs when asked, before any output."""
    text = text if text is not None else tokenizer.decode(output.prompt_token_ids)
    logprobs = echo_logprobs(output, [], tokenizer) if sampling.params.logprobs is not None else None
    chunks = []
    for j in range(n):
        chunk = completion_chunk(request_id, model, created, index * n + j, text, None, None)
        chunk["choices"][0]["logprobs"] = logprobs
        chunks.append(chunk)
    return chunks


# Characters JSON leaves raw but that many line readers (str.splitlines, httpx's iter_lines) take for line
# breaks, which would cut an event in two; escaped they are the same JSON.
_LINE_BREAKS_FOR_SOME = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}  # < 0x20: JSON escapes
_ESCAPE_LINE_BREAKS = str.maketrans(_LINE_BREAKS_FOR_SOME)


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False).translate(_ESCAPE_LINE_BREAKS)}\n\n"


async def embeddings(state: ServerState, request: Request) -> Response:
    if state.embedder is None:
        raise bad(f"{state.model_name} is a text-generation model and serves no embeddings: start llmctl serve with "
                  "an embedding model (e.g. all-MiniLM-L6-v2) for /v1/embeddings", "model")
    from llmctl.errors import LlmctlError

    fields = await read_json(request)
    model = check_model(state, fields)
    encoding = fields.str("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad(f"encoding_format must be float or base64, got {encoding!r}", "encoding_format")
    if fields.raw("dimensions") is not None:
        raise bad("dimensions is not supported: this model's embeddings have a fixed size", "dimensions")
    inputs = prompt_list(fields.raw("input"), "input")
    if any(item == "" for item in inputs):
        raise bad("input must not contain empty strings", "input")
    try:
        vectors, tokens = await asyncio.to_thread(state.embedder.embed, inputs)
    except LlmctlError as exc:
        raise bad(str(exc), "input") from None
    data = [{"object": "embedding", "index": i, "embedding": _encode_vector(v, encoding)} for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _encode_vector(vector: Any, encoding: str) -> Any:
    if encoding == "float":
        return vector.tolist()
    import base64

    return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")


async def tokenize(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    check_model(state, fields)
    engine = state.engine.engine
    if fields.raw("messages") is not None:
        template = state.template
        if template is None:
            raise bad("this model has no chat template; pass --chat-template", "messages")
        text = engine.tokenizer.apply_chat_template(chat_messages(fields), chat_template=template,
                                                    add_generation_prompt=fields.bool("add_generation_prompt", True),
                                                    tokenize=False)
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt = fields.str("prompt")
        if prompt is None:
            raise bad("prompt (a string) or messages is required", "prompt")
        ids = engine.tokenizer.encode(prompt, add_special_tokens=fields.bool("add_special_tokens", True))
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len})


async def detokenize(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    check_model(state, fields)
    tokens = fields.raw("tokens")
    vocab = state.engine.engine.loaded.spec.vocab_size
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad("tokens must be a list of integers", "tokens")
    if any(not 0 <= t < vocab for t in tokens):
        raise bad(f"token ids must be in [0, {vocab})", "tokens")
    return JSONResponse({"prompt": state.engine.engine.tokenizer.decode(tokens)})


DOCS_PAGE = """<!doctype html><html><head><title>llmctl API</title></head><body>
<h1>llmctl OpenAI-compatible API</h1>
<p>Endpoints: <code>GET /v1/models</code>, <code>POST /v1/completions</code>, <code>POST /v1/chat/completions</code>,
<code>POST /v1/embeddings</code>, <code>POST /tokenize</code>, <code>POST /detokenize</code>, <code>GET /health</code>,
<code>GET /metrics</code>, <code>GET /version</code>. Schema: <a href="/openapi.json">/openapi.json</a>.</p>
</body></html>"""
