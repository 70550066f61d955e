"""BLOOM (ALiBi) and OPT (learned positions) with random weights from real-shaped configs,
and the Llama path with QKV bias (Qwen2) and untied heads, against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.families import phi3_config
from helpers.models import save_random_model, small_config
from helpers.paths import FIXTURES
from llmctl import LLM, SamplingParams
from llmctl.errors import UnsupportedModelError

PROMPTS = ["The capital of France is", "Hello, my name is", "1, 2, 3, 4,"]


def compare_with_transformers(folder: Path, tokenizer, max_tokens: int = 12, **engine_args) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    engine_args.setdefault("dtype", "float32")  # as the reference computes, on a GPU too (its default is bf16)
    llm = LLM(str(folder), max_model_len=256, max_num_batched_tokens=7, **engine_args)  # chunked prefill too
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    outputs = llm.generate(PROMPTS, params)
    for prompt, output in zip(PROMPTS, outputs):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf.generate(ids, do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                              eos_token_id=None)
        tokens = ref.sequences[0, ids.shape[1]:].tolist()
        assert output.outputs[0].token_ids == tokens, prompt
        ref_lp = [float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(ref.logits, tokens)]
        ours = [lp.logprob for lp in output.outputs[0].logprobs]
        assert max(abs(a - b) for a, b in zip(ours, ref_lp)) < 1e-3


def test_bloom_alibi(tmp_path, tokenizer):
    from transformers import BloomConfig

    config = BloomConfig(vocab_size=len(tokenizer), hidden_size=64, n_layer=3, n_head=4,  # BLOOM-560m shape,
                         layer_norm_epsilon=1e-5, apply_residual_connection_post_layernorm=False)  # scaled down
    compare_with_transformers(save_random_model(config, tmp_path / "bloom", tokenizer), tokenizer)


def test_bloom_with_head_count_not_a_power_of_two(tmp_path, tokenizer):
    from transformers import BloomConfig

    config = BloomConfig(vocab_size=len(tokenizer), hidden_size=72, n_layer=2, n_head=6)
    compare_with_transformers(save_random_model(config, tmp_path / "bloom6", tokenizer), tokenizer)


def test_opt_learned_positions(tmp_path, tokenizer):
    from transformers import OPTConfig

    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=3, ffn_dim=256,
                       num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=64)
    compare_with_transformers(save_random_model(config, tmp_path / "opt", tokenizer), tokenizer)


def test_opt_350m_style_projection_and_post_norm(tmp_path, tokenizer):
    from transformers import OPTConfig

    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                       num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=32,
                       do_layer_norm_before=False)
    compare_with_transformers(save_random_model(config, tmp_path / "opt350", tokenizer), tokenizer)


def test_qwen2_qkv_bias_untied_head_and_llama3_rope(tmp_path, tokenizer):
    from transformers import Qwen2Config

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False)
    folder = save_random_model(config, tmp_path / "qwen2", tokenizer, max_shard_size="2MB")
    assert len(list(folder.glob("*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").exists()
    compare_with_transformers(folder, tokenizer)


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64, "rope_theta": 500000.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0},
])
def test_llama_rope_scaling(tmp_path, tokenizer, rope_parameters):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                         rope_parameters=rope_parameters)
    compare_with_transformers(save_random_model(config, tmp_path / "llama", tokenizer), tokenizer)


def test_unsupported_architecture_lists_supported(tmp_path, tokenizer):
    from transformers import GPT2Config

    folder = save_random_model(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2),
                               tmp_path / "gpt2", tokenizer)
    with pytest.raises(UnsupportedModelError, match="native architectures: LlamaForCausalLM"):
        LLM(str(folder), model_impl="llmctl")  # auto runs it through transformers (tests/engine/models/test_transformers_impl.py)


def test_mistral_sliding_window(tmp_path, tokenizer):
    from transformers import MistralConfig

    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           sliding_window=5)  # shorter than the prompts, so the window matters
    compare_with_transformers(save_random_model(config, tmp_path / "mistral", tokenizer), tokenizer)


def test_sliding_window_long_generation_on_a_small_pool(tmp_path, tokenizer):
    """Blocks that slide out of the window go back to the pool: a generation many times longer than
    the pool holds runs to its end, two at once (with preemption), token for token as transformers."""
    from transformers import AutoModelForCausalLM, MistralConfig

    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           sliding_window=32)
    folder = save_random_model(config, tmp_path / "mistral-long", tokenizer)
    args = {"max_model_len": 512, "max_num_batched_tokens": 16, "dtype": "float32"}  # float32 as the reference
    block_bytes = LLM(str(folder), **args).engine.loaded.kv_geometry.block_bytes
    llm = LLM(str(folder), kv_cache_memory=6 * block_bytes, **args)
    manager = llm.engine.block_manager
    assert manager.num_blocks == 6  # one sequence of 200+ tokens alone would need 14 blocks without the window
    max_tokens = 200
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    for prompt, output in zip(PROMPTS, outputs):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf.generate(ids, do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              pad_token_id=0, eos_token_id=None)
        assert output.outputs[0].finish_reason == "length" and len(output.outputs[0].token_ids) == max_tokens
        assert output.outputs[0].token_ids == ref[0, ids.shape[1]:].tolist(), prompt
    assert llm.engine.scheduler.num_preemptions > 0  # three sequences did not fit side by side all the time
    assert manager.num_free_blocks == manager.num_blocks


def test_pickled_weights_only_when_allowed(tmp_path, tokenizer):
    import shutil

    from safetensors.torch import load_file
    from transformers import LlamaConfig

    from helpers.cli_process import run_cli
    from llmctl.errors import CorruptModelError

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    safe = save_random_model(config, tmp_path / "safe", tokenizer)
    pickled = Path(shutil.copytree(safe, tmp_path / "pickled"))
    torch.save(load_file(str(pickled / "model.safetensors")), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    with pytest.raises(CorruptModelError, match="--allow-pickle-weights"):
        LLM(str(pickled), max_model_len=128)
    result = run_cli("serve", str(pickled), "--port", "0")
    assert result.returncode == 2 and "--allow-pickle-weights" in result.stderr
    assert "Traceback" not in result.stderr
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = LLM(str(safe), max_model_len=128).generate(PROMPTS, params)
    allowed = LLM(str(pickled), max_model_len=128, allow_pickle_weights=True).generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in allowed] == [o.outputs[0].token_ids for o in expected]


def test_a_folder_without_weights_fails_before_the_model_is_built(tmp_path, tokenizer, monkeypatch):
    """On a GPU, building a large model before looking for its weights ran out of memory (an H100, a 72B
    config): the weight files are found first, so the error says what is missing."""
    from transformers import LlamaConfig

    from llmctl.engine.worker import loader
    from llmctl.errors import CorruptModelError

    LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    def build_too_early(*args, **kwargs):
        raise AssertionError("the model was built before its weight files were looked for")

    monkeypatch.setattr(loader, "create_model", build_too_early)
    with pytest.raises(CorruptModelError, match=r"no \*\.safetensors weights"):
        LLM(str(tmp_path), max_model_len=64)


def test_remote_code_never_runs_without_the_flag(tmp_path):
    """A repository whose config points at its own Python (auto_map): serving it must not import that code."""
    from helpers.cli_process import run_cli

    folder = tmp_path / "qwen1"
    folder.mkdir()
    fixture = FIXTURES / "hub" / "Qwen" / "Qwen-72B" / "config.json"
    (folder / "config.json").write_text(fixture.read_text())
    marker = tmp_path / "remote-code-ran"
    code = f"open({str(marker)!r}, 'w').close()\nfrom transformers import PretrainedConfig\n" \
           "class QWenConfig(PretrainedConfig):\n    model_type = 'qwen'\n"
    (folder / "configuration_qwen.py").write_text(code)
    (folder / "modeling_qwen.py").write_text(code)
    result = run_cli("serve", str(folder), "--port", "0")  # Qwen (1) is served natively: no remote code needed
    assert result.returncode == 2 and "no *.safetensors" in result.stderr and "Traceback" not in result.stderr
    config = json.loads(fixture.read_text())
    config.update(architectures=["FooForCausalLM"], model_type="foo",
                  auto_map={"AutoConfig": "configuration_qwen.QWenConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    result = run_cli("serve", str(folder), "--port", "0")
    assert result.returncode == 2 and "--trust-remote-code" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()


# On CPUs the default is the `cpu` backend (every test above runs it: chunks of <= 7 tokens on top
# of the cache go through the C++ kernel next to decodes); `torch` is its reference and stays exact too.
@pytest.mark.parametrize("family", ["llama-gqa", "bloom-alibi", "mistral-window"])
def test_torch_reference_backend_matches_transformers(tmp_path, tokenizer, family):
    compare_with_transformers(save_random_model(small_config(family, tokenizer), tmp_path / family, tokenizer),
                              tokenizer, max_tokens=6, attention_backend="torch")


def test_cpu_backend_falls_back_to_torch_when_the_kernel_cannot_be_built(tmp_path, tokenizer, monkeypatch, caplog):
    from llmctl.engine.errors import EngineConfigError
    from llmctl.kernels import cpu

    def cannot_build():
        raise cpu.CPUKernelsUnavailable("cannot build llmctl's C++ CPU attention kernel: no C++ compiler")

    folder = save_random_model(small_config("llama-gqa", tokenizer), tmp_path / "l", tokenizer)
    monkeypatch.setattr(cpu, "load", cannot_build)
    monkeypatch.setattr(cpu, "unavailable_reason", lambda: "no C++ compiler")  # the fused layers fall back too
    with caplog.at_level("INFO", logger="llmctl"):
        llm = LLM(str(folder), max_model_len=64, device="cpu")
    assert llm.engine.executor.runner.backend.name == "torch"
    assert "no C++ compiler; attending with torch SDPA instead" in caplog.text
    with pytest.raises(EngineConfigError, match=r"--attention-backend cpu: .*no C\+\+ compiler.*torch"):
        LLM(str(folder), attention_backend="cpu", device="cpu")
    monkeypatch.undo()
    with pytest.raises(EngineConfigError, match="--attention-backend cpu: .*fp8.*--attention-backend torch"):
        LLM(str(folder), attention_backend="cpu", kv_cache_dtype="fp8", device="cpu")


# The Triton backend: compiled on a GPU, under Triton's interpreter on this CPU (conftest sets
# TRITON_INTERPRET=1). Small models, few tokens: the interpreter runs every program in Python.
@pytest.mark.parametrize("family", ["llama-gqa", "bloom-alibi", "mistral-window"])
def test_triton_attention_backend_matches_transformers(tmp_path, tokenizer, family):
    compare_with_transformers(save_random_model(small_config(family, tokenizer), tmp_path / family, tokenizer),
                              tokenizer, max_tokens=6, attention_backend="triton")


def test_triton_backend_on_cpu_without_the_interpreter_is_one_clear_line(tmp_path, tokenizer, monkeypatch):
    from transformers import LlamaConfig

    from llmctl.engine.errors import EngineConfigError

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    folder = save_random_model(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2), tmp_path / "l", tokenizer)
    if torch.cuda.is_available():
        pytest.skip("with a GPU the Triton backend runs compiled")
    with pytest.raises(EngineConfigError, match="--attention-backend triton: .*use --attention-backend torch"):
        LLM(str(folder), attention_backend="triton")


def test_fp8_kv_cache(tmp_path, tokenizer):
    """--kv-cache-dtype fp8 (e4m3) and fp8_e5m2: a quarter of float32's KV bytes (what plan counts), both
    backends read the same stored bytes, and outputs stay near full precision."""
    from transformers import LlamaConfig

    from llmctl.sizing.kv import stage_kv

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    folder = save_random_model(config, tmp_path / "llama", tokenizer)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    runs = {}
    formats = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    engines = {}
    for name, args in {"full": {}, "fp8": {"kv_cache_dtype": "fp8"},
                       "fp8-triton": {"kv_cache_dtype": "fp8", "attention_backend": "triton"},
                       "fp8_e5m2": {"kv_cache_dtype": "fp8_e5m2"},
                       "fp8_e5m2-triton": {"kv_cache_dtype": "fp8_e5m2", "attention_backend": "triton"}}.items():
        # 4 sequences at most: on a GPU each engine captures CUDA graphs for its batch sizes; with the default
        # 256 this test ran past its 60 s limit on an H100
        llm = engines[name] = LLM(str(folder), max_model_len=256, max_num_batched_tokens=7, max_num_seqs=4,
                                  dtype="float32", **args)
        runs[name] = llm.generate(PROMPTS, params)
        loaded = llm.engine.loaded
        assert loaded.kv_geometry.block_bytes == stage_kv(loaded.spec, 1, range(2), 1 if args else 4, 16).block_bytes
        assert {c.kv.dtype for c in loaded.kv_caches.values()} == \
            {formats[args["kv_cache_dtype"]] if args else torch.float32}
    for kv in formats:
        for torch_out, triton_out in zip(runs[kv], runs[f"{kv}-triton"]):
            assert torch_out.outputs[0].token_ids == triton_out.outputs[0].token_ids, kv
            pairs = zip(torch_out.outputs[0].logprobs, triton_out.outputs[0].logprobs)
            assert max(abs(a.logprob - b.logprob) for a, b in pairs) < 1e-3, kv
    # against full precision, on the same tokens (a random model's near-uniform logits let a rounded cache flip a
    # greedy tie): full precision's sequences scored through each cache. e4m3 keeps 3 mantissa bits, e5m2 2 (a
    # relative error of up to 2^-4 and 2^-3 per element): log-probabilities move ~0.01 and ~0.03 here
    sequences = [{"prompt_token_ids": out.prompt_token_ids + out.outputs[0].token_ids} for out in runs["full"]]
    scoring = SamplingParams(max_tokens=1, prompt_logprobs=0)
    scored = {name: engines[name].generate(sequences, scoring) for name in ("full", *formats)}
    for kv, tolerance in (("fp8", 0.05), ("fp8_e5m2", 0.1)):
        for full, rounded in zip(scored["full"], scored[kv]):
            pairs = list(zip(full.prompt_logprobs[1:], rounded.prompt_logprobs[1:]))
            assert len(pairs) > 6 and max(abs(a.logprob - b.logprob) for a, b in pairs) < tolerance, kv


def test_the_profile_step_is_a_real_step_of_the_largest_size(tmp_path, tokenizer):
    """On a GPU the KV pool leaves room for the activation peak of this step (measured with CUDA's
    allocator statistics); here the step itself runs, through every layer, on throwaway caches."""
    from llmctl.engine.layers.attention import KVCache
    from llmctl.engine.worker.profile import dummy_prefill, run_dummy_step

    batch, blocks = dummy_prefill(100, 40, 16)
    assert batch.num_tokens == 100 and batch.seq_lens == [40, 40, 20] and blocks == 3 + 3 + 2
    assert len(set(batch.slot_mapping)) == 100 and max(batch.slot_mapping) < blocks * 16
    folder = save_random_model(small_config("llama-gqa", tokenizer), tmp_path / "l", tokenizer)
    loaded = LLM(str(folder), max_model_len=64).engine.loaded  # random weights: K and V are not zero
    caches = {layer: KVCache(torch.zeros(blocks, 16, *cache.kv.shape[2:], dtype=cache.kv.dtype, device=cache.kv.device))
              for layer, cache in loaded.kv_caches.items()}
    run_dummy_step(loaded.model, caches, loaded.backend, batch, 16, loaded.device, loaded.spec.hidden_size,
                   first_stage=True, last_stage=True, sampler_rows=8)  # and the sampler, top-k and top-p, on 8 rows
    for cache in caches.values():  # every layer stored K/V for all 100 tokens
        assert cache.kv.flatten(0, 1)[torch.tensor(batch.slot_mapping)].abs().sum(dim=(1, 2, 3)).gt(0).all()


def graph_test_model(tmp_path, tokenizer, family: str) -> Path:
    from transformers import BloomConfig, Gemma3TextConfig, LlamaConfig

    config = {"llama-gqa": LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2),
              "bloom-alibi": BloomConfig(vocab_size=len(tokenizer), hidden_size=72, n_layer=2, n_head=6),
              # hybrid KV cache: a sliding group (window 8) and a full group, each with its own block table
              "gemma3-hybrid": Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                                layer_types=["sliding_attention", "full_attention"],
                                                max_position_embeddings=256),
              # LongRoPE: each token's sequence length picks its factors (the graphs' static lengths)
              "phi3-longrope": phi3_config(len(tokenizer), original_max=16)}[family]
    return save_random_model(config, tmp_path / family, tokenizer)


def generate_through_graphs(folder: Path, tokenizer, capture: bool, max_tokens: int = 5, **engine) -> LLM:
    """Decode steps through the graphs' static buffers (3 sequences in the size-4 buffers, a padding
    row storing nothing): captured and replayed on a GPU, the same path run eagerly elsewhere."""
    from transformers import AutoModelForCausalLM

    llm = LLM(str(folder), max_model_len=128, max_num_seqs=4, attention_backend="triton",
              device="cuda" if capture else "auto", dtype="float32", graph_buffers_on_cpu=not capture, **engine)
    executor = llm.engine.executor
    graphs = executor.runner.graphs
    assert graphs is not None and bool(graphs.graphs) == capture
    replays: list[tuple[int, int]] = []  # (sequences, new tokens each) of every step through the buffers
    run = graphs.run
    graphs.run = lambda batch, shape, *rest: replays.append((len(batch.seq_lens), shape[1])) or run(batch, shape, *rest)
    assert executor.runner.tables.device is not None  # the graphs' block tables come from the device copy
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    assert any(rows == 3 for rows, _ in replays)  # the three prompts decoded together, in the size-4 buffers
    llm.replays = replays
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
    for prompt, output in zip(PROMPTS, outputs):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf.generate(ids, do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              pad_token_id=0, eos_token_id=None)
        assert output.outputs[0].token_ids == ref[0, ids.shape[1]:].tolist(), prompt
    return llm


# tokens, engine settings: gemma3's 5-token prompts pass their block 0 (blocks of 8) out of the window (8) of the
# sliding group by token 12, which then gives the block back while the full group keeps it
GRAPH_FAMILIES = {"llama-gqa": (5, {}), "bloom-alibi": (5, {}), "gemma3-hybrid": (12, {"block_size": 8}),
                  "phi3-longrope": (14, {})}  # 5- to 8-token prompts pass LongRoPE's 16 while decoding


@pytest.mark.parametrize("family", list(GRAPH_FAMILIES))
def test_decode_steps_through_the_cuda_graph_buffers_match_transformers(tmp_path, tokenizer, family):
    from llmctl.engine.worker.cuda_graphs import capture_sizes

    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20] and capture_sizes(256)[-2:] == [248, 256]
    max_tokens, engine = GRAPH_FAMILIES[family]
    generate_through_graphs(graph_test_model(tmp_path, tokenizer, family), tokenizer, capture=False,
                            max_tokens=max_tokens, **engine)


def test_async_scheduling_through_the_cuda_graph_buffers_matches_transformers(tmp_path, tokenizer):
    """--async-scheduling's placeholders written into the graphs' static ids on the device."""
    llm = generate_through_graphs(graph_test_model(tmp_path, tokenizer, "llama-gqa"), tokenizer, capture=False,
                                  max_tokens=6, async_scheduling=True)
    assert llm.engine.steps_ahead >= 4


CAPTURED = pytest.param(True, marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                             reason="CUDA graphs need a CUDA GPU")])


@pytest.mark.parametrize("capture", [False, CAPTURED])
def test_speculative_verification_through_the_cuda_graph_buffers_matches_transformers(tmp_path, tokenizer, capture):
    """A draft model (here the target itself: every proposal is accepted) proposes 2 tokens per sequence:
    the verification steps of 3 new tokens each replay their own graphs."""
    folder = graph_test_model(tmp_path, tokenizer, "llama-gqa")
    llm = generate_through_graphs(folder, tokenizer, capture=capture, max_tokens=7,
                                  speculative_config={"model": str(folder), "num_speculative_tokens": 2})
    assert (3, 3) in llm.replays and llm.engine.speculator.stats.num_accepted_tokens > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("family", list(GRAPH_FAMILIES))
def test_captured_cuda_graphs_replay_what_transformers_generates(tmp_path, tokenizer, family):
    max_tokens, engine = GRAPH_FAMILIES[family]
    generate_through_graphs(graph_test_model(tmp_path, tokenizer, family), tokenizer, capture=True,
                            max_tokens=max_tokens, **engine)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the activation peak is measured with CUDA's allocator")
def test_gpu_kv_pool_leaves_the_measured_activation_peak(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="llmctl.engine"):
        small = LLM(None, device="cuda", max_num_batched_tokens=256).engine.loaded
        large = LLM(None, device="cuda", max_num_batched_tokens=4096).engine.loaded
    assert 0 < small.activation_peak_bytes < large.activation_peak_bytes  # it grows with the step
    assert any("activation peak (measured at 4096 tokens)" in r.getMessage() for r in caplog.records)
