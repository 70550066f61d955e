"""`llmctl bench offline`: a workload through the engine in-process, optionally also through
transformers `generate` on the same weights for a ratio.

Like `vllm bench throughput`, every request asks for its output length with ignore_eos
and all requests arrive at once. TTFT and TPOT come from the engine's own per-request
timings. transformers runs padded batches (left padding) in arrival order, each batch
until its longest request; only the requested tokens count as output.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from llmctl.bench.datasets import DatasetOptions, SampleRequest, sample_requests
from llmctl.bench.metrics import Distribution, time_per_output_token
from llmctl.bench.tokens import LocalTokenizer
from llmctl.engine.config import EngineConfig
from llmctl.engine.front.data_parallel import in_lockstep, replica_configs
from llmctl.engine.front.llm import LLM
from llmctl.engine.front.llm_engine import LLMEngine
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.spec_decode.stats import SpecDecodeStats
from llmctl.engine.structured.params import StructuredOutputsParams
from llmctl.errors import LlmctlError

COMPARE_WITH = ("transformers",)


@dataclass
class OfflineOptions:
    engine: EngineConfig = field(default_factory=EngineConfig)  # data_parallel_size: replicas in this process
    dataset: DatasetOptions = field(default_factory=DatasetOptions)
    temperature: float = 1.0
    compare: str | None = None
    hf_batch_size: int = 16
    percentiles: tuple[float, ...] = (90.0, 99.0)
    lora_path: str | None = None  # with enable_lora: each request runs one of max_loras adapters loaded from here
    json_schema: dict[str, Any] | None = None  # every request's output follows it (structured outputs)


@dataclass
class Throughput:
    seconds: float
    requests: int
    input_tokens: int
    output_tokens: int

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tokens_per_s(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.seconds


@dataclass
class OfflineResult:
    model: str
    llmctl: Throughput
    ttft: Distribution
    tpot: Distribution
    preemptions: int
    transformers: Throughput | None = None
    transformers_on: str = ""  # the device and dtype it ran in: the engine's, so the ratio compares like with like
    spec_decode: SpecDecodeStats | None = None  # with --speculative-config: acceptance, summed over replicas
    lora_adapters: int = 0  # distinct adapters the requests were spread over
    startup_seconds: float = 0.0  # building the engine(s): spawning ranks, loading, sizing the KV pool
    rank_memory: list[tuple[int, int]] = field(default_factory=list)  # (weights, KV cache) bytes per rank of replica 0

    @property
    def ratio(self) -> float | None:
        if self.transformers is None:
            return None
        return self.llmctl.output_tokens_per_s / self.transformers.output_tokens_per_s


def run_engines(engines: list[Any], on_progress: Callable[[int], None]) -> list[Any]:
    """Step every engine until it is done: the first on this thread, each other replica on its own.

    The first runs here because the engines were built (and warmed up) on this thread: OpenMP
    keeps this thread's worker team, and torch ops issued from another thread then compete with
    it. Measured on this 2-core machine, a small GEMM took 22 µs here and 206 µs on a second
    thread (index_add_ 8 vs 65 µs), which made LoRA's small GEMMs look 3× costlier than they are."""
    import threading

    finished: list[Any] = []
    lock = threading.Lock()

    def drive(engine: Any) -> None:
        while engine.has_unfinished_requests:
            done = [o for o in engine.step() if o.finished]
            with lock:
                finished.extend(done)
                on_progress(len(finished))

    threads = [threading.Thread(target=drive, args=(e,), name=f"llmctl-replica{i}")
               for i, e in enumerate(engines) if i > 0]
    for thread in threads:
        thread.start()
    drive(engines[0])
    for thread in threads:
        thread.join()
    return finished


def check_options(options: OfflineOptions) -> None:
    """What the flags alone can refuse, before seconds of loading."""
    if options.compare not in (None, *COMPARE_WITH):
        raise LlmctlError(f"--compare takes {', '.join(COMPARE_WITH)}")
    if options.engine.enable_lora != (options.lora_path is not None):
        raise LlmctlError("--enable-lora and --lora-path go together: the requests run adapters read from "
                          "--lora-path")
    if options.dataset.name == "random-mm":
        raise LlmctlError("--dataset-name random-mm is for `llmctl bench serve` (images sent as chat parts); "
                          "offline runs take text workloads")


def run_offline(options: OfflineOptions, on_progress: Callable[[int, int], None] | None = None) -> OfflineResult:
    check_options(options)
    configs, store = replica_configs(options.engine) if options.engine.data_parallel_size > 1 else \
        ([options.engine], None)
    starting = time.perf_counter()
    llm = LLM.from_config(configs[0])
    engines = [llm.engine] + [LLMEngine(one) for one in configs[1:]]
    rounds = in_lockstep(engines) if store is not None else None  # experts spread over the replicas
    startup_seconds = time.perf_counter() - starting
    tokenizer = LocalTokenizer(llm.engine.loaded.source.name, llm.get_tokenizer())
    requests = sample_requests(options.dataset, tokenizer, tokenizer.words())
    prompts = [tokenizer.encode(r.full_prompt) for r in requests]
    structured = StructuredOutputsParams(json=options.json_schema) if options.json_schema is not None else None
    params = [SamplingParams(temperature=options.temperature, max_tokens=r.expected_output_len, ignore_eos=True,
                             seed=options.dataset.seed + i, structured_outputs=structured)
              for i, r in enumerate(requests)]
    loras = lora_requests(options, len(prompts))
    llm.generate([prompts[0]], [SamplingParams(max_tokens=4)])  # warm-up: first-call costs are not throughput
    engine = llm.engine
    for lora in dict.fromkeys(loras):  # read and checked before the clock starts, as a server's --lora-modules
        if lora is not None:
            for one in engines:
                one.add_lora(lora)
    if engine.speculator is not None:
        engine.speculator.reset_stats()  # acceptance of the run only
    work = [0] * len(engines)  # data parallel: each request to the replica with the least work so far
    for index, (prompt, param) in enumerate(zip(prompts, params)):
        target = work.index(min(work))
        work[target] += len(prompt) + (param.max_tokens or 0)
        engines[target].add_request(f"bench-{index}", prompt, param, loras[index])
    started = time.perf_counter()
    finished = run_engines(engines, lambda done: on_progress(done, len(requests)) if on_progress else None)
    seconds = time.perf_counter() - started
    if rounds is not None:
        rounds.stop()
    output_tokens = sum(len(o.outputs[0].token_ids) for o in finished)
    ttfts = [o.metrics.ttft for o in finished if o.metrics and o.metrics.ttft is not None]
    tpots = [time_per_output_token(o.metrics.e2e, o.metrics.ttft, len(o.outputs[0].token_ids)) for o in finished
             if o.metrics and o.metrics.e2e is not None and len(o.outputs[0].token_ids) > 1]
    result = OfflineResult(
        model=engine.loaded.source.name,
        llmctl=Throughput(seconds, len(finished), sum(len(p) for p in prompts), output_tokens),
        ttft=Distribution.of(ttfts, options.percentiles), tpot=Distribution.of(tpots, options.percentiles),
        preemptions=engine.scheduler.num_preemptions, spec_decode=_spec_decode(engines),
        lora_adapters=len({lora for lora in loras if lora is not None}), startup_seconds=startup_seconds,
        rank_memory=list(engine.executor.rank_memory))
    if options.compare == "transformers":
        path, device, dtype = engine.loaded.source.path, engine.loaded.device, engine.loaded.dtype
        del llm, engine, engines
        result.transformers = run_transformers(str(path), prompts, requests, options, device, dtype)
        result.transformers_on = f"{str(dtype).removeprefix('torch.')} on {device}"
    return result


def lora_requests(options: OfflineOptions, count: int) -> list[Any]:
    """As vLLM's benchmark_throughput: each request gets adapter id 1..max_loras at random (seeded),
    all read from --lora-path; without LoRA, None for every request."""
    from llmctl.engine.lora.request import LoRARequest

    if not options.engine.enable_lora:
        return [None] * count
    pick = random.Random(options.dataset.seed)
    ids = [pick.randint(1, options.engine.max_loras or 1) for _ in range(count)]
    return [LoRARequest(str(i), i, options.lora_path) for i in ids]


def _spec_decode(engines: list[Any]) -> SpecDecodeStats | None:
    stats = [e.speculator.stats for e in engines if e.speculator is not None]
    if not stats:
        return None
    total = SpecDecodeStats(stats[0].num_speculative_tokens)
    for one in stats:
        total.num_drafts += one.num_drafts
        total.num_draft_tokens += one.num_draft_tokens
        total.num_accepted_tokens += one.num_accepted_tokens
        total.accepted_per_position = [a + b for a, b in zip(total.accepted_per_position, one.accepted_per_position)]
    return total


def run_transformers(path: str, prompts: list[list[int]], requests: list[SampleRequest], options: OfflineOptions,
                     device: torch.device, dtype: torch.dtype) -> Throughput:
    """transformers `generate` on the engine's device and dtype (bf16 on a GPU: fp32 on the CPU beside a
    GPU engine would take hours at 8B shapes and compare nothing useful)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False).to(device).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    sampling: dict[str, Any] = ({"do_sample": True, "temperature": options.temperature, "top_p": 1.0, "top_k": 0}
                                if options.temperature > 0 else {"do_sample": False})
    started = time.perf_counter()
    for first in range(0, len(prompts), options.hf_batch_size):
        batch = prompts[first:first + options.hf_batch_size]
        longest = max(len(p) for p in batch)
        ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros(len(batch), longest, dtype=torch.long)
        for row, prompt in enumerate(batch):
            ids[row, longest - len(prompt):] = torch.tensor(prompt)
            mask[row, longest - len(prompt):] = 1
        new_tokens = max(r.expected_output_len for r in requests[first:first + options.hf_batch_size])
        with torch.no_grad():
            model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, pad_token_id=pad, **sampling)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    return Throughput(seconds, len(prompts), sum(len(p) for p in prompts),
                      sum(r.expected_output_len for r in requests))
