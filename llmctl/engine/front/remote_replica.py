"""A data-parallel replica whose LLMEngine runs elsewhere — its own process (`--data-parallel-backend mp`) or
a Ray actor (`ray`) — and the stand-in the API server drives instead of a local engine.

`ReplicaServer` is the remote side: an LLMEngine and the calls the API server makes of it.
`RemoteReplicaEngine` is the LLMEngine surface AsyncLLMEngine uses, each call one round trip to the
server, in order; a transport implements `_invoke`. A replica whose process, actor or node is gone raises
WorkerLostError from its next call.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import WorkerLostError
from llmctl.engine.front.output_deltas import DeltaDecoder, DeltaEncoder, OutputDelta
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.stats import EngineStats
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.multimodal.items import EnginePrompt
from llmctl.engine.sampling_params import SamplingParams


class ReplicaServer:
    """The remote side: an LLMEngine and the calls the API server makes of it."""

    def __init__(self, config: EngineConfig) -> None:
        from llmctl.engine.front.llm_engine import LLMEngine

        self.engine = LLMEngine(config)
        self.deltas = DeltaEncoder()  # outputs go back as what is new

    def facts(self) -> tuple[Any, Any, Any, int, Any]:
        loaded = self.engine.loaded
        return self.engine.tokenizer, loaded.source, loaded.spec, self.engine.max_model_len, self.engine.pooler

    def add_request(self, request_id: str, prompt: EnginePrompt, params: SamplingParams | None,
                    lora_request: LoRARequest | None) -> None:
        self.engine.add_request(request_id, prompt, params, lora_request)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self.deltas.forget(request_id)

    def step(self) -> tuple[list[OutputDelta], bool]:
        """What the step's outputs add, and whether requests remain (so the next loop needs no call to ask)."""
        return self.deltas.encode(self.engine.step()), self.engine.has_unfinished_requests

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests

    def load_unknown_adapters(self, load: bool) -> None:
        self.engine.load_unknown_adapters = load

    def call(self, name: str, *args: Any) -> Any:
        """stats, tokenize, add_lora, remove_lora, and the structured-output check."""
        if name == "check_structured_outputs":
            return self.engine.structured.matcher(*args) and None
        return getattr(self.engine, name)(*args)

    def shutdown(self) -> None:
        self.engine.executor.shutdown()


class RemoteReplicaEngine:
    """The LLMEngine surface AsyncLLMEngine uses, over a ReplicaServer reached by `_invoke`."""

    def __init__(self) -> None:
        self._lost: str | None = None
        self._last_stats: EngineStats | None = None
        self._load_unknown = True  # the remote engine's default (offline: a new LoRARequest is read on first use)
        self._unfinished: bool | None = None  # whether the replica has requests left, as its last answer said
        self._outputs = DeltaDecoder()
        self.structured = SimpleNamespace(matcher=lambda params: self._call("check_structured_outputs", params))
        self.executor = SimpleNamespace(healthy=self._healthy, shutdown=self._shutdown)

    def _invoke(self, method: str, *args: Any) -> Any:
        """ReplicaServer.method(*args) on the remote side: its result, its own errors as they are, and
        WorkerLostError (with self._lost set) when the replica is gone."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    def _take_facts(self) -> None:
        """The model's facts, once the replica has loaded it."""
        self.tokenizer, source, spec, self.max_model_len, self.pooler = self._invoke("facts")
        self.loaded = SimpleNamespace(source=source, spec=spec)

    def _call(self, name: str, *args: Any) -> Any:
        return self._invoke("call", name, *args)

    @property
    def load_unknown_adapters(self) -> bool:
        return self._load_unknown

    @load_unknown_adapters.setter
    def load_unknown_adapters(self, load: bool) -> None:
        """A server sets it off (only registered adapters run): the remote engine is told."""
        self._load_unknown = load
        self._invoke("load_unknown_adapters", load)

    def add_request(self, request_id: str, prompt: EnginePrompt, params: SamplingParams | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        self._invoke("add_request", request_id, prompt, params, lora_request)
        self._unfinished = True

    def abort(self, request_id: str) -> None:
        self._invoke("abort", request_id)
        self._outputs.forget(request_id)
        self._unfinished = None  # it may have been the last one

    def step(self) -> list[RequestOutput]:
        deltas, self._unfinished = self._invoke("step")
        return self._outputs.decode(deltas)

    @property
    def has_unfinished_requests(self) -> bool:
        """From the last step's answer where it is known: one round trip per step, not two."""
        if self._unfinished is None:
            self._unfinished = self._invoke("has_unfinished_requests")
        return self._unfinished

    def stats(self) -> EngineStats:
        """The replica's counters; once it is lost, the last ones read with nothing running or waiting, so
        /metrics keeps each replica's label and its counters never go back."""
        if self._lost is None:
            try:
                self._last_stats = self._call("stats")
                return self._last_stats
            except WorkerLostError:
                pass
        last = self._last_stats or EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0)
        return dataclasses.replace(last, num_running=0, num_waiting=0, kv_cache_usage=0.0)

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        return self._call("tokenize", prompt)

    def add_lora(self, lora_request: LoRARequest) -> None:
        self._call("add_lora", lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self._call("remove_lora", lora_int_id)

    def _healthy(self) -> bool:
        return self._lost is None
