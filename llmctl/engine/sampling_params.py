"""Per-request generation settings, with vLLM's names and OpenAI's meanings."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmctl.errors import LlmctlError

MAX_LOGPROBS = 20


class InvalidRequestError(LlmctlError):
    """A request setting is out of range; the message names the parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float | None = None  # None: the model's generation_config, else 1.0
    top_p: float | None = None
    top_k: int | None = None  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    logprobs: int | None = None  # top-N alternatives per generated token (0: only the chosen one)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.validate()

    def validate(self) -> None:
        def bad(param: str, message: str) -> None:
            raise InvalidRequestError(f"{param} {message}", param)

        if not 1 <= self.n <= 128:
            bad("n", f"must be between 1 and 128, got {self.n}")
        if self.temperature is not None and not 0 <= self.temperature <= 100:
            bad("temperature", f"must be between 0 and 100, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < -1:
            bad("top_k", f"must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty is not None and not 0 < self.repetition_penalty <= 2:
            bad("repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                bad(name, f"must be between -2 and 2, got {getattr(self, name)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad("min_tokens", f"must be between 0 and max_tokens, got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                bad(name, f"must be between 0 and {MAX_LOGPROBS}, got {value}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            bad("seed", "must fit in 64 bits")

    @property
    def greedy(self) -> bool:
        return self.temperature is not None and self.temperature < 1e-5

    def with_defaults(self, defaults: dict) -> SamplingParams:
        """Fill settings left as None from the model's generation_config.json."""
        params = SamplingParams(**{**self.__dict__})
        if params.temperature is None:
            sample = defaults.get("do_sample", True)
            params.temperature = float(defaults.get("temperature", 1.0)) if sample else 0.0
        if params.top_p is None:
            params.top_p = float(defaults.get("top_p", 1.0))
        if params.top_k is None:
            params.top_k = int(defaults.get("top_k", 0) or 0)
        if params.repetition_penalty is None:
            params.repetition_penalty = float(defaults.get("repetition_penalty", 1.0))
        return params
