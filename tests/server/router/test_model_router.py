"""`llmctl serve --models` with three models (a tiny random Llama, a tiny random Mistral with a sliding window, and
the default model's GGUF served dequantized) and --max-loaded-models 2: each answers with transformers' greedy
tokens, whichever order the requests come in, and a LoRA adapter of one with peft's; concurrent requests during a load all complete; the third model's
first request unloads the least recently used one (seen in /v1/models, llama.cpp's router's status field) and a
later request for it loads it again; with --model-sleep-level the idle model sleeps and is woken instead; unknown or
missing models are OpenAI-shaped errors; streams pass through."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch

from helpers.models import save_random_model, small_config
from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess
PROMPT = [1, 450, 701, 112, 318, 9, 27]
TOKENS = 5


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("router")
    return {family: save_random_model(small_config(config, tokenizer), root / family, tokenizer)
            for family, config in (("llama", "llama-gqa"), ("mistral", "mistral-window"))}


@pytest.fixture(scope="module")
def adapter(folders, tmp_path_factory):
    from helpers.lora_helpers import make_adapter

    return make_adapter(folders["llama"], tmp_path_factory.mktemp("router-lora") / "sql", rank=4,
                        targets=["q_proj", "v_proj"], seed=0)


@pytest.fixture(scope="module")
def router(folders, adapter):
    server = start_server("--models", f"llama={folders['llama']} --enable-lora --lora-modules sql={adapter}", "--models", f"mistral={folders['mistral']}",
                          "--models", "smol= --dtype float32 --max-model-len 256", "--max-loaded-models", "2",
                          "--max-model-len", "128", "--disable-log-stats")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def expected(folders, default_source, tokenizer, adapter):
    """transformers' greedy tokens for PROMPT from each model (the default model from its GGUF file), each as the
    text of that one token, as logprobs name them."""
    from transformers import AutoModelForCausalLM

    gguf = default_source.gguf_path  # transformers' own GGUF reading, not llmctl's conversion
    models = {name: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32) for name, folder in folders.items()}
    models["smol"] = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    from peft import PeftModel

    models["sql"] = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folders["llama"], dtype=torch.float32),
                                              str(adapter))
    greedy = {name: model.generate(torch.tensor([PROMPT]), max_new_tokens=TOKENS, min_new_tokens=TOKENS,
                                   do_sample=False)[0, len(PROMPT):].tolist() for name, model in models.items()}
    return {name: [tokenizer.decode([token]) for token in tokens] for name, tokens in greedy.items()}


def complete(router, model: str) -> list[str]:
    """The greedy completion of PROMPT, token by token (logprobs' token strings)."""
    answer = httpx.post(f"{router.url}/v1/completions", timeout=300, json={
        "model": model, "prompt": PROMPT, "max_tokens": TOKENS, "min_tokens": TOKENS, "temperature": 0, "logprobs": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["logprobs"]["tokens"]


def states(router) -> dict[str, str]:
    return {card["id"]: card["status"]["value"] for card in httpx.get(f"{router.url}/v1/models").json()["data"]}


def test_models_load_on_demand_and_the_least_recently_used_makes_room(router, expected):
    assert states(router) == {"llama": "unloaded", "sql": "unloaded", "mistral": "unloaded", "smol": "unloaded"}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # all arrive while llama loads
        during_load = list(pool.map(lambda _: complete(router, "llama"), range(4)))
    assert during_load == [expected["llama"]] * 4
    assert complete(router, "sql") == expected["sql"] != expected["llama"]  # llama's adapter, on llama's server
    assert complete(router, "mistral") == expected["mistral"]
    assert complete(router, "llama") == expected["llama"]  # mistral is now the least recently used
    assert states(router) == {"llama": "loaded", "sql": "loaded", "mistral": "loaded", "smol": "unloaded"}
    assert complete(router, "smol") == expected["smol"]
    assert states(router) == {"llama": "loaded", "sql": "loaded", "mistral": "unloaded", "smol": "loaded"}
    assert complete(router, "mistral") == expected["mistral"]  # loaded again, in llama's place
    assert states(router) == {"llama": "unloaded", "sql": "unloaded", "mistral": "loaded", "smol": "loaded"}


def test_streams_pass_through_and_bad_model_names_are_openai_errors(router, expected):
    from openai import OpenAI

    client = OpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)
    whole = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=6, temperature=0)
    chunks = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=6, temperature=0,
                                       stream=True)
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    unknown = httpx.post(f"{router.url}/v1/completions", json={"model": "gpt-9", "prompt": "hi"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert "llama, sql, mistral, smol" in unknown.json()["error"]["message"]
    missing = httpx.post(f"{router.url}/v1/completions", json={"prompt": "hi"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"


def test_with_a_sleep_level_the_least_recently_used_sleeps_and_wakes_instead(folders, expected):
    """--model-sleep-level 2: the idle model's server sleeps (its weights dropped, read again on waking) rather than
    stopping; the next request wakes it — the same process, loaded once — and it answers as before."""
    server = start_server("--models", f"llama={folders['llama']}", "--models", f"mistral={folders['mistral']}",
                          "--max-loaded-models", "1", "--model-sleep-level", "2", "--max-model-len", "128",
                          "--disable-log-stats")
    try:
        assert complete(server, "llama") == expected["llama"]
        assert complete(server, "mistral") == expected["mistral"]
        assert states(server) == {"llama": "sleeping", "mistral": "loaded"}
        assert complete(server, "llama") == expected["llama"]
        assert states(server) == {"llama": "loaded", "mistral": "sleeping"}
    finally:
        server.stop()
    assert server.log.count("loading llama (") == 1 and "llama woken in" in server.log
