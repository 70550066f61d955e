"""Native families against a Llama of the same size: `llmctl bench offline` on random-weight models with
SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads / 3 KV heads of 64, MLP 1536; the recurrent families' mixers
of the same width), runs alternating
between the models so that machine noise spreads over all of them; prints each model's median output
tok/s and its ratio to the Llama's.

    python benchmarks/families.py [--families gemma2 gemma3 mamba mamba2 granite_h nemotron_h falcon_h1 qwen3_5]
        [--runs 5]
        [--workdir /tmp/llmctl-families]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
             num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=2048)
WORKLOAD = ["--num-prompts", "32", "--random-input-len", "128", "--random-output-len", "64"]


def config(family: str):
    import transformers

    if family == "llama":
        return transformers.LlamaConfig(**SHAPE)
    if family == "gemma2":  # the real soft-caps and window (50, 30, 4096): on CPUs the torch backend runs it
        return transformers.Gemma2Config(**SHAPE, query_pre_attn_scalar=64)
    if family == "gemma3":  # Gemma 3 1B's pattern: 5 sliding layers of 512 per full one
        return transformers.Gemma3TextConfig(**SHAPE, query_pre_attn_scalar=64, sliding_window=512)
    if family == "qwen3":
        return transformers.Qwen3Config(**SHAPE)
    layers = SHAPE["num_hidden_layers"]
    if family == "mamba2":  # every layer a mixer of 18 heads × 64 (expand 2), state 64, one B/C group
        return transformers.Mamba2Config(vocab_size=SHAPE["vocab_size"], hidden_size=576, num_hidden_layers=layers,
                                         num_heads=18, head_dim=64, state_size=64, n_groups=1, expand=2)
    if family == "granite_h":  # Granite 4.0-H's pattern (one attention layer in ten), dense, NoPE
        kinds = ["attention" if i % 10 == 5 else "mamba" for i in range(layers)]
        return transformers.GraniteMoeHybridConfig(**SHAPE, shared_intermediate_size=1536, num_local_experts=0,
                                                   layer_types=kinds, mamba_n_heads=18, mamba_d_head=64,
                                                   mamba_d_state=64, mamba_n_groups=1, mamba_expand=2,
                                                   position_embedding_type="nope")
    if family == "qwen3_5":  # three gated DeltaNet layers per attention layer, 3 key / 6 value heads of 64
        kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        return transformers.Qwen3_5TextConfig(**SHAPE, layer_types=kinds, linear_num_key_heads=3,
                                              linear_num_value_heads=6, linear_key_head_dim=64,
                                              linear_value_head_dim=64)
    if family == "nemotron_h":  # Nemotron-H's blocks: a mixer (attention in one of ten) then a ReLU² MLP, 60 blocks
        blocks = [kind for i in range(layers) for kind in ("*" if i % 10 == 5 else "M", "-")]
        return transformers.NemotronHConfig(**{k: v for k, v in SHAPE.items() if k != "num_hidden_layers"},
                                            hybrid_override_pattern="".join(blocks), mamba_num_heads=18,
                                            mamba_head_dim=64, ssm_state_size=64, n_groups=1)
    if family == "falcon_h1":  # a mixer of 18 heads × 64 beside the attention in every layer
        return transformers.FalconH1Config(**SHAPE, mamba_d_ssm=1152, mamba_n_heads=18, mamba_d_head=64,
                                           mamba_d_state=64, mamba_n_groups=1)
    if family == "mamba":  # Mamba (1): inner 1152, state 16, dt rank 36 — mamba-130m's shape at this width
        return transformers.MambaConfig(vocab_size=SHAPE["vocab_size"], hidden_size=576, num_hidden_layers=layers,
                                        state_size=16, expand=2, time_step_rank=36)
    raise SystemExit(f"unknown family {family}")


def build(family: str, workdir: Path) -> Path:
    folder = workdir / family
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmctl.checkpoint.source import resolve_model

    model = AutoModelForCausalLM.from_config(config(family)).to(torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path)).save_pretrained(folder)
    return folder


def run(folder: Path) -> float:
    command = [sys.executable, "-m", "llmctl", "bench", "offline", str(folder), *WORKLOAD, "--json"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)["llmctl"]["output_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--families", nargs="+", default=["gemma2", "gemma3"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/llmctl-families"))
    args = parser.parse_args()
    names = ["llama", *args.families]
    folders = {name: build(name, args.workdir) for name in names}
    speeds: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.runs):
        for name in names:
            speeds[name].append(run(folders[name]))
    base = statistics.median(speeds["llama"])
    for name in names:
        median = statistics.median(speeds[name])
        runs = ", ".join(f"{s:.0f}" for s in speeds[name])
        print(f"{name:>8}: median {median:6.1f} output tok/s ({median / base:.2f}× the Llama) — runs {runs}")


if __name__ == "__main__":
    main()
