"""Response bodies in OpenAI's shapes: completions, chat completions, their stream chunks, usage."""

from __future__ import annotations

from typing import Any

from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.core.sequence import TokenLogprob


def usage(outputs: list[RequestOutput]) -> dict[str, int]:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _piece(tokenizer: Any, token: int) -> str:
    return tokenizer.decode([token])


def completion_logprobs(entries: list[TokenLogprob | None], tokenizer: Any, offset: int = 0,
                        token_ids: list[int] | None = None) -> dict[str, list]:
    """OpenAI's completion logprobs. An entry may be None (the first prompt token has no context,
    so no logprob): then its token comes from `token_ids` and its logprob is null, as vLLM answers."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for position, entry in enumerate(entries):
        token_id = entry.token_id if entry is not None else token_ids[position]
        piece = _piece(tokenizer, token_id)
        tokens.append(piece)
        logprobs.append(entry.logprob if entry is not None else None)
        tops.append(({_piece(tokenizer, t): lp for t, lp in entry.top.items()} or None) if entry is not None else None)
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def echo_logprobs(output: RequestOutput, completion_entries: list[TokenLogprob], tokenizer: Any) -> dict[str, list]:
    """Every prompt token (the first with a null logprob), then the generated ones."""
    prompt_entries = list(output.prompt_logprobs or [None] * len(output.prompt_token_ids))
    ids = list(output.prompt_token_ids) + [e.token_id for e in completion_entries]
    return completion_logprobs(prompt_entries + list(completion_entries), tokenizer, token_ids=ids)


def chat_logprobs(entries: list[TokenLogprob], tokenizer: Any) -> dict[str, list]:
    def item(token: int, logprob: float) -> dict[str, Any]:
        piece = _piece(tokenizer, token)
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

    return {"content": [{**item(e.token_id, e.logprob),
                         "top_logprobs": [item(t, lp) for t, lp in e.top.items()]} for e in entries]}


def completion_response(request_id: str, model: str, created: int, outputs: list[RequestOutput], sampling: Any,
                        tokenizer: Any, prompts: list) -> dict[str, Any]:
    choices = []
    n = sampling.params.n
    for p, output in enumerate(outputs):
        prompt_text = (prompts[p][0] if prompts[p][0] is not None else tokenizer.decode(output.prompt_token_ids))
        for completion in output.outputs:
            text = (prompt_text + completion.text) if sampling.echo else completion.text
            logprobs = None
            if completion.logprobs is not None:
                logprobs = echo_logprobs(output, completion.logprobs, tokenizer) if sampling.echo else \
                    completion_logprobs(completion.logprobs, tokenizer)
            choices.append({"index": p * n + completion.index, "text": text, "logprobs": logprobs,
                            "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason})
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": usage(outputs)}


def chat_response(request_id: str, model: str, created: int, outputs: list[RequestOutput], sampling: Any,
                  tokenizer: Any, prompts: list) -> dict[str, Any]:
    [output] = outputs
    choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": chat_logprobs(c.logprobs, tokenizer) if c.logprobs is not None else None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for c in output.outputs]
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage(outputs)}


def completion_chunk(request_id: str, model: str, created: int, index: int, text: str, finish_reason: str | None,
                     stop_reason: Any, logprobs: list[TokenLogprob] | None = None, tokenizer: Any = None,
                     offset: int = 0) -> dict[str, Any]:
    choice = {"index": index, "text": text, "finish_reason": finish_reason, "stop_reason": stop_reason,
              "logprobs": completion_logprobs(logprobs, tokenizer, offset) if logprobs else None}
    return {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_chunk(request_id: str, model: str, created: int, index: int, delta: dict[str, Any],
               finish_reason: str | None = None, stop_reason: Any = None, logprobs: list[TokenLogprob] | None = None,
               tokenizer: Any = None) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "stop_reason": stop_reason,
              "logprobs": chat_logprobs(logprobs, tokenizer) if logprobs else None}
    return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [choice]}
