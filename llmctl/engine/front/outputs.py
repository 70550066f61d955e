"""What the engine hands back per request: text, token ids, finish reasons, logprobs, timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmctl.engine.core.sequence import TokenLogprob  # public: the logprobs of an output


@dataclass
class CompletionOutput:
    index: int
    text: str  # all text so far (a possible stop string's start held back until it is decided)
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float | None
    model_forward_time: float | None = None  # --collect-detailed-traces model: its steps' forward passes (s)
    model_execute_time: float | None = None  # … worker: its steps from submission to sampled tokens (s)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    extra: dict = field(default_factory=dict)
