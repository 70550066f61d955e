"""Generating for /v1/completions and /v1/chat/completions once their prompts are tokenized:
admission against the queue limit, one engine request per prompt, then one JSON body or a
stream of events. The endpoint supplies its id prefix, body builder and StreamFormat."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.front.beam_search import BeamSearchParams, run_beam_search
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.tracing import trace_headers
from llmctl.engine.multimodal.items import ProcessedPrompt
from llmctl.engine.sampling_params import SamplingParams
from llmctl.server.admission import AdmittedStream
from llmctl.server.operability import request_id_of
from llmctl.server.protocol import SamplingRequest, bad
from llmctl.server.responses import Prompt, ResponseContext
from llmctl.server.sse import RecordFinished, StreamFormat, stream_events
from llmctl.server.state import ServerState
from llmctl.server.transport import until_disconnect

logger = logging.getLogger("llmctl.server")
EventStream = Callable[[ResponseContext, list[AsyncIterator[RequestOutput]], RecordFinished], AsyncIterator[str]]


@dataclass(frozen=True)
class Endpoint:
    id_prefix: str  # "cmpl-" or "chatcmpl-", as OpenAI's ids start
    full_response: Callable[[ResponseContext, list[RequestOutput]], dict[str, Any]]
    stream_format: Callable[[], StreamFormat] | None = None  # chunks per choice (completions, chat)
    event_stream: EventStream | None = None  # or a whole stream of its own (/v1/responses)


async def respond(state: ServerState, request: Request, endpoint: Endpoint, model: str, prompts: list[Prompt],
                  sampling: SamplingRequest, processed: list[ProcessedPrompt] | None = None) -> Response:
    """`processed`: prompts with images, in place of the token ids of `prompts` (which count their usage)."""
    engine = state.ready_engine
    if processed and sampling.use_beam_search:
        raise bad("use_beam_search does not take images yet: leave it out for a prompt with images", "use_beam_search")
    if sampling.params.priority and state.settings.engine_config.scheduling_policy != "priority":
        raise bad(f"priority {sampling.params.priority} needs the server started with --scheduling-policy priority "
                  "(vLLM answers the same)", "priority")
    if sampling.params.structured_outputs is not None:  # a grammar that cannot compile is a 400 before queueing
        await asyncio.to_thread(engine.check_structured_outputs, sampling.params.structured_outputs)
    admission = state.in_flight.admit(len(prompts) * sampling.params.n)
    ctx = ResponseContext(endpoint.id_prefix + request_id_of(request.scope), model, int(time.time()), sampling,
                          engine.tokenizer, prompts)
    number = next(state.engine_ids)
    if state.tracer is None and "traceparent" in request.headers:
        _warn_trace_context_ignored()
    if state.settings.log_requests:
        log_requests(state, ctx.request_id, number, prompts, sampling)
    lora = state.adapters.get(model)
    if lora is not None:
        state.metrics.lora_requests.labels(state.model_name, model).inc()
    if sampling.use_beam_search:
        streams = [run_beam_search(engine, ids, beam_search_params(sampling, engine.max_model_len - len(ids)),
                                   f"{ctx.request_id}-{number}-{i}", lora, text) for i, (text, ids) in enumerate(prompts)]
    else:
        streams = [engine.generate(processed[i] if processed else ids, sampling.params,
                                   f"{ctx.request_id}-{number}-{i}", lora) for i, (_, ids) in enumerate(prompts)]

    headers = trace_headers(request.headers)

    def record(output: RequestOutput | None, token_times: list[float]) -> None:
        record_finished(state, output, token_times)
        if output is not None and state.tracer is not None:
            state.tracer.record(output, sampling.params, headers)

    if sampling.stream:
        if endpoint.event_stream is not None:
            events = endpoint.event_stream(ctx, streams, record)
        else:
            assert endpoint.stream_format is not None  # an endpoint streams one way or the other
            events = stream_events(ctx, streams, record, endpoint.stream_format())
        return AdmittedStream(admission, events)
    try:
        finals = await until_disconnect(request, asyncio.gather(*(last_output(s, record) for s in streams)))
        if finals is None:  # the client went away: the generators were cancelled and aborted
            return Response(status_code=499)
        return JSONResponse(endpoint.full_response(ctx, finals))
    finally:
        admission.release()


def log_requests(state: ServerState, request_id: str, number: int, prompts: list[Prompt],
                 sampling: SamplingRequest) -> None:
    """vLLM's --enable-log-requests: one line per engine request, its prompt cut to --max-log-len."""
    limit = state.settings.max_log_len
    for i, (text, ids) in enumerate(prompts):
        shown = text if text is None or limit is None else text[:limit]
        logger.info("Received request %s-%d-%d: prompt: %r, %d prompt tokens, params: %s", request_id, number, i,
                    shown, len(ids), sampling.params)


def beam_search_params(sampling: SamplingRequest, room: int) -> BeamSearchParams:
    """vLLM's use_beam_search: n beams; what beam search does not apply is refused, not ignored."""
    params = sampling.params
    for name, asked in _beam_search_refusals(params).items():
        if asked:
            raise bad(f"use_beam_search does not apply {name}: leave it out or do not use beam search",
                      "use_beam_search")
    try:
        return BeamSearchParams(params.n, min(params.max_tokens or room, room), params.ignore_eos,
                                params.temperature or 0.0, sampling.length_penalty, params.include_stop_str_in_output)
    except InvalidRequestError as exc:
        raise bad(str(exc), exc.param) from None


def _beam_search_refusals(params: SamplingParams) -> dict[str, bool]:
    """What a request asks for that vLLM's beam search (one-token steps scored by cumulative logprob) does not
    apply: each is a 400 naming it rather than a field without effect."""
    return {"stop": bool(params.stop), "logprobs": params.logprobs is not None,
            "prompt_logprobs": params.prompt_logprobs is not None,
            "structured outputs": params.structured_outputs is not None, "logit_bias": bool(params.logit_bias),
            "bad_words": bool(params.bad_words), "allowed_token_ids": bool(params.allowed_token_ids),
            "min_tokens": params.min_tokens > 0, "stop_token_ids": bool(params.stop_token_ids),
            "repetition_penalty": params.repetition_penalty not in (None, 1.0),
            "presence_penalty": params.presence_penalty != 0, "frequency_penalty": params.frequency_penalty != 0,
            "top_k": params.top_k not in (None, 0, -1), "top_p": params.top_p not in (None, 1.0),
            "min_p": params.min_p != 0, "seed": params.seed is not None, "priority": params.priority != 0}


async def last_output(stream: AsyncIterator[RequestOutput],
                      record: Callable[[RequestOutput | None, list[float]], None]) -> RequestOutput:
    final, token_times = None, []
    async for output in stream:
        final = output
        token_times.append(time.perf_counter())
    record(final, token_times)
    assert final is not None, "the engine's stream ends with the request's final output"
    return final


@functools.cache
def _warn_trace_context_ignored() -> None:
    logger.warning("a request came with a traceparent header, but tracing is off: start with "
                   "--otlp-traces-endpoint to export spans (vLLM logs the same, once)")


def record_finished(state: ServerState, output: RequestOutput | None, token_times: list[float]) -> None:
    if output is None or output.metrics is None:
        return
    state.metrics.observe_finished(output, output.metrics, token_times)
