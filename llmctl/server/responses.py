"""Response bodies in OpenAI's shapes: completions, chat completions, their stream chunks, usage.
Every body of one response shares a ResponseContext."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from llmctl.engine.front.outputs import CompletionOutput, RequestOutput, TokenLogprob
from llmctl.engine.reasoning import ReasoningFactory
from llmctl.server.chat_message import ToolCalling, full_message
from llmctl.server.protocol import JSON, SamplingRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

Prompt = tuple[str | None, list[int]]  # the text (None for token ids) and its token ids


@dataclass(frozen=True)
class ResponseContext:
    request_id: str
    model: str
    created: int
    sampling: SamplingRequest
    tokenizer: Tokenizer
    prompts: list[Prompt]

    def prompt_text(self, index: int, output: RequestOutput) -> str:
        text = self.prompts[index][0]
        return text if text is not None else cast(str, self.tokenizer.decode(output.prompt_token_ids))  # one sequence


@dataclass(frozen=True)
class Delta:
    """What a stream sends next for one choice: new text, new log-probabilities, maybe its end."""

    choice: int
    text: str
    completion: CompletionOutput
    logprobs: list[TokenLogprob] | None
    offset: int  # characters of this choice's text sent before


def usage(outputs: list[RequestOutput]) -> dict[str, int]:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _piece(tokenizer: Tokenizer, token: int) -> str:
    return cast(str, tokenizer.decode([token]))  # one sequence decodes to one string


def completion_logprobs(entries: Sequence[TokenLogprob | None], tokenizer: Tokenizer, offset: int = 0,
                        token_ids: Sequence[int] = ()) -> dict[str, list[Any]]:
    """OpenAI's completion logprobs. An entry may be None (the first prompt token has no context,
    so no logprob): then its token comes from `token_ids` and its logprob is null, as vLLM answers."""
    tokens: list[str] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for position, entry in enumerate(entries):
        token_id = entry.token_id if entry is not None else token_ids[position]
        piece = _piece(tokenizer, token_id)
        tokens.append(piece)
        logprobs.append(entry.logprob if entry is not None else None)
        tops.append(({_piece(tokenizer, t): lp for t, lp in entry.top.items()} or None) if entry is not None else None)
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def echo_logprobs(output: RequestOutput, completion_entries: list[TokenLogprob], tokenizer: Tokenizer
                  ) -> dict[str, list[Any]]:
    """Every prompt token (the first with a null logprob), then the generated ones."""
    prompt_entries = list(output.prompt_logprobs or [None] * len(output.prompt_token_ids))
    ids = list(output.prompt_token_ids) + [e.token_id for e in completion_entries]
    return completion_logprobs(prompt_entries + list(completion_entries), tokenizer, token_ids=ids)


def chat_logprobs(entries: list[TokenLogprob], tokenizer: Tokenizer) -> dict[str, list[Any]]:
    def item(token: int, logprob: float) -> dict[str, Any]:
        piece = _piece(tokenizer, token)
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

    return {"content": [{**item(e.token_id, e.logprob),
                         "top_logprobs": [item(t, lp) for t, lp in e.top.items()]} for e in entries]}


def prompt_logprobs(output: RequestOutput, tokenizer: Tokenizer) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt_logprobs: per prompt token (the first: null, it has no context) the token and its top
    alternatives by id, each with its logprob, rank (alternatives: 1, 2, … by likelihood) and decoded text."""
    def item(token: int, logprob: float, rank: int) -> dict[str, Any]:
        return {"logprob": logprob, "rank": rank, "decoded_token": _piece(tokenizer, token)}

    entries: list[dict[str, dict[str, Any]] | None] = []
    for entry in output.prompt_logprobs or []:
        if entry is None:
            entries.append(None)
            continue
        ranked = sorted(entry.top.items(), key=lambda pair: -pair[1])
        alternatives = {str(t): item(t, lp, rank) for rank, (t, lp) in enumerate(ranked, start=1)}
        entries.append({str(entry.token_id): item(entry.token_id, entry.logprob, entry.rank), **alternatives})
    return entries


def completion_response(ctx: ResponseContext, outputs: list[RequestOutput]) -> dict[str, Any]:
    choices = []
    n, echo, tokenizer = ctx.sampling.params.n, ctx.sampling.echo, ctx.tokenizer
    asked = ctx.sampling.prompt_logprobs_asked
    for p, output in enumerate(outputs):
        prompt_text = ctx.prompt_text(p, output)
        for completion in output.outputs:
            text = (prompt_text + completion.text) if echo else completion.text
            logprobs = None
            if completion.logprobs is not None:
                logprobs = echo_logprobs(output, completion.logprobs, tokenizer) if echo else \
                    completion_logprobs(completion.logprobs, tokenizer)
            choices.append({"index": p * n + completion.index, "text": text, "logprobs": logprobs,
                            "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason,
                            "prompt_logprobs": prompt_logprobs(output, tokenizer) if asked else None})
    return {"id": ctx.request_id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
            "choices": choices, "usage": usage(outputs)}


def chat_response(ctx: ResponseContext, outputs: list[RequestOutput], calling: ToolCalling | None = None,
                  reasoning: ReasoningFactory | None = None) -> dict[str, Any]:
    [output] = outputs
    choices = []
    for c in output.outputs:
        message, finish_reason = full_message(c.text, c.finish_reason, calling, reasoning() if reasoning else None)
        choices.append({"index": c.index, "message": message,
                        "logprobs": chat_logprobs(c.logprobs, ctx.tokenizer) if c.logprobs is not None else None,
                        "finish_reason": finish_reason, "stop_reason": c.stop_reason})
    asked = ctx.sampling.prompt_logprobs_asked
    return {"id": ctx.request_id, "object": "chat.completion", "created": ctx.created, "model": ctx.model,
            "choices": choices, "usage": usage(outputs),
            "prompt_logprobs": prompt_logprobs(output, ctx.tokenizer) if asked else None}


def completion_chunk(ctx: ResponseContext, index: int, text: str, delta: Delta | None = None) -> dict[str, Any]:
    """One choice's text; with a delta, its finish and log-probabilities too."""
    end = delta.completion if delta is not None else None
    logprobs = completion_logprobs(delta.logprobs, ctx.tokenizer, delta.offset) \
        if delta is not None and delta.logprobs else None
    choice = {"index": index, "text": text, "finish_reason": end.finish_reason if end else None,
              "stop_reason": end.stop_reason if end else None, "logprobs": logprobs}
    return {"id": ctx.request_id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
            "choices": [choice]}


def chat_chunk(ctx: ResponseContext, index: int, message: dict[str, JSON], delta: Delta | None = None,
               finish_reason: str | None = None) -> dict[str, Any]:
    """One choice's message delta; with a delta, its finish (finish_reason overrides the output's) and
    log-probabilities too."""
    end = delta.completion if delta is not None else None
    logprobs = delta.logprobs if delta is not None else None
    finish = finish_reason or (end.finish_reason if end else None)
    choice = {"index": index, "delta": message, "finish_reason": finish,
              "stop_reason": end.stop_reason if end else None,
              "logprobs": chat_logprobs(logprobs, ctx.tokenizer) if logprobs else None}
    return {"id": ctx.request_id, "object": "chat.completion.chunk", "created": ctx.created, "model": ctx.model,
            "choices": [choice]}
