"""/v1/completions: prompts (text or token ids) in, completions out, streamed or whole."""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from llmctl.engine.front.outputs import RequestOutput
from llmctl.server.generation import Endpoint, respond
from llmctl.server.models import check_model
from llmctl.server.protocol import COMPLETION_FIELDS, completion_prompts, completion_sampling_request, warn_ignored
from llmctl.server.responses import Delta, ResponseContext, completion_chunk, completion_response, echo_logprobs
from llmctl.server.state import ServerState
from llmctl.server.structured import structured_outputs
from llmctl.server.transport import read_json


async def completions(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    prompts = completion_prompts(fields)
    sampling = completion_sampling_request(fields)
    warn_ignored(fields, COMPLETION_FIELDS)
    sampling.params.structured_outputs = structured_outputs(fields, state.structured_backend)
    prepared = [state.ready_engine.tokenize(p) for p in prompts]
    return await respond(state, request, COMPLETIONS, model, prepared, sampling)


class CompletionStream:
    """Completion chunks; with echo, each prompt's text (and its logprobs) goes first, once per choice."""

    object_name = "text_completion"

    def __init__(self) -> None:
        self.echoed: dict[int, int] = {}  # prompt index -> length of its echoed text

    def opening(self, ctx: ResponseContext, num_choices: int) -> list[dict[str, Any]]:
        return []

    def before_output(self, ctx: ResponseContext, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]:
        if not ctx.sampling.echo or prompt_index in self.echoed:
            return []
        text = ctx.prompt_text(prompt_index, output)
        logprobs = echo_logprobs(output, [], ctx.tokenizer) if ctx.sampling.params.logprobs is not None else None
        n = ctx.sampling.params.n
        chunks = []
        for j in range(n):
            chunk = completion_chunk(ctx, prompt_index * n + j, text)
            chunk["choices"][0]["logprobs"] = logprobs
            chunks.append(chunk)
        self.echoed[prompt_index] = len(text)
        return chunks

    def chunk(self, ctx: ResponseContext, prompt_index: int, delta: Delta) -> dict[str, Any]:
        offset = self.echoed.get(prompt_index, 0) + delta.offset  # text_offset counts the echoed prompt too
        return completion_chunk(ctx, delta.choice, delta.text, dataclasses.replace(delta, offset=offset))


COMPLETIONS = Endpoint("cmpl-", completion_response, CompletionStream)
