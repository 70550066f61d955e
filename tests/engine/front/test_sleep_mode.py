"""Sleep mode (vLLM's enable_sleep_mode, LLM.sleep / LLM.wake_up) on the default model in one process: level 1
gives the KV cache's pages back and level 2 the weights' too — resident memory read from /proc before and after —
and waking gives the greedy tokens of before; a request while asleep, a sleep with requests running, a bad level
or tag are refused by name."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from llmctl import LLM, SamplingParams
from llmctl.engine.errors import InvalidRequestError, ModelAsleepError, SleepConflictError

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * mmap.PAGESIZE


def greedy(llm: LLM) -> list[list[int]]:
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def llm(default_source):
    llm = LLM(str(default_source.path), max_model_len=256, kv_cache_memory=256 * 2**20, enable_sleep_mode=True)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def expected(llm) -> list[list[int]]:
    return greedy(llm)


def test_level_one_gives_the_kv_cache_back_and_wakes_to_the_same_tokens(llm, expected):
    before = resident_bytes()
    llm.sleep(level=1)
    given_back = before - resident_bytes()
    assert given_back >= 0.9 * llm.engine.loaded.kv_cache_bytes, given_back
    with pytest.raises(ModelAsleepError, match="wake it up"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=1))
    llm.wake_up(["weights"])  # the KV cache still asleep: so is the model
    assert llm.engine.is_sleeping
    llm.wake_up(["kv_cache"])
    assert not llm.engine.is_sleeping and greedy(llm) == expected


def test_level_two_gives_the_weights_back_and_reads_them_again(llm, expected):
    before = resident_bytes()
    llm.sleep(level=2)
    given_back = before - resident_bytes()
    assert given_back >= llm.engine.loaded.weights_bytes + 0.9 * llm.engine.loaded.kv_cache_bytes, given_back
    llm.wake_up()
    assert greedy(llm) == expected


def test_what_sleep_mode_refuses_is_named(llm, default_source):
    with pytest.raises(InvalidRequestError, match="use 1"):
        llm.sleep(level=3)
    llm.engine.add_request("running", "Hello", SamplingParams(max_tokens=4))
    with pytest.raises(SleepConflictError, match="1 requests are running"):
        llm.sleep()
    llm.engine.abort("running")
    llm.sleep()
    with pytest.raises(SleepConflictError, match="asleep already"):
        llm.sleep(level=2)
    with pytest.raises(InvalidRequestError, match="tags"):
        llm.wake_up(["everything"])
    llm.wake_up()
