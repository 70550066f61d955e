"""Families beyond Llama, BLOOM and OPT (issue 34), each built from its transformers config class
with random weights: 8 prompts × 64 greedy tokens identical to transformers, prompt and sampled
log-probabilities within 1e-3, TP 2 equal to TP 1, and plan's numbers equal to what the engine holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.families import (
    PROJECTIONS,
    PROMPTS,
    assert_close,
    assert_peft_adapter_matches,
    assert_ranks_hold_what_plan_says,
    assert_served_like_transformers,
    engine_outputs,
    granite_config,
    phi3_config,
    quantize,
    transformers_reference,
)
from helpers.models import save_random_model

pytestmark = pytest.mark.subprocess


def qwen3_config(vocab: int):
    from transformers import Qwen3Config

    # head_dim 32 is not hidden / heads (16), as in the real Qwen3 sizes; 2 KV heads: GQA
    return Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                       tie_word_embeddings=False)


def olmo2_config(vocab: int):
    from transformers import Olmo2Config

    return Olmo2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=False)


FAMILIES = {"qwen3": qwen3_config, "granite": granite_config, "olmo2": olmo2_config, "phi3": phi3_config}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("families")
    return {name: save_random_model(make(len(tokenizer)), tmp / name, tokenizer) for name, make in FAMILIES.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_tokens_and_logprobs_equal_transformers(models, tokenizer, family):
    ours, _ = engine_outputs(models[family])
    assert_close(transformers_reference(models[family], tokenizer), ours)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_triton_backend_equals_transformers(models, tokenizer, family):
    """Under Triton's interpreter on this CPU (compiled on a GPU): the two longest prompts, 16 tokens."""
    prompts = PROMPTS[4:6]
    ours, _ = engine_outputs(models[family], prompts, 16, attention_backend="triton")
    assert_close(transformers_reference(models[family], tokenizer, prompts=prompts, max_tokens=16), ours, prompts)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tp2_equals_tp1(models, family):
    single, _ = engine_outputs(models[family])
    sharded, memory = engine_outputs(models[family], tensor_parallel_size=2)
    assert len(memory) == 2
    for (tokens, sampled, prompt_lp), (their_tokens, their_sampled, their_prompt) in zip(single, sharded):
        assert their_tokens == tokens
        assert max(abs(a - b) for a, b in zip(sampled + prompt_lp, their_sampled + their_prompt)) <= 1e-4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_rank_holds_what_plan_says_and_plan_names_the_engine(models, family):
    assert_ranks_hold_what_plan_says(models[family])


def test_olmo2_norms_the_whole_projection_when_tp_replicates_a_kv_head(models):
    """TP 4 over 2 KV heads: each K head is on two ranks, and the norm over the whole K projection
    counts it once."""
    single, _ = engine_outputs(models["olmo2"])
    sharded, memory = engine_outputs(models["olmo2"], tensor_parallel_size=4)
    assert len(memory) == 4
    for (tokens, sampled, _), (their_tokens, their_sampled, _) in zip(single, sharded):
        assert their_tokens == tokens and max(abs(a - b) for a, b in zip(sampled, their_sampled)) <= 1e-4


QUANTIZABLE = ["qwen3", "granite", "olmo2"]  # GPTQ; OLMo 2 refuses AWQ (below); Phi-3 has its own test


@pytest.mark.parametrize("family", QUANTIZABLE)
def test_llmctl_quantize_writes_a_checkpoint_the_engine_serves(models, family, tmp_path):
    from helpers.quant_helpers import assert_engine_matches_dense
    from llmctl.checkpoint.quant_formats import unpack_gptq

    out = quantize(models[family], "gptq", tmp_path / f"{family}-gptq")
    assert_engine_matches_dense(out, lambda parts: unpack_gptq(parts, 4, 32), PROMPTS[0])


def test_phi3_gptq_keeps_qkv_and_gate_up_fused_and_tp2_splits_them(models, tmp_path):
    """Phi-3 is quantized as GPTQModel does it: qkv_proj and gate_up_proj whole. The engine takes each
    part's columns of the packed tensors (served like transformers on the unpacked weights); with TP 2
    each rank's columns, and the tokens are TP 1's."""
    from safetensors import safe_open

    from helpers.quant_helpers import assert_engine_matches_dense
    from llmctl.checkpoint.quant_formats import unpack_gptq

    out = quantize(models["phi3"], "gptq", tmp_path / "phi3-gptq")
    assert_engine_matches_dense(out, lambda parts: unpack_gptq(parts, 4, 32), PROMPTS[0])
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        assert handle.get_slice("model.layers.0.self_attn.qkv_proj.qweight").get_shape() == [64 // 8, 64 + 2 * 32]
    assert "model.layers.0.mlp.gate_up_proj.scales" in names and not any("q_proj" in n for n in names)
    single, _ = engine_outputs(out, PROMPTS[3:5], tokens=16)
    sharded, _ = engine_outputs(out, PROMPTS[3:5], tokens=16, tensor_parallel_size=2)
    for (tokens, sampled, _), (their_tokens, their_sampled, _) in zip(single, sharded):
        assert their_tokens == tokens and max(abs(a - b) for a, b in zip(sampled, their_sampled)) <= 1e-4


def test_phi3_awq_folds_into_the_v_and_up_rows_of_the_fused_projections(tokenizer, tmp_path):
    """Without KV-head sharing AWQ also scales v → o: on Phi-3 the previous op is qkv_proj's v rows (and
    gate_up_proj's up rows before down_proj). Served like transformers on the unpacked weights."""
    from helpers.quant_helpers import assert_engine_matches_dense
    from llmctl.checkpoint.quant_formats import unpack_awq

    config = phi3_config(len(tokenizer))
    config.num_key_value_heads = 4
    folder = save_random_model(config, tmp_path / "phi3-mha", tokenizer)
    out = quantize(folder, "awq", tmp_path / "phi3-awq")
    assert_engine_matches_dense(out, lambda parts: unpack_awq(parts, 32), PROMPTS[4])


def test_awq_scale_groups_of_a_phi3_layer_leave_it_unchanged(tokenizer):
    """Every AWQ group of transformers' own Phi3DecoderLayer (MHA: all four), scaled by random s and folded
    into the op before: the layer computes what it did (before rounding)."""
    from transformers.models.phi3.modeling_phi3 import Phi3DecoderLayer, Phi3RotaryEmbedding

    from llmctl.quant.awq import apply_scales
    from llmctl.quant.pipeline import _scale_groups

    torch.manual_seed(0)
    config = phi3_config(len(tokenizer))
    config.num_key_value_heads, config._attn_implementation = 4, "eager"
    layer = Phi3DecoderLayer(config, 0).eval()
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0, 0.2)
    x = torch.randn(2, 12, 64)
    cos_sin = Phi3RotaryEmbedding(config)(x, torch.arange(12)[None])
    mask = torch.full((12, 12), float("-inf")).triu(1)[None, None]

    def run(h):
        cos, sin = (t.expand(h.shape[0], *t.shape[1:]) for t in cos_sin)
        return layer(h, attention_mask=mask, position_embeddings=(cos, sin))

    with torch.no_grad():
        before = run(x)
        groups = _scale_groups(layer, x, run, lambda h: h)
        assert len(groups) == 4 and groups[1].previous is layer.self_attn.qkv_proj
        for group in groups:
            apply_scales(group, torch.rand(group.inputs.shape[-1]) + 0.5)
        torch.testing.assert_close(run(x), before, atol=1e-5, rtol=1e-4)


def test_awq_on_olmo2_is_one_clear_refusal(models, tmp_path):
    from helpers.cli_process import run_cli

    result = run_cli("quantize", str(models["olmo2"]), "--awq", "--no-redistribute", "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--awq: OLMo 2 norms each block's output" in result.stderr and "use --gptq" in result.stderr


# Qwen3's generation prompt as its own chat template writes it: enable_thinking=false pre-fills an empty
# think block (the rest of the real template, tools and history handling, is not what is tested here)
QWEN3_TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                  "{%- if add_generation_prompt %}<|im_start|>assistant\n"
                  "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
                  "{%- endif %}{%- endif %}")


def test_qwen3_served_with_the_openai_client_and_enable_thinking(models, tokenizer, tmp_path):
    import urllib.request

    import openai

    from helpers.server_helpers import start_server

    template = tmp_path / "qwen3.jinja"
    template.write_text(QWEN3_TEMPLATE)
    server = start_server(str(models["qwen3"]), "--served-model-name", "qwen3", "--chat-template", str(template),
                          "--max-model-len", "256")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        served = client.completions.create(model="qwen3", prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True})
        reference = transformers_reference(models["qwen3"], tokenizer)[0][0][:16]
        assert served.choices[0].text == tokenizer.decode(reference, skip_special_tokens=True)

        def tokenize(kwargs: dict | None) -> tuple[int, dict]:
            body = {"model": "qwen3", "messages": [{"role": "user", "content": "Hi"}]}
            if kwargs is not None:
                body["chat_template_kwargs"] = kwargs
            request = urllib.request.Request(server.url + "/tokenize", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        _, thinking = tokenize(None)
        _, direct = tokenize({"enable_thinking": False})
        assert "<think>" in tokenizer.decode(direct["tokens"]) and "<think>" not in tokenizer.decode(thinking["tokens"])
        chat = client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2, extra_body={"chat_template_kwargs": {"enable_thinking":
                                                                                                 False}})
        assert chat.usage.prompt_tokens == direct["count"]
        for bad, what in (({"tokenize": True}, "may not set tokenize"), ("no", "must be an object")):
            status, error = tokenize(bad)
            assert status == 400 and what in error["error"]["message"]
    finally:
        server.stop()


@pytest.mark.parametrize("family", ["granite", "olmo2", "phi3"])  # Qwen3 is served in the test above
def test_served_with_the_openai_client(models, tokenizer, family):
    assert_served_like_transformers(models[family], tokenizer)


LORA_FAMILIES = ["qwen3", "granite", "olmo2", "phi3"]
PHI3_PROJECTIONS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]  # PEFT trains Phi-3's fused ones whole


@pytest.mark.parametrize("family", LORA_FAMILIES)
def test_a_peft_adapter_matches_transformers_with_peft(models, tokenizer, family, tmp_path):
    assert_peft_adapter_matches(models[family], tokenizer, tmp_path,
                                PHI3_PROJECTIONS if family == "phi3" else PROJECTIONS)


