"""The server's settings (from the command line) and its state (built at startup)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmctl.engine.config import EngineConfig
from llmctl.engine.front.embedding import EmbeddingModel
from llmctl.engine.front.encoder_classifier import EncoderClassifier
from llmctl.engine.front.engine_client import EngineClient
from llmctl.engine.front.stats import EngineStats
from llmctl.engine.front.tracing import RequestTracer
from llmctl.engine.multimodal.processor import MultimodalProcessor
from llmctl.engine.reasoning import ReasoningParser, ReasoningParserManager
from llmctl.server.admission import InFlight
from llmctl.server.lora import LoRAModulePath, ServedAdapters
from llmctl.server.media import MediaPolicy
from llmctl.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from llmctl.server.tool_parsers import ToolParser


@dataclass
class ServerSettings:
    engine_config: EngineConfig
    served_model_names: list[str]
    api_key: str | None = None
    chat_template: str | None = None  # Jinja source; None: the model's own
    max_queue_len: int | None = None  # sequences beyond max_num_seqs that may wait
    max_request_bytes: int = 16 * 1024**2  # larger bodies get 413
    body_timeout: float = 30.0  # seconds a client may take to send its request body (408 after)
    metrics_auth: bool = False  # with api_key: /metrics needs the key too
    allowed_origins: list[str] = field(default_factory=list)  # CORS: off unless origins are given
    access_log: bool = True  # one access-log line per request
    log_requests: bool = False  # vLLM's --enable-log-requests: each generation request's prompt and parameters
    max_log_len: int | None = None  # characters of a logged prompt (None: all)
    stats_interval: float | None = 10.0  # seconds between engine stats lines; None: off
    lora_modules: list[LoRAModulePath] = field(default_factory=list)  # adapters served from startup (--enable-lora)
    allow_runtime_lora_updating: bool = False  # /v1/load_lora_adapter and /v1/unload_lora_adapter
    tool_parser: type[ToolParser] | None = None  # --enable-auto-tool-choice with --tool-call-parser: tool_choice auto
    metrics_prefix: str = "llmctl"  # /metrics names: llmctl:… or vLLM's vllm:…

    @property
    def media(self) -> MediaPolicy:
        """Where image URLs may point (--allowed-local-media-path, --allowed-media-domains)."""
        config = self.engine_config
        local = Path(config.allowed_local_media_path) if config.allowed_local_media_path else None
        return MediaPolicy(local, tuple(d.lower() for d in config.allowed_media_domains or ()))


@dataclass
class ServerState:
    settings: ServerSettings
    adapters: ServedAdapters = field(init=False)  # LoRA adapters by name
    in_flight: InFlight = field(init=False)  # the queue limit
    metrics: ServerMetrics = field(init=False)
    tracer: RequestTracer | None = field(init=False)  # --otlp-traces-endpoint
    engine: EngineClient | None = None
    encoder: EmbeddingModel | EncoderClassifier | None = None  # an encoder model, served through transformers
    template: str | None = None  # the chat template, resolved once at startup
    multimodal: MultimodalProcessor | None = None  # a vision-language model's processor, when images are served
    harmony: bool = False  # gpt-oss: chats rendered and read in harmony (llmctl.server.harmony_prompt)
    load_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    # Engine ids stay unique when clients reuse an X-Request-Id: the response id is theirs, the engine's is ours.
    engine_ids: Iterator[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        settings = self.settings
        self.adapters = ServedAdapters(settings.served_model_names)
        self.in_flight = InFlight(settings.engine_config.max_num_seqs, settings.max_queue_len)
        self.metrics = ServerMetrics(self.engine_stats, self.model_name, settings.metrics_prefix)
        endpoint = settings.engine_config.otlp_traces_endpoint
        self.tracer = RequestTracer(endpoint, self.model_name) if endpoint else None

    def engine_stats(self) -> list[EngineStats]:
        return self.engine.stats() if self.engine is not None else []

    @property
    def model_name(self) -> str:
        return self.settings.served_model_names[0]

    @property
    def structured_backend(self) -> str:
        """The structured-output backend the engine was started with (auto, xgrammar or guidance)."""
        config = self.settings.engine_config
        return config.structured_outputs.backend

    @property
    def reasoning_parser(self) -> type[ReasoningParser] | None:
        """--reasoning-parser; a harmony model's output is read in harmony without one (vLLM's gpt-oss path)."""
        name = self.settings.engine_config.reasoning_parser
        if name is None and self.harmony:
            name = "openai_gptoss"
        return ReasoningParserManager.get_reasoning_parser(name) if name is not None else None

    @property
    def tool_parser(self) -> type[ToolParser] | None:
        return self.settings.tool_parser

    @property
    def ready_engine(self) -> EngineClient:
        """The engine, for handlers that run only once it is up (app.guarded checks first)."""
        assert self.engine is not None, "handlers run only when the engine is ready"
        return self.engine
