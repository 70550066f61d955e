"""vLLM's sleep-mode endpoints through `llmctl serve --enable-sleep-mode` (a tiny random Llama with the default
model's tokenizer): POST /sleep at both levels, GET /is_sleeping, a completion while asleep answered 503 saying to
wake it (/tokenize and /v1/models still answered), POST /wake_up (by tags too) and the official openai client's greedy completion unchanged after each;
bad levels and tags are 400s naming the field. What memory each level gives back is measured in
tests/engine/front/test_sleep_mode.py."""

from __future__ import annotations

import httpx
import pytest

from helpers.models import save_random_model, small_config
from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def server(tmp_path_factory, tokenizer):
    folder = save_random_model(small_config("llama-gqa", tokenizer), tmp_path_factory.mktemp("sleep") / "m", tokenizer)
    server = start_server(str(folder), "--served-model-name", "tiny", "--max-model-len", "128",
                          "--enable-sleep-mode")
    yield server
    server.stop()


def completion(server) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    return client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8,
                                     temperature=0).choices[0].text


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_answers_503_until_woken_and_then_the_same_tokens(server, level):
    before = completion(server)
    assert httpx.post(f"{server.url}/sleep", params={"level": level}).status_code == 200
    assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": True}
    asleep = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2})
    assert asleep.status_code == 503 and "wake it up" in asleep.json()["error"]["message"]
    # what needs no weights keeps answering, as vLLM's
    assert httpx.post(f"{server.url}/tokenize", json={"prompt": "Hi"}).json()["count"] >= 1
    assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"] == "tiny"
    assert httpx.post(f"{server.url}/sleep").status_code == 409  # asleep already
    assert httpx.post(f"{server.url}/wake_up", params={"tags": "weights"}).status_code == 200
    assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": True}  # the KV cache is not back yet
    assert httpx.post(f"{server.url}/wake_up", params={"tags": "kv_cache"}).status_code == 200
    assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": False}
    assert completion(server) == before


def test_bad_levels_and_tags_are_400s_naming_them(server):
    for level in ("3", "deep"):
        answer = httpx.post(f"{server.url}/sleep", params={"level": level})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "level", answer.text
    answer = httpx.post(f"{server.url}/wake_up", params={"tags": "everything"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "tags"
    assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": False}
