"""LLM: offline batch generation, `from llmctl import LLM, SamplingParams`."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from llmctl.engine.config import EngineConfig
from llmctl.engine.front.beam_search import BeamSearch, BeamSearchParams, alternatives_of
from llmctl.engine.front.embedding import encoder_model_for
from llmctl.engine.front.llm_engine import LLMEngine
from llmctl.engine.front.llm_pooling import PoolingCalls
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.prompt_lists import is_token_ids, per_prompt
from llmctl.engine.front.tracing import RequestTracer
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.multimodal.items import ProcessedPrompt
from llmctl.engine.sampling_params import SamplingParams

Prompt = str | list[int] | dict[str, Any]  # vLLM's TextPrompt {"prompt": …} and TokensPrompt {"prompt_token_ids": …}


class LLM(PoolingCalls):
    """Load a model once, then generate for many prompts with continuous batching (or, for a pooling model,
    embed, classify and score them: PoolingCalls)."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        config = EngineConfig(model=model, **engine_args)
        self.encoder = encoder_model_for(config)  # an encoder: through transformers, pooling calls only
        self._engine = LLMEngine(config) if self.encoder is None else None
        self._ids = itertools.count()
        self.tracer = RequestTracer(config.otlp_traces_endpoint, config.model or "default") \
            if config.otlp_traces_endpoint and self._engine is not None else None

    @property
    def engine(self) -> LLMEngine:
        if self._engine is None:
            raise ValueError("this is an encoder model: it serves LLM.embed, LLM.classify or LLM.score, not "
                             "generation")
        return self._engine

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        # fields as they are (asdict would turn a nested ReplicaGroup into a dict)
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})

    def shutdown(self) -> None:
        """Stop the worker ranks of a tensor/pipeline-parallel engine (they also exit with this process)."""
        if self._engine is not None:
            self._engine.executor.shutdown()
        if self.tracer is not None:
            self.tracer.shutdown()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def sleep(self, level: int = 1) -> None:
        """vLLM's: with enable_sleep_mode, give the KV cache (level 1) or the weights too (level 2) back."""
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM's: make what `tags` name ("weights", "kv_cache"; default both) again."""
        self.engine.wake_up(tags)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Outputs in the order of the prompts; `lora_request` (one, or one per prompt) needs enable_lora=True."""
        single = isinstance(prompts, (str, dict)) or is_token_ids(prompts)
        batch = [self._engine_prompt(p) for p in ([prompts] if single else list(prompts))]
        params_list = per_prompt(sampling_params or SamplingParams(), len(batch), "sampling params")
        loras = per_prompt(lora_request, len(batch), "lora requests")
        return self._run(batch, params_list, loras)  # type: ignore[return-value]

    def _run(self, batch: list[Any], params_list: list[Any], loras: list[Any]) -> list[Any]:
        """Every request queued (none left behind when one is refused), stepped to the end, outputs in order."""
        order = []
        for prompt, params, lora in zip(batch, params_list, loras):
            request_id = str(next(self._ids))
            try:
                self.engine.add_request(request_id, prompt, params, lora)
            except Exception:  # nothing of a call that failed stays queued
                for queued in order:
                    self.engine.abort(queued)
                raise
            order.append(request_id)
        finished: dict[str, Any] = {}
        while self.engine.has_unfinished_requests:
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
        if self.tracer is not None:
            for rid, params in zip(order, params_list):
                if isinstance(params, SamplingParams):  # generation requests, as the server traces
                    self.tracer.record(finished[rid], params)
        return [finished[rid] for rid in order]

    def _engine_prompt(self, prompt: Prompt) -> str | list[int] | ProcessedPrompt:
        """vLLM's {"prompt", "multi_modal_data": {"image": …}, "mm_processor_kwargs"} through the model's
        processor; every other form as text or token ids."""
        if not isinstance(prompt, dict) or "multi_modal_data" not in prompt:
            return _plain_prompt(prompt)
        data, kwargs = prompt["multi_modal_data"], prompt.get("mm_processor_kwargs")
        unknown = sorted(set(prompt) - {"prompt", "multi_modal_data", "mm_processor_kwargs"})
        if unknown or not isinstance(prompt.get("prompt"), str) or not isinstance(data, dict):
            raise ValueError("a multimodal prompt is {'prompt': text, 'multi_modal_data': {'image': image or list}, "
                             f"'mm_processor_kwargs': optional dict}}; got the keys {sorted(prompt)}")
        if set(data) - {"image"}:
            raise ValueError(f"multi_modal_data: llmctl takes images only, got {sorted(data)}")
        processor = self.engine.multimodal
        if processor is None:
            raise ValueError("this model takes no images (a text model, or served with --limit-mm-per-prompt "
                             "'{\"image\": 0}')")
        images = data.get("image", [])
        return processor.process(prompt["prompt"], images if isinstance(images, list) else [images], kwargs)

    def beam_search(self, prompts: Sequence[Prompt], params: BeamSearchParams) -> list[RequestOutput]:
        """vLLM's LLM.beam_search, one RequestOutput per prompt (its beams as outputs, best first)."""
        tokenizer = self.engine.tokenizer
        searches = [BeamSearch(self.engine.tokenize(_plain_prompt(p))[1], params, tokenizer.eos_token_id)
                    for p in prompts]
        while live := [search for search in searches if not search.done]:
            steps = self.generate([beam.tokens for search in live for beam in search.beams], params.step_params())
            for search in live:
                search.advance([alternatives_of(steps.pop(0)) for _ in search.beams])
        return [search.output(str(next(self._ids)), tokenizer, None) for search in searches]


def _plain_prompt(prompt: Prompt) -> str | list[int]:
    """Text or token ids, from any of the forms vLLM's LLM.generate takes."""
    if not isinstance(prompt, dict):
        return prompt
    if set(prompt) == {"prompt_token_ids"} and is_token_ids(list(prompt["prompt_token_ids"])):
        return list(prompt["prompt_token_ids"])
    if set(prompt) == {"prompt"} and isinstance(prompt["prompt"], str):
        return prompt["prompt"]
    raise ValueError(f"a prompt dict takes exactly one of 'prompt' (text) or 'prompt_token_ids' (token ids); "
                     f"got the keys {sorted(prompt)}")
