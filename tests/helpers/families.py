"""Per-family configs and the engine-against-transformers checks the family tests share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from llmctl import LLM, SamplingParams

PROMPTS = ["The capital of France is", "Hello, my name is", "1, 2, 3, 4,", "def fibonacci(n):",
           "Once upon a time, in a land far away, there lived a king who had three daughters, and the youngest "
           "of them was the cleverest of all. One day",
           "The quick brown fox jumps over the lazy dog. " * 4, "Q: What is two plus two?\nA:", "import numpy as np\n"]


TOKENS = 64


TOLERANCE = 1e-3




def granite_config(vocab: int):
    from transformers import GraniteConfig

    # multipliers far from 1 so that each one changes the tokens (Granite 3's are 12, 0.22, 0.0078, 8)
    return GraniteConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.05,
                         logits_scaling=3.0, tie_word_embeddings=True)


def phi3_config(vocab: int, original_max: int = 32):
    from transformers import Phi3Config

    # LongRoPE with a pretraining length of 32: the long prompts start past it and every sequence crosses it
    # while it generates; partial rotary over half of each 16-dim head (Phi-4-mini rotates 3/4)
    factors = {"short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.5, 3.0, 6.0, 12.0]}
    return Phi3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      original_max_position_embeddings=original_max, partial_rotary_factor=0.5, sliding_window=None,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, **factors},
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def transformers_reference(folder: Path, tokenizer, model_class=None, prompts: list[str] = PROMPTS,
                           max_tokens: int = TOKENS, **load: Any) -> list[tuple[list[int], list[float], list[float]]]:
    """Greedy tokens, their log-probabilities and the prompt's, from transformers itself (eager attention:
    exact for every family, and the only one with Gemma 2's soft-cap); `load`: more from_pretrained arguments."""
    from transformers import AutoModelForCausalLM

    loader = model_class or AutoModelForCausalLM
    hf = loader.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager", **load).eval()
    out = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf.generate(ids, do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              output_logits=True,
                              return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
            prompt_logits = hf(ids).logits[0, :-1].log_softmax(-1)
        tokens = ref.sequences[0, ids.shape[1]:].tolist()
        sampled = [float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(ref.logits, tokens)]
        prompt_lp = [float(prompt_logits[i, t]) for i, t in enumerate(ids[0, 1:].tolist())]
        out.append((tokens, sampled, prompt_lp))
    return out


def engine_outputs(folder: Path, prompts: list[str] = PROMPTS, tokens: int = TOKENS, **engine_args):
    settings = {"max_model_len": 256, "max_num_batched_tokens": 16, "kv_cache_memory": 64 * 1024**2} | engine_args
    llm = LLM(str(folder), **settings)  # chunked prefill as well, unless engine_args say otherwise
    try:
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=0, prompt_logprobs=0)
        outputs = llm.generate(prompts, params)
        memory = llm.engine.executor.rank_memory if hasattr(llm.engine, "executor") else None
    finally:
        llm.shutdown()
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs],
             [lp.logprob for lp in o.prompt_logprobs[1:]]) for o in outputs], memory


def assert_close(reference, ours, prompts: list[str] = PROMPTS) -> None:
    assert len(reference) == len(ours) == len(prompts)
    for prompt, (tokens, sampled, prompt_lp), (our_tokens, our_sampled, our_prompt) in zip(prompts, reference, ours):
        assert our_tokens == tokens, prompt
        assert max(abs(a - b) for a, b in zip(sampled, our_sampled)) < TOLERANCE, prompt
        assert len(our_prompt) == len(prompt_lp)
        assert max(abs(a - b) for a, b in zip(prompt_lp, our_prompt)) < TOLERANCE, prompt


def assert_ranks_hold_what_plan_says(folder: Path, memory: list[tuple[int, int]] | None = None,
                                     expert_ranks: int = 0) -> None:
    """At TP 2, each rank's weights and KV pool are plan's numbers for that model (`memory`: a TP 2 run's;
    `expert_ranks`: the experts spread whole over that many ranks)."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.models.registry import is_supported
    from llmctl.plan.planner import stage_state_bytes
    from llmctl.sizing.kv import stage_kv
    from llmctl.sizing.memory import kv_pool, state_slots
    from llmctl.sizing.weights import pipeline_stages, stage_weights, weight_format

    spec = load_spec(resolve_model(str(folder)))
    assert is_supported(spec)
    if memory is None:
        _, memory = engine_outputs(folder, tensor_parallel_size=2)
    [weights] = stage_weights(spec, weight_format(4, None, spec), 2, 1, expert_ranks)
    [layers] = pipeline_stages(spec, 1)
    geometry = stage_kv(spec, 2, layers, 4, 16)
    block_bytes = geometry.block_bytes
    # recurrent layers: plan's state slots come out of the budget first (256 sequences of 256 tokens asked)
    per_sequence = stage_state_bytes(spec, layers, 4, tp=2)
    states = state_slots(64 * 1024**2, per_sequence, geometry.sequence_bytes(256, 16), 256) * per_sequence
    blocks = kv_pool(64 * 1024**2 - states, geometry).num_blocks
    for weights_bytes, kv_bytes in memory:
        assert weights_bytes == weights.total_bytes
        assert kv_bytes == blocks * block_bytes
    # the pool the engine allocated, against the KV formula from config.json alone (the planner above sizes the
    # engine's pool too, so it alone would agree with itself)
    per_token = config_kv_bytes_per_token(folder, tp=2)
    if per_token is not None:
        for _, kv_bytes in memory:
            assert kv_bytes == (64 * 1024**2 // (16 * per_token)) * 16 * per_token


def config_kv_bytes_per_token(folder: Path, tp: int, dtype_bytes: int = 4) -> int | None:
    """DESIGN.md's formula on config.json's own fields: 2 · layers · KV heads per rank · head_dim · bytes, or for
    MLA layers · (kv_lora_rank + qk_rope_head_dim) · bytes, replicated; None for sliding-window models, whose
    layers share pages by vLLM's hybrid grouping."""

    config = json.loads((folder / "config.json").read_text())
    if (config.get("sliding_window") and config.get("use_sliding_window", True)) or \
            set(config.get("layer_types") or ["full_attention"]) != {"full_attention"} or \
            config.get("model_type") in ("mamba", "falcon_mamba", "jamba", "mamba2", "granitemoehybrid", "qwen3_next", "nemotron_h",
                                          "falcon_h1"):
        return None  # layers that share pages, or keep a state instead of K/V
    layers = config["num_hidden_layers"]
    if config.get("kv_lora_rank"):
        return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * dtype_bytes
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * layers * max(1, kv_heads // tp) * head_dim * dtype_bytes


def quantize(folder: Path, method: str, out: Path) -> Path:
    from helpers.cli_process import run_cli
    from helpers.quant_helpers import WIKITEXT

    result = run_cli("quantize", str(folder), f"--{method}", "--group-size", "32", "--calib-file", str(WIKITEXT),
                     "--calib-samples", "4", "--calib-seq-len", "64", "--output", str(out), "--no-redistribute")
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def assert_served_like_transformers(folder: Path, tokenizer, model_class=None) -> None:
    """`llmctl serve` on the model answers the official openai client with transformers' greedy text."""
    import openai

    from helpers.server_helpers import start_server

    server = start_server(str(folder), "--served-model-name", "m", "--max-model-len", "256")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        served = client.completions.create(model="m", prompt=PROMPTS[4], max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True})
    finally:
        server.stop()
    [(reference, _, _)] = transformers_reference(folder, tokenizer, model_class, PROMPTS[4:5], 16)
    assert served.choices[0].text == tokenizer.decode(reference, skip_special_tokens=True)


PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def assert_peft_adapter_matches(folder: Path, tokenizer, tmp_path: Path, targets: list[str] = PROJECTIONS) -> None:
    """A random PEFT adapter on every projection: the engine's tokens are transformers + peft's."""
    from helpers.lora_helpers import PROMPTS as LORA_PROMPTS
    from helpers.lora_helpers import assert_matches, make_adapter, reference
    from llmctl import LoRARequest

    adapter = make_adapter(folder, tmp_path / "adapter", rank=4, seed=3, targets=targets)
    llm = LLM(str(folder), enable_lora=True, max_lora_rank=8, max_model_len=256)
    try:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
        outputs = llm.generate(LORA_PROMPTS, params, lora_request=LoRARequest("a", 1, str(adapter)))
    finally:
        llm.shutdown()
    assert_matches(outputs, reference(folder, adapter, tokenizer, LORA_PROMPTS, 12))


def save_routed_moe(config, folder: Path, tokenizer, model_class=None) -> Path:
    """A mixture of experts with random weights (`model_class`, else the causal LM of its config), a DeepSeek-V3-style
    router's correction bias (a buffer, zero when built) random too, so it steers routing."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = (model_class(config) if model_class else AutoModelForCausalLM.from_config(config)).to(torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0, 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def moe_config(family: str, vocab: int):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = dict(vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256)
    return {
        "mixtral": MixtralConfig(intermediate_size=48, num_hidden_layers=2, num_local_experts=8,
                                 num_experts_per_tok=2, **common),
        # a shared expert behind its gate; layer 0 dense (mlp_only_layers), top-4 of 16 without renormalising
        "qwen2-moe": Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                    num_hidden_layers=3, num_experts=16, num_experts_per_tok=4, norm_topk_prob=False,
                                    mlp_only_layers=[0], **common),
        "qwen3-moe": Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2, num_experts=8,
                                    num_experts_per_tok=2, head_dim=16, **common),
    }[family]


WINDOW = 8  # the prompts are 6–40 tokens: sliding layers drop keys that full layers still see


def gemma3_text_config(vocab: int):
    from transformers import Gemma3TextConfig

    # two sliding layers then a full one (the real pattern is 5:1); RoPE bases 10k locally and 1M ×8 linear
    # globally, as in Gemma 3 4B and larger
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}
    return Gemma3TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                            sliding_window=WINDOW, layer_types=["sliding_attention", "sliding_attention",
                                                                "full_attention"],
                            rope_parameters=rope, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2)


TP_PROMPTS = ["The capital of France is", "Hello, my name is", "def fibonacci(n):"]


def assert_tp2_equals_tp1(folder: Path, expert_parallel: bool) -> None:
    """TP 2 — every expert sliced, or whole experts spread (expert parallel) — gives TP 1's tokens, each rank
    holding the bytes plan says."""
    single, _ = engine_outputs(folder, TP_PROMPTS, tokens=24)
    spread, memory = engine_outputs(folder, TP_PROMPTS, tokens=24, tensor_parallel_size=2,
                                    enable_expert_parallel=expert_parallel)
    assert_close(single, spread, TP_PROMPTS)
    assert_ranks_hold_what_plan_says(folder, memory, expert_ranks=2 if expert_parallel else 0)


def assert_backend_matches_transformers(folder: Path, tokenizer, backend: str) -> None:
    """Two prompts × 6 tokens through one attention backend (Triton under the interpreter here) against
    transformers."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    ours, _ = engine_outputs(folder, prompts, tokens=6, attention_backend=backend)
    assert_close(transformers_reference(folder, tokenizer, prompts=prompts, max_tokens=6), ours, prompts)


def native_and_counted_as_transformers_counts(folder: Path):
    """The folder's ModelSpec, after checking that llmctl's own layers serve it and that its parameter count from
    config.json is transformers' own model's (random weights: every parameter counted once)."""
    from transformers import AutoModelForCausalLM

    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.params import count_from_config
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.models.registry import implementation

    spec = load_spec(resolve_model(str(folder), weights=False))
    assert implementation(spec) == ("llmctl", "")
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert count_from_config(spec).total == sum(p.numel() for p in hf.parameters())
    return spec


def assert_decodes_through_the_gpu_kernel(folder: Path, tokenizer, monkeypatch) -> None:
    """The recurrent layers' path on GPUs (the decode kernels of kernels/recurrent_decode.py, the prompt kernels of
    kernels/recurrent_prefill.py), forced on CPU tensors under Triton's interpreter: three prompts × 8 tokens equal
    transformers'."""
    from llmctl.engine.layers.recurrent_state import KERNELS_ON_CPU

    monkeypatch.setenv(KERNELS_ON_CPU, "1")
    prompts = PROMPTS[:3]
    ours, _ = engine_outputs(folder, prompts, tokens=8)
    assert_close(transformers_reference(folder, tokenizer, prompts=prompts, max_tokens=8), ours, prompts)
