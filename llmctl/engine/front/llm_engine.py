"""LLMEngine: requests in, one scheduled step at a time, incremental outputs out."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from llmctl.engine.core.block_manager import BlockManager, PrefixCacheStats
from llmctl.engine.config import EngineConfig
from llmctl.engine.front.detokenizer import IncrementalDetokenizer
from llmctl.engine.worker.loader import LoadedModel
from llmctl.engine.lora.adapter import LoRAAdapter
from llmctl.engine.lora.manager import LoRAManager
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.front.outputs import CompletionOutput, RequestMetrics, RequestOutput
from llmctl.engine.parallel.executor import Executor, WorkerLostError, create_executor, sliding_window
from llmctl.engine.worker.model_runner import SampledTokens, StepBatch, StepResult, build_batch
from llmctl.engine.core.sampler import SampleInput, prompt_logprob_entries, sample
from llmctl.engine.sampling_params import InvalidRequestError, SamplingParams
from llmctl.engine.core.scheduler import Scheduler, SchedulerOutput
from llmctl.engine.core.sequence import Sequence, SequenceStatus, TokenLogprob
from llmctl.engine.spec_decode.proposal import Draft
from llmctl.engine.spec_decode.rejection import VerifyInput, verify
from llmctl.engine.spec_decode.speculator import Speculator

logger = logging.getLogger("llmctl.engine")


def configure_logging() -> None:
    """INFO lines on stderr, as vLLM prints its startup log, unless the application set up logging."""
    package = logging.getLogger("llmctl")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", datefmt="%m-%d %H:%M:%S"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)


class StepFailedError(RuntimeError):
    """A model step raised: its requests were aborted (blocks freed); other requests are unaffected."""

    def __init__(self, request_ids: list[str], cause: Exception) -> None:
        super().__init__(f"the model step failed: {type(cause).__name__}: {cause}")
        self.request_ids = request_ids


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)
    detokenizers: dict[int, IncrementalDetokenizer] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)  # seq_id -> text after stop handling
    stop_searched: dict[int, int] = field(default_factory=dict)  # seq_id -> text length already searched
    lora: LoRAAdapter | None = None

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)


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
        self.block_manager = BlockManager(self.loaded.kv_pool.num_blocks, config.block_size,
                                          config.enable_prefix_caching, sliding_window(self.loaded))
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, self.loaded.max_num_batched_tokens,
                                   max_loras=config.max_loras if config.enable_lora else 0)
        self.lora = LoRAManager(self.loaded.spec, self.loaded.lora_slots, config.max_loras, config.max_lora_rank,
                                self.loaded.dtype) if config.enable_lora else None
        self.load_unknown_adapters = True  # offline: a new LoRARequest is read on first use; a server registers them
        self.in_flight: deque[tuple[int, SchedulerOutput, list[Sequence]]] = deque()  # (lane, ...) submitted
        self._next_lane = 0
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self._default_generator = torch.Generator().manual_seed(config.seed)
        self.eos_token_ids = self.loaded.eos_token_ids
        self.generation_defaults = self.loaded.generation_defaults
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0}
        self.speculator = Speculator.create(config, self.loaded, self._default_generator)
        if self.speculator is not None:
            logger.info("speculative decoding: %s", self.speculator.describe())
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny request through every code path, so the first real request is not the slow one."""
        started = time.perf_counter()
        self.add_request("llmctl-warm-up", [0] * 8, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        while self.has_unfinished_requests:
            self.step()
        self.block_manager.reset_prefix_cache()
        self.block_manager.stats = PrefixCacheStats()
        self.scheduler.num_preemptions = 0
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0}
        if self.speculator is not None:
            self.speculator.reset_stats()
        logger.info("warm-up took %.2f s", time.perf_counter() - started)

    # -- requests -------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        ids = [int(t) for t in prompt]
        vocab = self.loaded.spec.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab}); got {bad[:3]}", "prompt")
        return None, ids

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        text, ids = self.tokenize(prompt)
        params = (params or SamplingParams()).with_defaults(self.generation_defaults)
        self._check_lengths(ids, params)
        request = Request(request_id, text, ids, params, lora=self._adapter(lora_request))
        self.requests[request_id] = request
        first = self._new_sequence(request, index=0)
        first.lane = self._emptiest_lane()
        first.waiting_to_fork = params.n > 1
        self.scheduler.add(first)

    def _adapter(self, lora_request: LoRARequest | None) -> LoRAAdapter | None:
        if lora_request is None:
            return None
        return self._lora_manager().adapter_for(lora_request, load=self.load_unknown_adapters)

    def _lora_manager(self) -> LoRAManager:
        if self.lora is None:
            raise InvalidRequestError("this engine was started without LoRA: pass enable_lora=True (llmctl serve "
                                      "--enable-lora) to run adapters", "lora_request")
        return self.lora

    # -- adapters (vLLM's add_lora / remove_lora / list_loras) ---------------------------
    def add_lora(self, lora_request: LoRARequest) -> None:
        """Read, check and register an adapter before requests use it (the error says what does not fit)."""
        self._lora_manager().add(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.lora is not None and self.lora.remove(lora_int_id)

    def list_loras(self) -> set[int]:
        return set(self.lora.registered) if self.lora is not None else set()

    def _emptiest_lane(self) -> int:
        if self.executor.max_in_flight == 1:
            return 0
        load = [0] * self.executor.max_in_flight
        for seq in itertools.chain(self.scheduler.running, self.scheduler.waiting):
            load[seq.lane] += 1
        return load.index(min(load))

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

    def _new_sequence(self, request: Request, index: int) -> Sequence:
        seq = Sequence(seq_id=next(self._seq_ids), request_id=request.request_id, index=index,
                       prompt_token_ids=request.prompt_token_ids, params=request.params, lora=request.lora)
        if request.params.seed is not None:
            seq.generator = torch.Generator().manual_seed((request.params.seed + index) % 2**63)
        request.seqs.append(seq)
        request.detokenizers[seq.seq_id] = IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, request.params.skip_special_tokens)
        request.texts[seq.seq_id] = ""
        return seq

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self.in_flight)

    # -- one step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; returns an output for every request that advanced.

        With pipeline parallelism up to PP batches are in flight: this submits batches until
        the pipeline is full, then completes the oldest one."""
        self._fill_pipeline()
        if not self.in_flight:
            if self.scheduler.waiting and not self.scheduler.running:
                self._fail_unschedulable()
            return self._outputs({rid for rid, r in self.requests.items() if r.finished})
        _, sched, sample_seqs = self.in_flight.popleft()
        try:
            logits = self.executor.collect()
        except WorkerLostError:
            raise
        except Exception as exc:  # fail this step's requests only; the engine and the others go on
            raise self._fail_step(sched, exc) from exc
        chunk_starts = {item.seq.seq_id: (item.seq, item.seq.num_computed_tokens) for item in sched.scheduled}
        for item in sched.scheduled:
            if not item.seq.is_finished:  # aborted while its batch was in flight
                # Proposed tokens count as computed only once verified (_append_verified).
                item.seq.num_computed_tokens += item.num_new_tokens - item.num_draft_tokens
                self.block_manager.register_full_blocks(item.seq)
        if isinstance(logits, SampledTokens):  # the last pipeline stage sampled (batch.sampling)
            touched = self._append_sampled(sample_seqs, logits.tokens)
        else:
            result = StepResult(logits.sample_logits, logits.prompt_logits, sample_seqs)
            self._record_prompt_logprobs(result, chunk_starts)
            drafts = {item.seq.seq_id: item.draft for item in sched.scheduled if item.draft is not None}
            touched = self._sample_and_append(result, drafts)
        if self.speculator is not None:
            self._propose(sched)
        return self._outputs(touched)

    def _propose(self, sched: SchedulerOutput) -> None:
        """Proposals for the next step of this step's sequences (speculative decoding)."""
        seqs = [item.seq for item in sched.scheduled if item.seq.status == SequenceStatus.RUNNING]
        for seq in seqs:
            self.block_manager.trim(seq)  # blocks of rejected proposals
        self.speculator.propose(seqs, len(self.scheduler.running), self.block_manager)

    def _fill_pipeline(self) -> None:
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
            now = time.perf_counter()
            for item in sched.scheduled:
                item.seq.timings.first_scheduled = item.seq.timings.first_scheduled or now
            lora_slots = self.lora.activate([item.seq for item in sched.scheduled]) if self.lora else None
            batch, sample_seqs = build_batch(sched, self.config.block_size, lora_slots)
            if self.executor.samples_on_last_stage and _samples_plainly(sched, batch, sample_seqs):
                batch.sampling = [self._sample_input(seq) for seq in sample_seqs]
            try:
                self.executor.submit(batch)
            except WorkerLostError:
                raise
            except Exception as exc:
                raise self._fail_step(sched, exc) from exc
            if self.speculator is not None:
                self.speculator.observe(batch)
            self.in_flight.append((lane, sched, sample_seqs))

    def _outputs(self, request_ids: set[str]) -> list[RequestOutput]:
        outputs = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            outputs.append(self._output(request))
            if request.finished:
                del self.requests[rid]
        return outputs

    def _record_prompt_logprobs(self, result: StepResult, chunks: dict[int, tuple[Sequence, int]]) -> None:
        """Logits at position p score prompt token p + 1; entry 0 (no context) is None."""
        for seq_id, logits in result.prompt_logits.items():
            seq, chunk_start = chunks[seq_id]
            if not seq.prompt_logprobs:
                seq.prompt_logprobs.append(None)
            first_target = chunk_start + 1
            skip = len(seq.prompt_logprobs) - first_target  # already scored before a preemption
            if skip < 0:
                continue
            targets = seq.prompt_token_ids[first_target + skip:first_target + logits.shape[0]]
            seq.prompt_logprobs += prompt_logprob_entries(logits[skip:skip + len(targets)], targets,
                                                          seq.params.prompt_logprobs or 0)

    def _sample_and_append(self, result: StepResult, drafts: dict[int, Draft]) -> set[str]:
        inputs, seqs, rows = [], [], []
        verifying: list[tuple[Sequence, VerifyInput]] = []
        next_row = 0
        for seq in result.sample_seqs:
            row, draft = next_row, drafts.get(seq.seq_id)
            next_row += 1 + (len(draft.token_ids) if draft is not None else 0)
            request = self.requests.get(seq.request_id)
            if request is None or seq.is_finished:
                continue
            if draft is not None:
                verifying.append((seq, VerifyInput(seq.params, seq.generator or self._default_generator, draft, row)))
                continue
            family = [seq]
            if seq.waiting_to_fork:
                seq.waiting_to_fork = False
                for index in range(1, request.params.n):
                    child = self._new_sequence(request, index)
                    self.block_manager.fork(seq, child)
                    child.status = SequenceStatus.RUNNING
                    child.prompt_logprobs = list(seq.prompt_logprobs)
                    self.scheduler.running.append(child)
                    family.append(child)
            for member in family:
                inputs.append(self._sample_input(member))
                seqs.append(member)
                rows.append(row)
        touched: set[str] = set()
        if inputs:
            logits = result.sample_logits
            if rows != list(range(logits.shape[0])):  # some rows finished, forked, or belong to proposals
                logits = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]
            touched = self._append_sampled(seqs, sample(logits, inputs))
        now = time.perf_counter()
        if verifying:
            emitted = verify(result.sample_logits, [item for _, item in verifying])
            for (seq, item), tokens in zip(verifying, emitted):
                self._append_verified(seq, item.draft, tokens, now)
                touched.add(seq.request_id)
        return touched

    def _append_sampled(self, seqs: list[Sequence], tokens: list[tuple[int, TokenLogprob | None]]) -> set[str]:
        """One sampled token per sequence; those aborted while their batch was in flight are skipped."""
        now = time.perf_counter()
        touched: set[str] = set()
        for seq, (token, logprob) in zip(seqs, tokens):
            if seq.is_finished or seq.request_id not in self.requests:
                continue
            self._append_token(seq, token, logprob, now)
            touched.add(seq.request_id)
        return touched

    def _append_verified(self, seq: Sequence, draft: Draft, tokens: list[tuple[int, TokenLogprob | None]],
                         now: float) -> None:
        """The accepted proposals and the token after them, each checked for stops as it is appended."""
        for token, logprob in tokens:
            self._append_token(seq, token, logprob, now)
            if seq.is_finished:
                break
        accepted = len(tokens) - 1
        self.speculator.stats.record(len(draft.token_ids), accepted)
        if not seq.is_finished:
            seq.num_computed_tokens += accepted  # their K/V was written by this step
            self.block_manager.register_full_blocks(seq)

    def _sample_input(self, seq: Sequence) -> SampleInput:
        params = seq.params
        blocked: list[int] = []
        if len(seq.output_token_ids) < params.min_tokens:
            blocked = sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids)))
        return SampleInput.for_sequence(seq, params, seq.generator or self._default_generator, blocked)

    def _append_token(self, seq: Sequence, token: int, logprob, now: float) -> None:
        if not seq.output_token_ids and seq.index == 0:
            self.stats["prompt_tokens"] += len(seq.prompt_token_ids)
        seq.output_token_ids.append(token)
        self.stats["generation_tokens"] += 1
        if logprob is not None:
            seq.output_logprobs.append(logprob)
        timings = seq.timings
        timings.first_token = timings.first_token or now
        timings.last_token = now
        request = self.requests[seq.request_id]
        detok = request.detokenizers[seq.seq_id]
        detok.add(seq.output_token_ids)
        request.texts[seq.seq_id] = detok.text
        self._check_stop(seq, request, token)

    def _check_stop(self, seq: Sequence, request: Request, token: int) -> None:
        params = seq.params
        generated = len(seq.output_token_ids)
        if generated >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return self._finish(seq, request, "stop", None)
            if token in params.stop_token_ids:
                return self._finish(seq, request, "stop", token)
            if params.stop:
                text = request.texts[seq.seq_id]
                searched = request.stop_searched.get(seq.seq_id, 0)  # no stop string ended before this
                request.stop_searched[seq.seq_id] = len(text)
                for stop in params.stop:
                    at = text.find(stop, max(0, searched - len(stop) + 1))
                    if at != -1:
                        end = at + len(stop) if params.include_stop_str_in_output else at
                        request.texts[seq.seq_id] = text[:end]
                        return self._finish(seq, request, "stop", stop)
        limit = params.max_tokens if params.max_tokens is not None else self.max_model_len
        if generated >= limit or seq.num_tokens >= self.max_model_len:
            self._finish(seq, request, "length", None)

    def _finish(self, seq: Sequence, request: Request, reason: str, stop_reason) -> None:
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        if reason == "length":  # nothing more is coming: emit the text held back for incomplete characters
            request.detokenizers[seq.seq_id].flush(seq.output_token_ids)
            request.texts[seq.seq_id] = request.detokenizers[seq.seq_id].text
        seq.timings.finished = time.perf_counter()
        self.scheduler.finish(seq)

    def _fail_step(self, sched: SchedulerOutput, exc: Exception) -> StepFailedError:
        request_ids = sorted({item.seq.request_id for item in sched.scheduled})
        for request_id in request_ids:
            self.abort(request_id)
        logger.error("a model step failed (%s: %s); its requests %s were aborted", type(exc).__name__, exc,
                     ", ".join(request_ids), exc_info=exc)
        return StepFailedError(request_ids, exc)

    def _fail_unschedulable(self) -> None:
        """Nothing runs and the first waiting sequence cannot get blocks: it can never fit."""
        seq = self.scheduler.waiting[0]
        seq.finish_reason = "length"
        seq.timings.finished = time.perf_counter()
        self.scheduler.finish(seq)
        logger.warning("request %s needs more KV blocks than the cache has; finished early", seq.request_id)

    # -- outputs --------------------------------------------------------------------------
    def _output(self, request: Request) -> RequestOutput:
        completions = []
        longest_stop = max((len(s) for s in request.params.stop), default=0)
        for seq in request.seqs:
            text = request.texts[seq.seq_id]
            if not seq.is_finished and longest_stop > 1:
                text = text[: max(0, len(text) - (longest_stop - 1))]  # a stop string may be forming
            logprobs = list(seq.output_logprobs) if request.params.logprobs is not None else None
            completions.append(CompletionOutput(
                index=seq.index, text=text, token_ids=list(seq.output_token_ids),
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason, logprobs=logprobs,
                cumulative_logprob=sum(lp.logprob for lp in logprobs) if logprobs else None,
            ))
        first = request.seqs[0]
        timings = [s.timings for s in request.seqs]
        metrics = RequestMetrics(
            arrival_time=first.timings.arrival,
            first_scheduled_time=first.timings.first_scheduled,
            first_token_time=min((t.first_token for t in timings if t.first_token), default=None),
            last_token_time=max((t.last_token for t in timings if t.last_token), default=None),
            finished_time=max((t.finished for t in timings if t.finished), default=None) if request.finished else None,
        )
        return RequestOutput(
            request_id=request.request_id, prompt=request.prompt, prompt_token_ids=request.prompt_token_ids,
            outputs=sorted(completions, key=lambda c: c.index), finished=request.finished,
            prompt_logprobs=list(first.prompt_logprobs) if request.params.prompt_logprobs is not None else None,
            num_cached_tokens=first.num_cached_tokens, metrics=metrics,
        )


def _samples_plainly(sched: SchedulerOutput, batch: StepBatch, sample_seqs: list[Sequence]) -> bool:
    """A step whose sampling a pipeline's last stage can do from the batch alone: one row per sequence,
    no prompt log-probabilities, no proposals to verify, no n > 1 request forking at its first token."""
    return not batch.prompt_rows and len(batch.sample_rows) == len(sample_seqs) \
        and all(item.draft is None for item in sched.scheduled) and not any(seq.waiting_to_fork for seq in sample_seqs)
