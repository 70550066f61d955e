"""Beam search as vLLM runs it, above the engine (vLLM's EngineClient.beam_search): each step every live
beam is one request for a single token with the top 2 × beam_width log-probabilities; the candidates of
all beams are ranked by vLLM's score (cumulative logprob / length ** length_penalty, the length counting
the prompt) and the best beam_width go on; a beam that draws EOS is complete. The prefix cache keeps the
repeated prompts cheap. `BeamSearch` is the pure algorithm; `run_beam_search` drives it on an
EngineClient (the server), `LLM.beam_search` on the offline engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.front.outputs import CompletionOutput, RequestOutput
from llmctl.engine.sampling_params import MAX_LOGPROBS, SamplingParams


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if self.beam_width < 1 or self.max_tokens < 1:
            raise InvalidRequestError("beam search needs a beam width (n) and max_tokens of at least 1", "n")
        if 2 * self.beam_width > MAX_LOGPROBS:  # each step ranks 2 × width alternatives per beam
            raise InvalidRequestError(f"beam search takes a beam width (n) of at most {MAX_LOGPROBS // 2}", "n")

    def step_params(self) -> SamplingParams:
        """One token per beam per step, with the alternatives to rank."""
        return SamplingParams(max_tokens=1, temperature=self.temperature, logprobs=2 * self.beam_width,
                              ignore_eos=True)


@dataclass
class Beam:
    tokens: list[int]  # the prompt's and the generated
    cum_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | None = None

    def score(self, eos_token_id: int | None, length_penalty: float) -> float:
        """vLLM's get_beam_search_score."""
        length = len(self.tokens) - (1 if eos_token_id is not None and self.tokens[-1] == eos_token_id else 0)
        return self.cum_logprob / (length ** length_penalty)


@dataclass
class BeamSearch:
    prompt_token_ids: list[int]
    params: BeamSearchParams
    eos_token_id: int | None
    beams: list[Beam] = field(default_factory=list)
    completed: list[Beam] = field(default_factory=list)
    steps: int = 0

    def __post_init__(self) -> None:
        self.beams = [Beam(list(self.prompt_token_ids))]

    @property
    def done(self) -> bool:
        return not self.beams or self.steps >= self.params.max_tokens

    def advance(self, alternatives: list[dict[int, float]]) -> None:
        """One step: for each live beam, its next tokens' log-probabilities."""
        candidates = []
        for beam, options in zip(self.beams, alternatives):
            for token, logprob in options.items():
                grown = Beam(beam.tokens + [token], beam.cum_logprob + logprob)
                if token == self.eos_token_id and not self.params.ignore_eos:
                    grown.finish_reason, grown.stop_reason = "stop", token
                    self.completed.append(grown)
                else:
                    candidates.append(grown)
        candidates.sort(key=self._key, reverse=True)
        self.beams = candidates[:self.params.beam_width]
        self.steps += 1

    def _key(self, beam: Beam) -> float:
        return beam.score(self.eos_token_id, self.params.length_penalty)

    def best(self) -> list[Beam]:
        return sorted(self.completed + self.beams, key=self._key, reverse=True)[:self.params.beam_width]

    def output(self, request_id: str, tokenizer: Any, prompt: str | None) -> RequestOutput:
        start, outputs = len(self.prompt_token_ids), []
        for index, beam in enumerate(self.best()):
            generated = beam.tokens[start:]
            shown = generated[:-1] if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output \
                else generated
            outputs.append(CompletionOutput(index, tokenizer.decode(shown), generated, beam.finish_reason or "length",
                                            beam.stop_reason, cumulative_logprob=beam.cum_logprob))
        return RequestOutput(request_id, prompt, list(self.prompt_token_ids), outputs, finished=True)


def alternatives_of(output: RequestOutput) -> dict[int, float]:
    """The step's candidates: the drawn token and its top alternatives, with their log-probabilities."""
    [entry] = output.outputs[0].logprobs
    return {**entry.top, entry.token_id: entry.logprob}


async def run_beam_search(engine: Any, prompt_token_ids: list[int], params: BeamSearchParams, request_id: str,
                          lora_request: Any = None, prompt: str | None = None) -> AsyncIterator[RequestOutput]:
    """Beam search on an EngineClient; yields one RequestOutput, the finished beams."""
    import asyncio

    eos = getattr(engine.tokenizer, "eos_token_id", None)
    search = BeamSearch(prompt_token_ids, params, eos)
    while not search.done:
        steps = [_last(engine.generate(beam.tokens, params.step_params(), f"{request_id}-{search.steps}-{i}",
                                       lora_request)) for i, beam in enumerate(search.beams)]
        search.advance([alternatives_of(output) for output in await asyncio.gather(*steps)])
    yield search.output(request_id, engine.tokenizer, prompt)


async def _last(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for output in stream:
        final = output
    return final
