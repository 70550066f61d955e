"""LLMEngine: requests in, one scheduled step at a time, incremental outputs out.

A step reads schedule → execute → update → output: the scheduler picks the sequences, the
executor runs the model, the step sampler turns logits into tokens, the scheduler's
update_from_output appends them and decides what finished, and the output processor makes
the RequestOutputs. With pipeline parallelism up to PP batches are in flight."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import torch

from llmctl.engine.config import EngineConfig
from llmctl.engine.core.batch import build_batch
from llmctl.engine.core.block_manager import BlockManager
from llmctl.engine.core.host_tier import HostTier
from llmctl.engine.core.scheduler import Scheduler, SchedulerOutput
from llmctl.engine.core.sequence import Sequence, SequenceStatus
from llmctl.engine.core.step_messages import SampledTokens, StepBatch, StepLogits
from llmctl.engine.core.table_updates import TableRows
from llmctl.engine.errors import (
    DeviceFailedError,
    EngineConfigError,
    InvalidRequestError,
    ModelAsleepError,
    SleepConflictError,
    StepFailedError,
    WorkerLostError,
)
from llmctl.engine.executor.executor import Executor, create_executor
from llmctl.engine.front.input_processor import InputProcessor
from llmctl.engine.front.output_processor import OutputProcessor
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.front.stats import EngineStats, snapshot
from llmctl.engine.front.step_timer import StepTimer
from llmctl.engine.lora.adapter import LoRAAdapter
from llmctl.engine.lora.manager import LoRAManager
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.multimodal.encoder_budget import EncoderScheduler
from llmctl.engine.multimodal.items import EnginePrompt
from llmctl.engine.multimodal.processor import multimodal_processor
from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.params import PoolingParams
from llmctl.engine.reasoning import ReasoningParserManager
from llmctl.engine.sample.step_sampler import StepSampler
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.spec_decode.speculator import Speculator
from llmctl.engine.structured.manager import StructuredOutputManager
from llmctl.engine.worker.loaded_model import LoadedModel
from llmctl.engine.worker.sleep import Sleeper
from llmctl.logs import configure_logging

logger = logging.getLogger("llmctl.engine")


def is_sticky_device_error(exc: BaseException) -> bool:
    """An error of the CUDA context itself (not an out-of-memory, which leaves the context usable)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)  # torch ≥ 2.8 raises it for CUDA errors
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    text = str(exc)  # a worker rank's error arrives as text
    return any(marker in text for marker in ("CUDA error", "device-side assert", "illegal memory access"))


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        config = config or EngineConfig(**overrides)
        config.validate()
        configure_logging()
        self.config = config
        self.executor: Executor = create_executor(config)
        self.loaded: LoadedModel = self.executor.loaded
        self.tokenizer = self.loaded.tokenizer
        self.max_model_len = self.loaded.max_model_len
        switch = self.loaded.spec.positional.long_rope_switch
        self.stateful = self.loaded.states is not None  # recurrent layers (Mamba2): a state slot per sequence
        self.block_manager = block_manager(config, self.loaded)
        self.table_rows = TableRows()  # each live sequence's row in the workers' block tables
        max_num_seqs = self.loaded.states.slots if self.loaded.states else config.max_num_seqs  # a slot each
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, self.loaded.max_num_batched_tokens,
                                   max_loras=config.max_loras if config.enable_lora else 0,
                                   eos_token_ids=self.loaded.eos_token_ids, max_model_len=self.max_model_len,
                                   rope_switch_length=switch, scheduling_policy=config.scheduling_policy,
                                   chunked_prefill=config.enable_chunked_prefill)
        self.lora = LoRAManager(self.loaded.spec, self.loaded.lora_slots, config.max_loras, config.max_lora_rank,
                                self.loaded.dtype) if config.enable_lora else None
        self.load_unknown_adapters = True  # offline: a new LoRARequest is read on first use; a server registers them
        self.input_processor = InputProcessor(self.tokenizer, self.loaded.spec.vocab_size, self.max_model_len,
                                              self.loaded.generation_defaults, config.max_logprobs)
        self.output_processor = OutputProcessor(self.tokenizer, self.loaded.pooler)
        self.pooler = self.loaded.pooler  # a pooling model: it takes PoolingParams, not SamplingParams
        self.scheduler.pool_whole_prompts = self.pooler is not None and self.pooler.whole_prompt
        self.multimodal = multimodal_processor(self.loaded.source.path, self.loaded.spec.model_type,
                                               config.multimodal, self.loaded.hf_config)
        if self.multimodal is not None:  # vLLM's default encoder budget: the step's token budget
            self.scheduler.encoder = EncoderScheduler(self.loaded.max_num_batched_tokens)
        generator = torch.Generator().manual_seed(config.seed)
        self.speculator = Speculator.create(config, self.loaded, generator)
        if self.speculator is not None and self.speculator.hidden is not None and hasattr(self.executor, "capture_again"):
            self.executor.capture_again(config)  # the target's graphs now keep the hidden states the head reads
        self.structured = StructuredOutputManager(
            self.tokenizer, self.loaded.spec.vocab_size, self.loaded.eos_token_ids,
            config.structured_outputs,
            *reasoning_marker_ids(config.reasoning_parser, self.tokenizer))
        self.sampler = StepSampler(self.loaded.eos_token_ids, generator, self.output_processor.new_sibling,
                                   self.speculator, self.structured)
        if self.speculator is not None:
            logger.info("speculative decoding: %s", self.speculator.describe())
        self.in_flight: deque[tuple[int, SchedulerOutput, list[Sequence]]] = deque()  # (lane, ...) submitted
        self._next_lane = 0
        # async scheduling: the next step is submitted while one runs (not across LongRoPE's recomputation)
        self.overlaps = getattr(self.executor, "overlaps", False) and switch is None
        self.steps_ahead = 0  # steps submitted while the one before still ran
        self.step_timer = StepTimer(config.collect_detailed_traces or (), self.loaded.device) \
            if config.collect_detailed_traces else None
        if self.overlaps:
            logger.info("async scheduling: model steps run on their own thread, the next scheduled while one runs "
                        "(steps with grammars, penalties or bad words wait for their tokens)")
            if self.loaded.device.type == "cpu":  # the "device" is these cores: the scheduler takes from them
                logger.warning("async scheduling on CPUs slows decoding: the scheduler's thread competes with the "
                               "model's for the same cores (SmolLM2 on a 2-core Zen 4: 0.6-0.8x the tokens per "
                               "second of one stream, docs/engine.md); it is for GPUs")
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny request through every code path, so the first real request is not the slow one."""
        started = time.perf_counter()
        params = PoolingParams() if self.pooler is not None else \
            SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        self.add_request("llmctl-warm-up", [0] * 8, params)
        while self.has_unfinished_requests:
            self.step()
        self.scheduler.reset_stats()
        if self.speculator is not None:
            self.speculator.reset_stats()
        logger.info("warm-up took %.2f s", time.perf_counter() - started)

    # -- requests -------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        return self.input_processor.tokenize(prompt)

    def add_request(self, request_id: str, prompt: EnginePrompt, params: SamplingParams | PoolingParams | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        if self.is_sleeping:
            raise ModelAsleepError("the model is asleep (sleep mode): wake it up first (POST /wake_up, LLM.wake_up())")
        if request_id in self.output_processor.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        if isinstance(params, PoolingParams) != (self.pooler is not None):
            raise InvalidRequestError(_runner_mismatch(self.pooler), "model")
        if isinstance(params, PoolingParams):
            request = self.input_processor.process_pooling(request_id, self._text_or_ids(prompt), params,
                                                           self.pooler, self.loaded.max_num_batched_tokens)
        else:
            request = self.input_processor.process(request_id, prompt, params, lora=None)
        request.lora = self._adapter(lora_request)
        if request.params.structured_outputs is not None:
            request.grammar = self.structured.matcher(request.params.structured_outputs, request.prompt_token_ids)
        first = self.output_processor.add(request)
        loads = self.scheduler.lane_loads(self.executor.max_in_flight) if self.executor.max_in_flight > 1 else [0]
        first.lane = loads.index(min(loads))
        first.waiting_to_fork = request.params.n > 1 and not self.stateful
        self.scheduler.add(first)
        if request.params.n > 1 and self.stateful:  # each its own state: n sequences, each computing the prompt
            for index in range(1, request.params.n):
                sibling = self.output_processor.new_sibling(first, index)
                sibling.lane = first.lane
                self.scheduler.add(sibling)

    @staticmethod
    def _text_or_ids(prompt: EnginePrompt) -> str | list[int]:
        if not isinstance(prompt, (str, list)):
            raise InvalidRequestError("a pooling request takes text or token ids, not images", "input")
        return prompt

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks."""
        request = self.output_processor.pop(request_id)
        if request is not None:
            self.scheduler.abort(request.seqs)

    @property
    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_requests or bool(self.in_flight)

    # -- sleep mode (vLLM's sleep / wake_up / is_sleeping; llmctl.engine.worker.sleep) -------
    def sleep(self, level: int = 1) -> int:
        """Give memory back until wake_up: level 1 the KV cache, level 2 the weights too; returns the bytes."""
        sleeper = self._sleeper()
        if self.has_unfinished_requests:
            raise SleepConflictError(f"{len(self.output_processor.requests)} requests are running: sleep when they "
                                     "have finished (or abort them)")
        self.block_manager.reset_prefix_cache()  # the cached blocks' K/V is given back with the pool
        return sleeper.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._sleeper().wake_up(tags)

    @property
    def is_sleeping(self) -> bool:
        sleeper = getattr(self.executor, "sleeper", None)
        return sleeper is not None and sleeper.is_sleeping

    def _sleeper(self) -> Sleeper:
        sleeper = getattr(self.executor, "sleeper", None)
        if sleeper is None:
            raise EngineConfigError("sleep mode is off: start with --enable-sleep-mode (LLM(enable_sleep_mode=True))")
        return sleeper

    # -- adapters (vLLM's add_lora / remove_lora / list_loras) ---------------------------
    def add_lora(self, lora_request: LoRARequest) -> None:
        """Read, check and register an adapter before requests use it (the error says what does not fit)."""
        self._lora_manager().add(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.lora is not None and self.lora.remove(lora_int_id)

    def list_loras(self) -> set[int]:
        return set(self.lora.registered) if self.lora is not None else set()

    def _adapter(self, lora_request: LoRARequest | None) -> LoRAAdapter | None:
        if lora_request is None:
            return None
        return self._lora_manager().adapter_for(lora_request, load=self.load_unknown_adapters)

    def _lora_manager(self) -> LoRAManager:
        if self.lora is None:
            raise InvalidRequestError("this engine was started without LoRA: pass enable_lora=True (llmctl serve "
                                      "--enable-lora) to run adapters", "lora_request")
        return self.lora

    # -- one step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns an output for every request that advanced."""
        if self.overlaps:
            self._submit_ahead()
        else:
            self._fill_pipeline()
        if not self.in_flight:
            return self._idle()
        _, sched, sample_seqs = self.in_flight.popleft()
        result = self._collect(sched)
        sampled = self.sampler.sample_step(sched, result, sample_seqs)
        if self.step_timer is not None:
            self.step_timer.executed(sched)
        touched = self.scheduler.update_from_output(sched, sampled, self.output_processor, result.pooled)
        if self.speculator is not None:
            self._propose(sched)
        return self.output_processor.outputs(touched)

    def _idle(self) -> list[RequestOutput]:
        """Nothing could be scheduled: a waiting request that can never fit is finished early."""
        if self.scheduler.is_stuck():
            seq = self.scheduler.fail_unschedulable()
            logger.warning("request %s needs more KV blocks than the cache has; finished early", seq.request_id)
        return self.output_processor.outputs(self.output_processor.finished_request_ids())

    def _fill_pipeline(self) -> None:
        """Submit batches until every lane has one in flight (one lane without pipeline parallelism)."""
        lanes = self.executor.max_in_flight
        tried = 0
        while len(self.in_flight) < lanes and tried < lanes:
            lane, self._next_lane = self._next_lane, (self._next_lane + 1) % lanes
            tried += 1
            if any(busy == lane for busy, _, _ in self.in_flight):
                continue  # its previous batch has not come back
            sched = self.scheduler.schedule(lane)
            if sched.empty:
                continue
            tried = 0
            self._submit(lane, sched)

    def _submit_ahead(self) -> None:
        """Async scheduling: a step when none runs; while one runs whose tokens the next needs only as inputs,
        the next one too (llmctl.engine.executor.overlap)."""
        if not self.in_flight:
            sched = self.scheduler.schedule()
            if not sched.empty:
                self._submit(0, sched)
        if len(self.in_flight) != 1:
            return
        _, running, sample_seqs = self.in_flight[0]
        if running.advanced and all(_samples_blind(seq) for seq in sample_seqs):
            sched = self.scheduler.schedule(ahead=True)
            if not sched.empty:
                self._submit(0, sched, {seq.seq_id: row for row, seq in enumerate(sample_seqs)})
                self.steps_ahead += 1

    def _submit(self, lane: int, sched: SchedulerOutput, pending_rows: dict[int, int] | None = None) -> None:
        now = sched.submitted_at = time.perf_counter()
        for item in sched.scheduled:
            item.seq.timings.first_scheduled = item.seq.timings.first_scheduled or now
        lora_slots = self.lora.activate([item.seq for item in sched.scheduled]) if self.lora else None
        self.table_rows.release(self.block_manager.freed_seq_ids)
        batch, sample_seqs = build_batch(sched, self.config.block_size, lora_slots, self.table_rows, pending_rows)
        if self.executor.samples_on_last_stage and _samples_plainly(sched, batch, sample_seqs):
            batch.sampling = [self.sampler.sample_input(seq) for seq in sample_seqs]
            if self.overlaps:
                self.scheduler.advance(sched)
        else:
            drafted = {item.seq.seq_id for item in sched.scheduled if item.draft is not None}
            self.sampler.prefetch_bitmasks([seq for seq in sample_seqs if seq.seq_id not in drafted])
        forward_started = time.perf_counter()
        try:
            self.executor.submit(batch)
        except WorkerLostError:
            raise
        except Exception as exc:
            raise self._fail_step(sched, exc) from exc
        if self.step_timer is not None:
            self.step_timer.forward_done(sched, forward_started)
        if self.speculator is not None:
            self.speculator.observe(batch, sched)
        self.in_flight.append((lane, sched, sample_seqs))

    def _collect(self, sched: SchedulerOutput) -> StepLogits | SampledTokens:
        try:
            return self.executor.collect()
        except WorkerLostError:
            raise
        except Exception as exc:  # fail this step's requests only; the engine and the others go on
            raise self._fail_step(sched, exc) from exc

    def _propose(self, sched: SchedulerOutput) -> None:
        """Proposals for the next step of this step's sequences (speculative decoding)."""
        seqs = [item.seq for item in sched.scheduled if item.seq.status == SequenceStatus.RUNNING]
        self.speculator.propose(seqs, self.scheduler.num_running, self.block_manager)

    def _fail_step(self, sched: SchedulerOutput, exc: Exception) -> StepFailedError:
        if is_sticky_device_error(exc):
            logger.critical("a CUDA error in a model step leaves the GPU unusable; the engine stops: %s", exc)
            raise DeviceFailedError(f"the GPU failed in a model step ({type(exc).__name__}: {exc}); restart the "
                                    "server") from exc
        request_ids = sorted({item.seq.request_id for item in sched.scheduled})
        for request_id in request_ids:
            self.abort(request_id)
        logger.error("a model step failed (%s: %s); its requests %s were aborted", type(exc).__name__, exc,
                     ", ".join(request_ids), exc_info=exc)
        return StepFailedError(request_ids, exc)

    def stats(self) -> EngineStats:
        """A snapshot of the counters and queues (safe to call from another thread)."""
        max_loras = self.config.max_loras if self.lora is not None else 0
        return snapshot(self.scheduler, self.speculator.stats if self.speculator else None, max_loras)


def block_manager(config: EngineConfig, loaded: LoadedModel) -> BlockManager:
    """The KV pool's blocks, its KV groups, and the recurrent layers' state slots; prefix caching unless a token's
    K/V depends on its sequence's length (LongRoPE) or recurrent layers keep a state per sequence, not per block."""
    long_rope = loaded.spec.positional.long_rope_switch is not None
    caching = config.enable_prefix_caching and not long_rope and loaded.states is None
    if config.enable_prefix_caching and long_rope:
        logger.info("prefix caching is off: with LongRoPE a token's keys depend on its sequence's length")
    elif config.enable_prefix_caching and loaded.states is not None:
        logger.info("prefix caching is off: the recurrent layers' state is kept per sequence, not per block "
                    "(as vLLM without --mamba-cache-mode align)")
    host = HostTier(loaded.host_kv.num_blocks, loaded.host_kv.model_block_bytes) if loaded.host_kv is not None else None
    return BlockManager(loaded.kv_pool.num_blocks, config.block_size, caching, group_windows=loaded.kv_groups.windows,
                        state_slots=loaded.states.slots if loaded.states is not None else 0, host=host)


def _runner_mismatch(pooler: PoolerConfig | None) -> str:
    if pooler is None:
        return "this model generates text: pooling requests (embeddings, scores, classes) need a pooling model"
    return f"this model runs as a pooling model ({pooler.describe()}): it serves no text generation"


def _samples_plainly(sched: SchedulerOutput, batch: StepBatch, sample_seqs: list[Sequence]) -> bool:
    """A step whose sampling a pipeline's last stage can do from the batch alone: one row per sequence,
    no prompt log-probabilities, no proposals to verify, no n > 1 request forking at its first token."""
    return not batch.prompt_rows and len(batch.sample_rows) == len(sample_seqs) \
        and all(item.draft is None for item in sched.scheduled) and not any(seq.waiting_to_fork for seq in sample_seqs)


def _samples_blind(seq: Sequence) -> bool:
    """Whether the sequence's next sampling inputs are known before its last token is (async scheduling): not
    with a grammar's mask, penalties over the tokens so far or bad words that end in the last one."""
    params = seq.params
    return seq.grammar is None and not params.bad_words_token_ids and not params.presence_penalty \
        and not params.frequency_penalty and (params.repetition_penalty or 1.0) == 1.0


def reasoning_marker_ids(parser_name: str | None, tokenizer: Any) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """The tokens that end a reasoning model's thinking (its parser's end marker; None without a parser) and
    those that start it."""
    if parser_name is None:
        return None, ()
    parser = ReasoningParserManager.get_reasoning_parser(parser_name)
    return tuple(tokenizer.encode(parser.end_token, add_special_tokens=False)), \
        tuple(tokenizer.encode(parser.start_token, add_special_tokens=False))
