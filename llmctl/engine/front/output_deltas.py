"""A remote replica's step outputs sent as what is new: each RequestOutput carries its whole text, token ids
and logprobs so far (and its prompt), so sending it whole every step would copy a long generation again at
every token. The replica side sends a request's first output whole and then only the suffixes; the API
server's side keeps the last whole output and appends, so its consumers get the same RequestOutputs a local
engine gives. Both sides see every step in order, so they agree on what was sent."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llmctl.engine.front.outputs import CompletionOutput, RequestOutput


@dataclass(frozen=True)
class OutputDelta:
    whole: bool  # output is the whole RequestOutput; else its completions hold only what is new
    output: RequestOutput


class DeltaEncoder:
    """The replica side: what the API server already holds of each running request's output."""

    def __init__(self) -> None:
        self._sent: dict[str, RequestOutput] = {}

    def encode(self, outputs: list[RequestOutput]) -> list[OutputDelta]:
        return [self._encode(output) for output in outputs]

    def forget(self, request_id: str) -> None:
        self._sent.pop(request_id, None)

    def _encode(self, output: RequestOutput) -> OutputDelta:
        last = self._sent.pop(output.request_id, None)
        if not output.finished:
            self._sent[output.request_id] = output
        if last is None or not _extends(last, output):
            return OutputDelta(True, output)
        completions = [_suffix(before, now) for before, now in zip(last.outputs, output.outputs)]
        return OutputDelta(False, dataclasses.replace(output, prompt=None, prompt_token_ids=[], prompt_logprobs=None,
                                                      outputs=completions))


class DeltaDecoder:
    """The API server's side: each request's whole output, rebuilt from the deltas."""

    def __init__(self) -> None:
        self._held: dict[str, RequestOutput] = {}

    def decode(self, deltas: list[OutputDelta]) -> list[RequestOutput]:
        return [self._decode(delta) for delta in deltas]

    def forget(self, request_id: str) -> None:
        self._held.pop(request_id, None)

    def _decode(self, delta: OutputDelta) -> RequestOutput:
        output = delta.output
        if not delta.whole:
            last = self._held[output.request_id]
            output = dataclasses.replace(output, prompt=last.prompt, prompt_token_ids=last.prompt_token_ids,
                                         prompt_logprobs=last.prompt_logprobs,
                                         outputs=[_joined(before, new) for before, new in zip(last.outputs,
                                                                                              output.outputs)])
        self._held.pop(output.request_id, None)
        if not output.finished:
            self._held[output.request_id] = output
        return output


def _extends(last: RequestOutput, now: RequestOutput) -> bool:
    """Whether now only adds to last (the same completions, each one's text, tokens and logprobs grown)."""
    return len(last.outputs) == len(now.outputs) and all(
        b.index == n.index and n.text.startswith(b.text) and n.token_ids[:len(b.token_ids)] == b.token_ids
        and (b.logprobs is None) == (n.logprobs is None) and len(n.logprobs or []) >= len(b.logprobs or [])
        for b, n in zip(last.outputs, now.outputs))


def _suffix(before: CompletionOutput, now: CompletionOutput) -> CompletionOutput:
    logprobs = now.logprobs[len(before.logprobs or []):] if now.logprobs is not None else None
    return dataclasses.replace(now, text=now.text[len(before.text):], token_ids=now.token_ids[len(before.token_ids):],
                               logprobs=logprobs)


def _joined(before: CompletionOutput, new: CompletionOutput) -> CompletionOutput:
    logprobs = (before.logprobs or []) + new.logprobs if new.logprobs is not None else None
    return dataclasses.replace(new, text=before.text + new.text, token_ids=before.token_ids + new.token_ids,
                               logprobs=logprobs)
