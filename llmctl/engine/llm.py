"""LLM: offline batch generation, `from llmctl import LLM, SamplingParams`."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from llmctl.engine.config import EngineConfig
from llmctl.engine.llm_engine import LLMEngine
from llmctl.engine.outputs import RequestOutput
from llmctl.engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Load a model once, then generate for many prompts with continuous batching."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self._ids = itertools.count()

    def shutdown(self) -> None:
        """Stop the worker ranks of a tensor/pipeline-parallel engine (they also exit with this process)."""
        self.engine.executor.shutdown()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Outputs in the order of the prompts."""
        batch = [prompts] if isinstance(prompts, str) or _is_token_ids(prompts) else list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(batch)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(batch):
                raise ValueError(f"{len(params_list)} sampling params for {len(batch)} prompts")
        order = []
        for prompt, params in zip(batch, params_list):
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, prompt, params)
            order.append(request_id)
        finished: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests:
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
        return [finished[rid] for rid in order]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) for t in value)
