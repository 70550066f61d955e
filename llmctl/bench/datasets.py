"""Benchmark workloads: random, random-mm (with images), ShareGPT, shared-prefix and custom JSONL, all
reproducible by seed.

Each yields SampleRequests: the prompt text, its length in tokens of the counting
tokenizer (without special tokens, as `vllm bench` counts), and how many tokens to ask for.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path

from llmctl.bench.multimodal_dataset import (
    DEFAULT_BUCKETS,
    DEFAULT_LIMIT,
    image_counts,
    image_limit,
    parse_buckets,
    random_images,
)
from llmctl.bench.tokens import TokenCounter
from llmctl.errors import LlmctlError
from llmctl.jsonl import read_jsonl

DATASETS = ("random", "random-mm", "sharegpt", "shared-prefix", "custom")
SHAREGPT_MIN_LEN = 4  # vLLM's filters: drop tiny turns and pairs too long for a 2,048-token context
SHAREGPT_MAX_PROMPT = 1024
SHAREGPT_MAX_TOTAL = 2048


@dataclass(frozen=True)
class SampleRequest:
    prompt: str  # for the chat endpoint: the user message
    prompt_len: int
    expected_output_len: int
    system: str | None = None  # a system prompt (shared-prefix); completions prepend it to the prompt
    images: tuple[str, ...] = ()  # random-mm: data URLs, sent as the chat message's image_url parts

    @property
    def full_prompt(self) -> str:
        return (self.system or "") + self.prompt


@dataclass(frozen=True)
class DatasetOptions:
    name: str = "random"
    path: Path | None = None
    num_prompts: int = 1000
    seed: int = 0
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    sharegpt_output_len: int | None = None
    shared_prefix_groups: int = 4
    shared_prefix_len: int = 512
    shared_prefix_question_len: int = 32
    shared_prefix_output_len: int = 128
    custom_output_len: int = 256
    random_mm_base_items_per_request: int = 1
    random_mm_num_mm_items_range_ratio: float = 0.0
    random_mm_limit_mm_per_prompt: str = DEFAULT_LIMIT
    random_mm_bucket_config: str = DEFAULT_BUCKETS


class PromptMaker:
    """Text of an exact token length: random vocabulary words, trimmed or topped up until the
    counting tokenizer agrees (a few rounds at most; word tokens rarely merge)."""

    def __init__(self, counter: TokenCounter, words: list[str], rng: random.Random) -> None:
        if len(words) < 100:
            raise LlmctlError("the tokenizer has too few plain-word tokens to build random prompts")
        self.counter, self.words, self.rng = counter, words, rng

    def text(self, length: int) -> str:
        text = "".join(self.rng.choice(self.words) for _ in range(length))
        for _ in range(8):
            ids = self.counter.encode(text)
            if len(ids) == length:
                return text
            if len(ids) > length:
                text = self.counter.decode(ids[:length])
            else:
                text += "".join(self.rng.choice(self.words) for _ in range(length - len(ids)))
        raise LlmctlError(f"could not build a prompt of exactly {length} tokens with {self.counter.name}")


def length_range(mean: int, ratio: float) -> tuple[int, int]:
    """vLLM's --random-range-ratio: lengths uniform in [mean·(1−r), mean·(1+r)]."""
    if not 0 <= ratio < 1:
        raise LlmctlError("--random-range-ratio must be in [0, 1)")
    return max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))


def random_requests(options: DatasetOptions, maker: PromptMaker, rng: random.Random) -> list[SampleRequest]:
    if options.random_input_len < 1 or options.random_output_len < 1:
        raise LlmctlError("--random-input-len and --random-output-len must be at least 1")
    inputs = length_range(options.random_input_len, options.random_range_ratio)
    outputs = length_range(options.random_output_len, options.random_range_ratio)
    requests = []
    for _ in range(options.num_prompts):
        prompt_len, output_len = rng.randint(*inputs), rng.randint(*outputs)
        requests.append(SampleRequest(maker.text(prompt_len), prompt_len, output_len))
    return requests


def random_mm_requests(options: DatasetOptions, maker: PromptMaker, rng: random.Random) -> list[SampleRequest]:
    """random's prompts, each with its images (llmctl.bench.multimodal_dataset); prompt_len counts the text."""
    buckets = parse_buckets(options.random_mm_bucket_config)
    counts = image_counts(options.random_mm_base_items_per_request, options.random_mm_num_mm_items_range_ratio,
                          image_limit(options.random_mm_limit_mm_per_prompt), options.num_prompts, rng)
    texts = random_requests(options, maker, rng)
    return [dataclasses.replace(text, images=images) for text, images in zip(texts, random_images(counts, buckets, rng))]


def shared_prefix_requests(options: DatasetOptions, maker: PromptMaker, counter: TokenCounter,
                           rng: random.Random) -> list[SampleRequest]:
    """`groups` long system prompts, each followed by different short questions (round-robin)."""
    if options.shared_prefix_groups < 1:
        raise LlmctlError("--shared-prefix-groups must be at least 1")
    prefixes = [maker.text(options.shared_prefix_len) for _ in range(options.shared_prefix_groups)]
    requests = []
    for index in range(options.num_prompts):
        system = prefixes[index % len(prefixes)]
        question = maker.text(options.shared_prefix_question_len)
        prompt_len = len(counter.encode(system + question))
        requests.append(SampleRequest(question, prompt_len, options.shared_prefix_output_len, system=system))
    return requests


def sharegpt_requests(options: DatasetOptions, counter: TokenCounter, rng: random.Random) -> list[SampleRequest]:
    """The first human turn and the reply after it from each conversation of a ShareGPT JSON file."""
    records = _read_json(_need_path(options), "a ShareGPT JSON list of {\"conversations\": [...]}")
    if not isinstance(records, list):
        raise LlmctlError(f"{options.path} is not a ShareGPT file: expected a JSON list of conversations")
    pairs = []
    for record in records:
        turns = record.get("conversations") if isinstance(record, dict) else None
        if isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns[:2]):
            prompt, reply = turns[0].get("value"), turns[1].get("value")
            if isinstance(prompt, str) and isinstance(reply, str):
                pairs.append((prompt, reply))
    rng.shuffle(pairs)
    requests: list[SampleRequest] = []
    for prompt, reply in pairs:
        if len(requests) == options.num_prompts:
            break
        prompt_len = len(counter.encode(prompt))
        output_len = options.sharegpt_output_len or len(counter.encode(reply))
        too_long = prompt_len > SHAREGPT_MAX_PROMPT or prompt_len + output_len > SHAREGPT_MAX_TOTAL
        if prompt_len < SHAREGPT_MIN_LEN or output_len < SHAREGPT_MIN_LEN or too_long:
            continue
        requests.append(SampleRequest(prompt, prompt_len, output_len))
    if not requests:
        raise LlmctlError(f"{options.path} has no usable conversations (a human turn and a reply of "
                          f"{SHAREGPT_MIN_LEN}+ tokens, at most {SHAREGPT_MAX_TOTAL} tokens together)")
    return requests


def custom_requests(options: DatasetOptions, counter: TokenCounter, rng: random.Random) -> list[SampleRequest]:
    """JSONL, one {"prompt": "...", "output_tokens": N} per line (output_tokens optional)."""
    path = _need_path(options)
    requests = []
    for number, record in read_jsonl(path):
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str):
            raise LlmctlError(f"{path}:{number} needs a \"prompt\" string")
        output_len = record.get("output_tokens", record.get("max_tokens", options.custom_output_len))
        if not isinstance(output_len, int) or output_len < 1:
            raise LlmctlError(f"{path}:{number}: output_tokens must be a positive integer")
        requests.append(SampleRequest(prompt, len(counter.encode(prompt)), output_len))
    if not requests:
        raise LlmctlError(f"{path} has no prompts")
    rng.shuffle(requests)
    return requests[:options.num_prompts]


def sample_requests(options: DatasetOptions, counter: TokenCounter, words: list[str]) -> list[SampleRequest]:
    if options.num_prompts < 1:
        raise LlmctlError("--num-prompts must be at least 1")
    rng = random.Random(options.seed)
    if options.name == "random":
        return random_requests(options, PromptMaker(counter, words, rng), rng)
    if options.name == "random-mm":
        return random_mm_requests(options, PromptMaker(counter, words, rng), rng)
    if options.name == "shared-prefix":
        return shared_prefix_requests(options, PromptMaker(counter, words, rng), counter, rng)
    if options.name == "sharegpt":
        return sharegpt_requests(options, counter, rng)
    if options.name == "custom":
        return custom_requests(options, counter, rng)
    raise LlmctlError(f"unknown --dataset-name {options.name}: choose one of {', '.join(DATASETS)}")


def _need_path(options: DatasetOptions) -> Path:
    if options.path is None:
        raise LlmctlError(f"--dataset-name {options.name} needs --dataset-path FILE")
    if not options.path.is_file():
        raise LlmctlError(f"--dataset-path {options.path} does not exist")
    return options.path


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise LlmctlError(f"{path} is not valid JSON ({error}); expected {what}") from None
