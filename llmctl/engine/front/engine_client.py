"""EngineClient: everything the API server may ask of an engine. AsyncLLMEngine (one engine)
and DataParallelEngine (replicas behind one server) both implement it; the server holds
nothing else of the engine (as vLLM's serving layer talks to its EngineClient)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from llmctl.checkpoint.source import ModelSource
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.stats import EngineStats
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.multimodal.items import EnginePrompt
from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.params import PoolingParams, PoolingRequestOutput
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.structured.params import StructuredOutputsParams


class EngineClient(Protocol):
    @property
    def tokenizer(self) -> Any: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def source(self) -> ModelSource: ...

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def is_running(self) -> bool: ...

    @property
    def pooler(self) -> PoolerConfig | None: ...  # a pooling model's pooler (llmctl.engine.pooling); None: it generates

    def generate(self, prompt: EnginePrompt, params: SamplingParams, request_id: str | None = None,
                 lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]: ...

    def encode(self, prompt: str | list[int], params: PoolingParams,
               request_id: str | None = None) -> AsyncIterator[PoolingRequestOutput]: ...  # one output, finished

    def abort(self, request_id: str) -> None: ...

    def check_structured_outputs(self, params: StructuredOutputsParams) -> None: ...  # InvalidRequestError if bad

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]: ...

    def stats(self) -> list[EngineStats]: ...  # one per replica

    def add_lora(self, lora_request: LoRARequest) -> None: ...  # into every replica

    def remove_lora(self, lora_int_id: int) -> None: ...

    def lost_workers(self) -> str | None: ...  # why worker ranks are gone for good, or None

    def shutdown(self, timeout: float = 10.0) -> None: ...
