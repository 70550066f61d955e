"""Multi-LoRA in the engine: PEFT adapters on random Llama/Qwen2 models and on SmolLM2, against
transformers + peft; several adapters and the base model in one batch; swapping beyond --max-loras;
prefix-cache isolation; every adapter that does not fit is a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers.lora_helpers import PROMPTS, assert_matches, make_adapter, reference
from helpers.models import save_random_model
from llmctl import LLM, LoRARequest, SamplingParams
from llmctl.engine.errors import AdapterError, InvalidRequestError
from llmctl.errors import ModelNotFoundError

pytestmark = pytest.mark.subprocess

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_config(kind: str, vocab: int, layers: int = 2, hidden: int = 64):
    from transformers import LlamaConfig, Qwen2Config

    cls = LlamaConfig if kind == "llama" else Qwen2Config  # Qwen2: QKV bias
    return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer):
    """Per family: the base model and two adapters (one partial, one on every projection with rsLoRA)."""
    made = {}
    for kind in ("llama", "qwen2"):
        root = tmp_path_factory.mktemp(f"lora-{kind}")
        base = save_random_model(tiny_config(kind, len(tokenizer)), root / "base", tokenizer)
        made[kind] = {
            "base": base,
            "a1": make_adapter(base, root / "a1", rank=4, targets=["q_proj", "v_proj", "down_proj"], seed=1),
            "a2": make_adapter(base, root / "a2", rank=8, targets=ALL, seed=2, use_rslora=True,
                               alpha_pattern={"o_proj": 3.0}),
        }
    return made


def lora(name: str, lora_id: int, path: Path) -> LoRARequest:
    return LoRARequest(name, lora_id, str(path))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_adapters_and_the_base_model_in_one_batch_equal_transformers_with_peft(tiny, tokenizer, kind):
    models = tiny[kind]
    llm = LLM(str(models["base"]), enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256,
              max_num_batched_tokens=7)  # chunked prefill: chunks on top of the cache, next to decodes
    requests = [None, lora("a1", 1, models["a1"]), lora("a2", 2, models["a2"])]
    outputs = llm.generate(PROMPTS * 3, GREEDY, [r for r in requests for _ in PROMPTS])
    for index, request in enumerate(requests):
        adapter = None if request is None else Path(request.lora_path)
        assert_matches(outputs[index * 3:index * 3 + 3], reference(models["base"], adapter, tokenizer, PROMPTS,
                                                                   MAX_TOKENS))
    assert llm.engine.lora.num_slot_loads == 2  # both stayed resident


CAPTURED = pytest.param(True, marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                             reason="CUDA graphs need a CUDA GPU")])


@pytest.mark.parametrize("capture", [False, CAPTURED])
def test_adapters_through_the_cuda_graph_buffers_equal_transformers_with_peft(tiny, tokenizer, capture):
    """Decode steps mixing the base model and two adapters through the graphs' static buffers (the
    adapters' slots as a one-hot, as a captured graph reads them; captured on a GPU, run eagerly elsewhere)."""
    models = tiny["llama"]
    llm = LLM(str(models["base"]), enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256,
              max_num_seqs=4, attention_backend="triton", graph_buffers_on_cpu=not capture,
              device="cuda" if capture else "auto", dtype="float32")
    graphs = llm.engine.executor.runner.graphs
    assert bool(graphs.graphs) == capture
    sizes: list[int] = []
    run = graphs.run
    graphs.run = lambda batch, shape, *rest: sizes.append(len(batch.seq_lens)) or run(batch, shape, *rest)
    requests = [None, lora("a1", 1, models["a1"]), lora("a2", 2, models["a2"])]
    outputs = llm.generate([PROMPTS[0]] * 3, GREEDY, requests)
    assert 3 in sizes  # the three decoded together: base, a1 and a2 rows in one step
    for output, request in zip(outputs, requests):
        adapter = None if request is None else Path(request.lora_path)
        assert_matches([output], reference(models["base"], adapter, tokenizer, [PROMPTS[0]], MAX_TOKENS))


def test_more_adapters_than_slots_are_swapped_in_and_still_exact(tiny, tokenizer):
    models = tiny["llama"]
    llm = LLM(str(models["base"]), enable_lora=True, max_loras=1, max_lora_rank=8, max_model_len=256)
    seen: list[int] = []
    activate = llm.engine.lora.activate
    llm.engine.lora.activate = lambda seqs: seen.append(len({s.lora for s in seqs if s.lora})) or activate(seqs)
    requests = [lora("a1", 1, models["a1"]), None, lora("a2", 2, models["a2"]), lora("a1", 1, models["a1"])]
    outputs = llm.generate([PROMPTS[0]] * 4, GREEDY, requests)
    assert max(seen) == 1  # never two adapters in one step with one slot
    assert llm.engine.lora.num_slot_loads == 2  # a1 (both of its requests ran together), then a2
    outputs.append(llm.generate([PROMPTS[0]], GREEDY, requests[0])[0])  # a1 swapped back in
    requests.append(requests[0])
    assert llm.engine.lora.num_slot_loads == 3
    expected = {name: reference(models["base"], models[name], tokenizer, PROMPTS[:1], MAX_TOKENS)[0]
                for name in ("a1", "a2")}
    expected[None] = reference(models["base"], None, tokenizer, PROMPTS[:1], MAX_TOKENS)[0]
    for output, request in zip(outputs, requests):
        assert_matches([output], [expected[request.lora_name if request else None]])


def test_prefix_cache_is_never_shared_between_adapters_or_across_a_reload(tiny, tokenizer):
    models = tiny["llama"]
    llm = LLM(str(models["base"]), enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256,
              block_size=8)
    prompt = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest"
    a1, a2 = lora("a1", 1, models["a1"]), lora("a2", 2, models["a2"])

    def run(request):
        [out] = llm.generate([prompt], GREEDY, request)
        return out

    first = run(a1)
    assert first.num_cached_tokens == 0
    assert run(a2).num_cached_tokens == 0 and run(None).num_cached_tokens == 0
    again = run(a1)
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    # Unload a1 and load other weights under the same name: nothing of the old a1 may be reused.
    llm.engine.remove_lora(1)
    reloaded = run(lora("a1", 3, models["a2"]))
    assert reloaded.num_cached_tokens == 0
    assert_matches([reloaded], reference(models["base"], models["a2"], tokenizer, [prompt], MAX_TOKENS))


def test_adapter_on_smollm2_equals_peft_next_to_base_requests(default_source, tokenizer, tmp_path):
    adapter = make_adapter(default_source.path, tmp_path / "smol", rank=8, targets=ALL, seed=3, std=0.05)
    llm = LLM(str(default_source.path), enable_lora=True, max_lora_rank=8, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    request = lora("smol", 1, adapter)
    outputs = llm.generate(PROMPTS[:2] * 2, params, [request, request, None, None])
    tuned = reference(default_source.path, adapter, tokenizer, PROMPTS[:2], 6)
    assert [o.outputs[0].token_ids for o in outputs[:2]] != [t for t, _ in reference(
        default_source.path, None, tokenizer, PROMPTS[:2], 6)]  # the adapter changes the output
    assert_matches(outputs[:2], tuned)
    assert_matches(outputs[2:], reference(default_source.path, None, tokenizer, PROMPTS[:2], 6))


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_adapter_on_a_4bit_base_equals_peft_on_its_dequantized_weights(tiny, tokenizer, tmp_path, method):
    from helpers.cli_process import run_cli
    from helpers.quant_helpers import dequantized_state
    from llmctl.checkpoint.quant_formats import unpack_awq, unpack_gptq

    unpack = (lambda parts: unpack_gptq(parts, 4, 32)) if method == "gptq" else (lambda parts: unpack_awq(parts, 32))
    models = tiny["llama"]
    out = tmp_path / method
    calib = tmp_path / "calib.txt"
    calib.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    result = run_cli("quantize", str(models["base"]), f"--{method}", "--group-size", "32", "--calib-file", str(calib),
                     "--calib-samples", "2", "--calib-seq-len", "32", "--output", str(out), "--no-redistribute")
    assert result.returncode == 0, result.stderr
    state = dequantized_state(out, unpack)  # the dense tensors too, in the checkpoint's own dtype
    llm = LLM(str(out), enable_lora=True, max_lora_rank=8, max_model_len=256)
    outputs = llm.generate(PROMPTS, GREEDY, lora("a2", 1, models["a2"]))
    assert_matches(outputs, reference(models["base"], models["a2"], tokenizer, PROMPTS, MAX_TOKENS, state))


def test_speculation_and_data_parallel_replicas_run_adapters_unchanged(tiny):
    import asyncio

    from llmctl.engine.config import EngineConfig
    from llmctl.engine.front.data_parallel import DataParallelEngine

    models = tiny["llama"]
    repeat = "one two three four one two three four one two three"
    a1 = lora("a1", 1, models["a1"])
    plain = LLM(str(models["base"]), enable_lora=True, max_lora_rank=8, max_model_len=256)
    expected = [o.outputs[0].token_ids for o in plain.generate([repeat, PROMPTS[0]], GREEDY, [a1, None])]
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    spec = LLM(str(models["base"]), enable_lora=True, max_lora_rank=8, max_model_len=256, speculative_config=ngram)
    assert [o.outputs[0].token_ids for o in spec.generate([repeat, PROMPTS[0]], GREEDY, [a1, None])] == expected
    assert spec.engine.speculator.stats.num_drafts > 0

    replicas = DataParallelEngine(EngineConfig(model=str(models["base"]), enable_lora=True, max_lora_rank=8,
                                               max_model_len=256, data_parallel_size=2))
    try:
        for engine in replicas.engines:
            engine.add_lora(a1)

        async def generate(index: int) -> list[int]:
            async for output in replicas.generate(repeat, GREEDY, f"dp-{index}", a1):
                final = output
            return final.outputs[0].token_ids

        async def both() -> list[list[int]]:
            return await asyncio.gather(generate(0), generate(1))

        assert asyncio.run(both()) == [expected[0], expected[0]]
        assert all(engine.stats().generation_tokens > 0 for engine in replicas.engines)  # each replica ran one

        async def unregistered() -> None:  # behind a server only registered adapters run (no lazy reload)
            async for _ in replicas.generate(repeat, GREEDY, "dp-x", lora("gone", 9, models["a2"])):
                pass

        with pytest.raises(InvalidRequestError, match="the LoRA adapter 'gone' is not loaded"):
            asyncio.run(unregistered())
    finally:
        replicas.shutdown()


def test_an_adapter_by_hub_id_comes_from_the_hub_cache_like_a_model(tiny, hf_cache):
    from helpers.hubcache import add_repo

    models = tiny["llama"]
    add_repo(hf_cache, "tester/tiny-lora", {name: (models["a1"] / name).read_bytes()
                                             for name in ("adapter_config.json", "adapter_model.safetensors")})
    llm = LLM(str(models["base"]), enable_lora=True, max_lora_rank=8, max_model_len=256)
    by_id = llm.generate(PROMPTS[:1], GREEDY, lora("hub", 1, "tester/tiny-lora"))
    by_path = llm.generate(PROMPTS[:1], GREEDY, lora("local", 2, models["a1"]))
    assert by_id[0].outputs[0].token_ids == by_path[0].outputs[0].token_ids
    with pytest.raises(Exception, match="tester/absent-lora.*not in the local cache"):
        llm.generate(PROMPTS[:1], GREEDY, lora("absent", 3, "tester/absent-lora"))


# -- adapters that do not fit -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_engine(tiny):
    return LLM(str(tiny["llama"]["base"]), enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256)


def edited(src: Path, dst: Path, config_changes: dict | None = None, drop: str | None = None,
           rename: tuple[str, str] | None = None) -> Path:
    """A copy of an adapter with its config or tensors changed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "adapter_config.json").read_text())
    config.update(config_changes or {})
    (dst / "adapter_config.json").write_text(json.dumps(config))
    tensors = load_file(str(dst / "adapter_model.safetensors"))
    if drop:
        tensors = {k: v for k, v in tensors.items() if drop not in k}
    if rename:
        tensors = {k.replace(*rename): v for k, v in tensors.items()}
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    return dst


def test_adapters_that_do_not_fit_are_refused_with_the_reason(llama_engine, tiny, tokenizer, tmp_path):
    models = tiny["llama"]
    other = save_random_model(tiny_config("llama", len(tokenizer), hidden=32), tmp_path / "other",
                              tokenizer)
    deeper = save_random_model(tiny_config("llama", len(tokenizer), layers=3), tmp_path / "deeper", tokenizer)
    wide = make_adapter(other, tmp_path / "wide", rank=4, targets=["q_proj"], seed=4)
    cases = {
        "no adapter_config.json": (tmp_path, r"is not a PEFT LoRA adapter: it has no adapter_config\.json"),
        "shapes": (wide, r"does not fit this base model.*q_proj\.lora_A is \[4, 32\], the base model needs "
                         r"\[r, 64\]"),
        "layers": (make_adapter(deeper, tmp_path / "deep", rank=4, targets=["v_proj"], seed=5),
                   r"adapts layer 2, but the base model has 2 layers"),
        "rank": (make_adapter(models["base"], tmp_path / "r16", rank=16, targets=["q_proj"], seed=6),
                 r"has rank 16, more than --max-lora-rank 8: start with --max-lora-rank 16"),
        "dora": (edited(models["a1"], tmp_path / "dora", {"use_dora": True}), r"uses DoRA"),
        "bias": (edited(models["a1"], tmp_path / "bias", {"bias": "all"}), r"trains biases"),
        "unserved target": (edited(models["a1"], tmp_path / "fc", rename=("mlp.down_proj", "mlp.fc2")),
                            r"adapts mlp\.fc2, which llmctl's LoRA does not serve \(it serves down_proj, "
                            r"gate_proj, k_proj"),
        "nothing": (edited(models["a1"], tmp_path / "empty", drop="lora_"),
                    r"has no LoRA weights for any layer of this model"),
        "half": (edited(models["a1"], tmp_path / "half", drop="q_proj.lora_B"), r"lora_A without lora_B"),
        "not lora": (edited(models["a1"], tmp_path / "ia3", {"peft_type": "IA3"}), r"is a IA3 adapter"),
    }
    for lora_id, (case, (path, message)) in enumerate(cases.items(), start=10):
        with pytest.raises(AdapterError, match=message):
            llama_engine.generate(PROMPTS[:1], GREEDY, lora(case, lora_id, path))
    with pytest.raises(ModelNotFoundError, match="is not a folder"):
        llama_engine.generate(PROMPTS[:1], GREEDY, lora("missing", 99, tmp_path / "nowhere"))
    assert not llama_engine.engine.has_unfinished_requests and llama_engine.engine.list_loras() == set()


def test_lora_requests_need_enable_lora_and_valid_settings(tiny):
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.errors import EngineConfigError

    llm = LLM(str(tiny["llama"]["base"]), max_model_len=256)
    with pytest.raises(InvalidRequestError, match="started without LoRA: pass enable_lora=True"):
        llm.generate(PROMPTS[:1], GREEDY, lora("a1", 1, tiny["llama"]["a1"]))
    with pytest.raises(EngineConfigError, match="--max-loras must be at least 1"):
        EngineConfig(enable_lora=True, max_loras=0).validate()
    with pytest.raises(EngineConfigError, match="--enable-lora runs with --tensor-parallel-size 1"):
        EngineConfig(enable_lora=True, tensor_parallel_size=2).validate()


def test_slots_take_what_plan_counts(llama_engine):
    from llmctl.sizing.lora import lora_slot_bytes

    loaded = llama_engine.engine.loaded
    assert loaded.lora_bytes == lora_slot_bytes(loaded.spec, 2, 8, 4) > 0


def test_other_families_are_refused_at_startup(tmp_path, tokenizer):
    from transformers import OPTConfig

    from llmctl.errors import UnsupportedModelError

    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, ffn_dim=64,
                       num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32)
    folder = save_random_model(config, tmp_path / "opt", tokenizer)
    with pytest.raises(UnsupportedModelError, match="LoRA adapters are served on the Llama family"):
        LLM(str(folder), enable_lora=True, max_model_len=64)


def test_a_call_with_a_bad_adapter_leaves_no_request_behind(llama_engine, tiny):
    with pytest.raises(AdapterError):
        llama_engine.generate(PROMPTS[:2], GREEDY, [None, lora("bad", 50, tiny["llama"]["base"])])
    assert not llama_engine.engine.has_unfinished_requests
    [output] = llama_engine.generate(PROMPTS[:1], GREEDY)
    assert len(output.outputs[0].token_ids) == MAX_TOKENS


# -- the server -------------------------------------------------------------------------------------


def post(url: str, body: dict) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_served_adapters_run_concurrently_and_load_and_unload_at_runtime(tiny, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from helpers.server_helpers import start_server

    models = tiny["llama"]
    offline = LLM(str(models["base"]), enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256)
    plain = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = {name: [o.outputs[0].text for o in offline.generate(PROMPTS, plain, request)] for name, request in
                {"base": None, "a1": lora("a1", 1, models["a1"]), "a2": lora("a2", 2, models["a2"])}.items()}
    server = start_server(str(models["base"]), "--served-model-name", "base", "--enable-lora", "--lora-modules",
                          f"a1={models['a1']}", f"a2={models['a2']}", "--max-loras", "2", "--max-lora-rank", "8",
                          "--max-model-len", "256", "--allow-runtime-lora-updating")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        cards = {m.id: m for m in client.models.list().data}
        assert set(cards) == {"base", "a1", "a2"}
        assert cards["a1"].parent == "base" and cards["a1"].root == str(models["a1"])

        def complete(model: str, prompt: str, stream: bool) -> str:
            args = dict(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                        extra_body={"ignore_eos": True})
            if not stream:
                response = client.completions.create(**args)
                assert response.model == model
                return response.choices[0].text
            return "".join(c.choices[0].text for c in client.completions.create(**args, stream=True) if c.choices)

        jobs = [(model, prompt, i % 2 == 0) for model in ("base", "a1", "a2") for i, prompt in enumerate(PROMPTS)]
        with ThreadPoolExecutor(len(jobs)) as pool:  # every adapter and the base model in flight at once
            texts = list(pool.map(lambda job: complete(*job), jobs))
        assert texts == expected["base"] + expected["a1"] + expected["a2"]

        with pytest.raises(openai.NotFoundError, match="the model 'a3' does not exist"):
            complete("a3", PROMPTS[0], False)
        assert post(server.url + "/v1/load_lora_adapter", {"lora_name": "a3", "lora_path": str(models["a2"])}) == \
            (200, "Success: LoRA adapter 'a3' added successfully.")
        assert complete("a3", PROMPTS[0], False) == expected["a2"][0]
        status, body = post(server.url + "/v1/load_lora_adapter", {"lora_name": "a3", "lora_path": "x"})
        assert status == 400 and "has already been loaded" in body
        status, body = post(server.url + "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(tmp_path)})
        assert status == 400 and "has no adapter_config.json" in body
        status, body = post(server.url + "/v1/load_lora_adapter", {"lora_name": "gone", "lora_path": "./nowhere"})
        assert status == 404 and "is not a folder" in body
        assert post(server.url + "/v1/unload_lora_adapter", {"lora_name": "a3"})[0] == 200
        with pytest.raises(openai.NotFoundError):
            complete("a3", PROMPTS[0], False)
        assert post(server.url + "/v1/unload_lora_adapter", {"lora_name": "a3"})[0] == 404
        assert "a3" not in {m.id for m in client.models.list().data}

        paths = json.loads(server.get("/openapi.json")[1])["paths"]
        assert paths["/v1/load_lora_adapter"]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "required"] == ["lora_name", "lora_path"]
        status, metrics = server.get("/metrics")
        assert 'llmctl:lora_requests_total{lora_name="a1",model_name="base"} 3.0' in metrics
        assert 'llmctl:lora_requests_total{lora_name="a3",model_name="base"} 1.0' in metrics
        assert 'llmctl:lora_requests_info{max_lora="2"' in metrics
    finally:
        assert server.stop() == 0


def test_serve_refuses_an_adapter_that_does_not_fit_before_serving(tiny, tmp_path):
    from helpers.cli_process import run_cli

    result = run_cli("serve", str(tiny["llama"]["base"]), "--enable-lora", "--lora-modules", f"bad={tmp_path}",
                     "--max-model-len", "256", "--port", "0")
    assert result.returncode != 0
    assert "--lora-modules bad=" in result.stderr and "has no adapter_config.json" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("serve", "--lora-modules", f"a1={tiny['llama']['a1']}")
    assert result.returncode == 2 and "need --enable-lora" in result.stderr


# -- inspect and plan -------------------------------------------------------------------------------


def test_inspect_describes_an_adapter_and_whether_it_fits(tiny, tokenizer, tmp_path):
    from helpers.cli_process import run_cli

    models = tiny["llama"]
    result = run_cli("inspect", str(models["a2"]), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rank"] == 8 and report["config"]["alpha"] == 16 and report["config"]["use_rslora"]
    assert report["targets"] == sorted(ALL) and report["layers"] == 2
    # 2 layers × (q 8·(64+64) + k, v 8·(64+32) + o 8·(64+64) + gate, up 8·(64+128) + down 8·(128+64))
    assert report["num_params"] == 2 * 8 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert report["fits"] is True
    other = save_random_model(tiny_config("llama", len(tokenizer), hidden=32), tmp_path / "other", tokenizer)
    wide = make_adapter(other, tmp_path / "wide", rank=4, targets=["q_proj"], seed=4)
    misplaced = edited(wide, tmp_path / "misplaced", {"base_model_name_or_path": str(models["base"])})
    report = json.loads(run_cli("inspect", str(misplaced), "--json").stdout)
    assert report["fits"] is False and "the base model needs [r, 64]" in report["fit_note"]
    unknown = edited(wide, tmp_path / "unknown", {"base_model_name_or_path": "nobody/nothing-here"})
    report = json.loads(run_cli("inspect", str(unknown), "--json").stdout)
    assert report["fits"] is None and "cannot be read here" in report["fit_note"]
    text = run_cli("inspect", str(models["a1"])).stdout
    assert "fits the base" in text and "q_proj, v_proj" in text and "--max-lora-rank 4" in text


def test_plan_counts_lora_slots_and_prints_commands_serve_accepts(default_source):
    import typer

    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.cli import app
    from llmctl.plan.gpus import lookup_gpu
    from llmctl.plan.planner import PlanRequest, build_plan
    from llmctl.sizing.lora import lora_slot_bytes

    spec = load_spec(default_source)
    plain = build_plan(spec, PlanRequest(gpu=lookup_gpu("l4")), "smol")
    with_lora = build_plan(spec, PlanRequest(gpu=lookup_gpu("l4"), max_loras=4, max_lora_rank=64), "smol")
    slots = lora_slot_bytes(spec, 4, 64, 2)
    assert with_lora.recommended.weights_bytes - plain.recommended.weights_bytes == slots
    assert any("LoRA: 4 adapter slots of rank 64" in note for note in with_lora.notes)
    [line] = [c for c in with_lora.commands if c.startswith("llmctl serve")]
    command = typer.main.get_command(app).commands["serve"]
    with command.make_context("serve", line.split()[2:]) as context:
        assert context.params["enable_lora"] and context.params["max_loras"] == 4
        assert context.params["max_lora_rank"] == 64
    bloom = load_spec(resolve_model("bigscience/bloom", weights=False))
    sharded = build_plan(bloom, PlanRequest(gpu=lookup_gpu("h100"), gpus=8, max_loras=2), "bigscience/bloom")
    assert not [c for c in sharded.commands if c.startswith("llmctl serve")]
    assert any("--enable-lora" in c for c in sharded.commands if c.startswith("vllm serve"))


def test_bench_offline_spreads_requests_over_adapters(tiny):
    from helpers.cli_process import run_cli

    models = tiny["llama"]
    common = ["bench", "offline", str(models["base"]), "--num-prompts", "6", "--random-input-len", "8",
              "--random-output-len", "4", "--max-model-len", "256", "--json"]
    result = run_cli(*common, "--enable-lora", "--lora-path", str(models["a1"]), "--max-loras", "2",
                     "--max-lora-rank", "8")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["lora_adapters"] == 2 and report["llmctl"]["output_tokens"] == 24
    result = run_cli(*common, "--lora-path", str(models["a1"]))
    assert result.returncode == 2 and "--enable-lora and --lora-path go together" in result.stderr
