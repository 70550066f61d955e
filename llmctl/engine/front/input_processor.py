"""Requests in: a prompt (text or token ids) and its sampling parameters, checked against the
model's vocabulary and context length, with the model's generation defaults applied."""

from __future__ import annotations

from typing import Any

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.front.output_processor import Request
from llmctl.engine.lora.adapter import LoRAAdapter
from llmctl.engine.multimodal.items import ProcessedPrompt
from llmctl.engine.pooling.config import PoolerConfig, dimensions_problem
from llmctl.engine.pooling.params import PoolingParams
from llmctl.engine.sample.bad_words import bad_words_token_ids
from llmctl.engine.sampling_params import MAX_LOGPROBS, SamplingParams


class InputProcessor:
    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int,
                 generation_defaults: dict[str, Any], max_logprobs: int = MAX_LOGPROBS) -> None:
        self.tokenizer = tokenizer
        self.max_logprobs = max_logprobs
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.generation_defaults = generation_defaults

    def tokenize(self, prompt: str | list[int] | ProcessedPrompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, ProcessedPrompt):  # expanded by the multimodal processor already
            return prompt.prompt, list(prompt.token_ids)
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.vocab_size}); got {bad[:3]}", "prompt")
        return None, ids

    def process(self, request_id: str, prompt: str | list[int] | ProcessedPrompt, params: SamplingParams | None,
                lora: LoRAAdapter | None) -> Request:
        text, ids = self.tokenize(prompt)
        params = (params or SamplingParams()).with_defaults(self.generation_defaults)
        self._check_lengths(ids, params)
        self._check_token_ids(params)
        self._check_logprobs(params)
        if params.bad_words:
            params.bad_words_token_ids = bad_words_token_ids(params.bad_words, self.tokenizer)
        if isinstance(prompt, ProcessedPrompt):
            return Request(request_id, text, ids, params, lora=lora, mm_items=prompt.items, mrope=prompt.mrope)
        return Request(request_id, text, ids, params, lora=lora)

    def process_pooling(self, request_id: str, prompt: str | list[int], params: PoolingParams,
                        pooler: PoolerConfig, max_batched: int) -> Request:
        """A pooling request: its prompt must fit the context (no output follows) and, for a pooler that reads
        every row, one step's token budget."""
        text, ids = self.tokenize(prompt)
        if not ids:
            raise InvalidRequestError("the input is empty", "input")
        if len(ids) > self.max_model_len:
            raise InvalidRequestError(f"the input has {len(ids)} tokens; this model's maximum context length is "
                                      f"{self.max_model_len} tokens: shorten the input", "input")
        if pooler.whole_prompt and len(ids) > max_batched:
            raise InvalidRequestError(f"the input has {len(ids)} tokens; {pooler.pooling} pooling computes an input "
                                      f"in one step of at most {max_batched} tokens (--max-num-batched-tokens)",
                                      "input")
        if params.dimensions is not None and (problem := dimensions_problem(
                pooler.matryoshka, pooler.dimensions, pooler.hidden_size, params.dimensions)):
            raise InvalidRequestError(problem, "dimensions")
        return Request(request_id, text, ids, SamplingParams(max_tokens=1), pooling=params)

    def _check_logprobs(self, params: SamplingParams) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is not None and asked > self.max_logprobs:
                raise InvalidRequestError(f"{name} {asked} is more than this server's --max-logprobs "
                                          f"{self.max_logprobs}: ask for fewer, or start it with a larger "
                                          "--max-logprobs", name)

    def _check_token_ids(self, params: SamplingParams) -> None:
        for name, ids in (("logit_bias", list(params.logit_bias or {})), ("allowed_token_ids",
                                                                          params.allowed_token_ids or [])):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequestError(f"{name}: token ids must be in [0, {self.vocab_size}); got {bad[:3]}", name)

    def _check_lengths(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens; this model's maximum context length is {self.max_model_len} "
                "tokens including the output: shorten the prompt", "prompt")
        if params.max_tokens is not None and len(ids) + params.max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"max_tokens {params.max_tokens} plus the prompt's {len(ids)} tokens exceed the maximum context "
                f"length {self.max_model_len}: use max_tokens ≤ {self.max_model_len - len(ids)}", "max_tokens")
