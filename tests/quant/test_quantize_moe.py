"""`llmctl quantize --gptq` on mixtures of experts (Qwen3-MoE, Mixtral, Qwen2-MoE with its shared expert): every
routed expert packed under the names vLLM and GPTQModel read, the router left 16-bit, and llmctl's engine on the
packed folder equal to transformers on the weights unpacked by the formats module and loaded through
transformers' own checkpoint conversion (per-expert tensors into its stacked ones)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.cli_process import run_cli
from helpers.quant_helpers import WIKITEXT, assert_engine_matches_dense
from llmctl.checkpoint.quant_formats import unpack_gptq

pytestmark = [pytest.mark.subprocess]


def moe_config(family: str, tokenizer):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = dict(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    return {
        "qwen3_moe": lambda: Qwen3MoeConfig(intermediate_size=256, moe_intermediate_size=64, num_experts=4,
                                            num_experts_per_tok=2, head_dim=32, **common),
        "mixtral": lambda: MixtralConfig(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, **common),
        "qwen2_moe": lambda: Qwen2MoeConfig(intermediate_size=256, moe_intermediate_size=64, num_experts=4,
                                            shared_expert_intermediate_size=128, num_experts_per_tok=2, **common),
    }[family]()


def _from_disk_names(folder: Path, state: dict) -> torch.nn.Module:
    """transformers' reference built as a user loads a checkpoint: the per-expert tensors saved as they are on
    disk and read back by from_pretrained, which stacks them into its own expert tensors."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    save_file({name: t.contiguous() for name, t in state.items()}, str(folder / "model.safetensors"))
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize("family, expert_prefix", [("qwen3_moe", "mlp.experts"), ("mixtral", "block_sparse_moe.experts"),
                                                   ("qwen2_moe", "mlp.experts")])
def test_gptq_quantizes_every_expert_and_the_engine_matches_transformers(family, expert_prefix, tokenizer,
                                                                         tmp_path):
    from safetensors import safe_open

    from helpers.models import save_random_model

    base = save_random_model(moe_config(family, tokenizer), tmp_path / family, tokenizer)
    out = tmp_path / f"{family}-gptq"
    result = run_cli("quantize", str(base), "--gptq", "--group-size", "32", "--calib-file", str(WIKITEXT),
                     "--calib-samples", "8", "--calib-seq-len", "64", "--no-redistribute", "-o", str(out))
    assert result.returncode == 0, result.stderr
    with safe_open(out / "model.safetensors", "pt") as stored:
        names = set(stored.keys())
    projections = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    assert {f"model.layers.{i}.{expert_prefix}.{e}.{p}.qweight" for i in range(2) for e in range(4)
            for p in projections} <= names
    router = f"model.layers.0.{expert_prefix.rsplit('.', 1)[0]}.gate.weight"
    assert router in names and not any(".gate.qweight" in name or "shared_expert_gate.qweight" in name
                                       for name in names)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "gptq"
    assert_engine_matches_dense(out, lambda parts: unpack_gptq(parts, 4, 32), "The capital of France is",
                                _from_disk_names)


def test_awq_and_schemes_refuse_experts_by_name(tokenizer, tmp_path):
    from helpers.models import save_random_model

    base = save_random_model(moe_config("qwen3_moe", tokenizer), tmp_path / "moe", tokenizer)
    awq = run_cli("quantize", str(base), "--awq", "--no-redistribute", "-o", str(tmp_path / "a"))
    assert awq.returncode != 0 and "routed experts is not built" in awq.stderr and "Traceback" not in awq.stderr
    scheme = run_cli("quantize", str(base), "--scheme", "w4a16", "--no-redistribute", "-o", str(tmp_path / "s"))
    assert scheme.returncode != 0 and "mixture-of-experts" in scheme.stderr and "Traceback" not in scheme.stderr
