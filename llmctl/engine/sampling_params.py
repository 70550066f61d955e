"""Per-request generation settings, with vLLM's names and OpenAI's meanings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmctl.engine.errors import InvalidRequestError

if TYPE_CHECKING:
    from llmctl.engine.structured.params import StructuredOutputsParams

MAX_LOGPROBS = 20
MAX_N = 128


@dataclass(frozen=True)
class Range:
    """The allowed values of a numeric setting: checked here, and published in the server's OpenAPI schema."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False

    def contains(self, value: float) -> bool:
        low_ok = self.minimum is None or (value > self.minimum if self.exclusive_minimum else value >= self.minimum)
        return low_ok and (self.maximum is None or value <= self.maximum)

    def describe(self) -> str:
        if self.maximum is None:
            return f"greater than {self.minimum:g}" if self.exclusive_minimum else f"at least {self.minimum:g}"
        if self.exclusive_minimum:
            return f"in ({self.minimum:g}, {self.maximum:g}]"
        return f"between {self.minimum:g} and {self.maximum:g}"

    def json_schema(self) -> dict[str, float]:
        schema: dict[str, float] = {}
        if self.minimum is not None:
            schema["exclusiveMinimum" if self.exclusive_minimum else "minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        return schema


# One home for every range: SamplingParams.validate, the HTTP validator and /openapi.json all read it.
RANGES: dict[str, Range] = {
    "n": Range(1, MAX_N),
    "temperature": Range(0, 100),
    "top_p": Range(0, 1, exclusive_minimum=True),
    "top_k": Range(-1),
    "min_p": Range(0, 1),
    "repetition_penalty": Range(0, 2, exclusive_minimum=True),
    "presence_penalty": Range(-2, 2),
    "frequency_penalty": Range(-2, 2),
    "max_tokens": Range(1),
    "min_tokens": Range(0),
    "logprobs": Range(0),  # at most the engine's --max-logprobs (checked when the request arrives)
    "prompt_logprobs": Range(0),
    "seed": Range(-(2**63), 2**64 - 1),
}


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
    disable_spec_decode: bool = False  # this request never proposes, on an engine that speculates
    priority: int = 0  # --scheduling-policy priority: lower runs first (vLLM's request priority, carried here)
    structured_outputs: StructuredOutputsParams | None = None  # a grammar the output must follow
    logit_bias: dict[int, float] | None = None  # added to these tokens' logits (OpenAI: -100 to 100)
    allowed_token_ids: list[int] | None = None  # only these tokens may be generated
    bad_words: list[str] | None = None  # words (token sequences) that must not be generated
    bad_words_token_ids: list[list[int]] | None = None  # the words tokenized (set by the engine, as vLLM's)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.validate()

    def validate(self) -> None:
        for name, allowed in RANGES.items():
            value = getattr(self, name)
            if value is not None and not allowed.contains(value):
                raise InvalidRequestError(f"{name} must be {allowed.describe()}, got {value}", name)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequestError(f"min_tokens must be at most max_tokens, got {self.min_tokens}", "min_tokens")
        for token, bias in (self.logit_bias or {}).items():
            if not -100 <= bias <= 100:
                raise InvalidRequestError(f"logit_bias values must be between -100 and 100, got {bias} for token "
                                          f"{token}", "logit_bias")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise InvalidRequestError("allowed_token_ids must not be empty", "allowed_token_ids")

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
