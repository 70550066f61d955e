"""compressed-tensors checkpoints written by the compressed-tensors library itself (the format llm-compressor
saves): a random model's linears get round-to-nearest min-max scales (compressed-tensors' own
`calculate_qparams`), then the library's ModelCompressor packs and saves them with their config — through
llmctl.quant.compressed.round_to_nearest, which `llmctl quantize --scheme fp8-dynamic` runs too."""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch

from helpers.families import PROMPTS
from llmctl import LLM, SamplingParams

TOKENS = 32


def base_model(folder: Path, tokenizer, kv_heads: int = 4) -> Path:
    """A random 2-layer Llama 128 wide: compressed-tensors' presets quantize in groups (and fp8 blocks) of 128."""
    from transformers import LlamaConfig

    from helpers.models import save_random_model

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    return save_random_model(config, folder, tokenizer)


def compressed_checkpoint(base: Path, preset: str, out: Path, tokenizer, dtype: torch.dtype = torch.bfloat16,
                          ignore: tuple[str, ...] = ("lm_head",), group_size: int | None = None) -> Path:
    """`base` quantized with compressed-tensors' preset scheme `preset` (W4A16, W8A16, W8A8, FP8_DYNAMIC,
    FP8_BLOCK, ...; `group_size` overrides a grouped preset's) and saved as compressed-tensors writes it."""
    from llmctl.quant.compressed import round_to_nearest

    round_to_nearest(base, out, preset, dtype, ignore, group_size)
    tokenizer.save_pretrained(str(out))
    return out


def teacher_forced(folder: Path, tokenizer) -> tuple[float, list[float]]:
    """transformers' greedy continuations of PROMPTS fed back as prompts: the share of positions where llmctl's
    most likely next token is transformers', and the gaps between their log-probabilities, smallest first."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    sequences = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            full = hf.generate(ids, do_sample=False, max_new_tokens=TOKENS, min_new_tokens=TOKENS, pad_token_id=0,
                               eos_token_id=None)
            sequences.append((full[0].tolist(), ids.shape[1], hf(full).logits[0, :-1].log_softmax(-1)))
    llm = LLM(str(folder), max_model_len=256)
    outputs = llm.generate([{"prompt_token_ids": tokens} for tokens, _, _ in sequences],
                           SamplingParams(max_tokens=1, prompt_logprobs=1))
    agree, total, gaps = 0, 0, []
    for (tokens, start, reference), output in zip(sequences, outputs):
        for i in range(start - 1, len(tokens) - 1):
            entry = output.prompt_logprobs[i + 1]
            ours = max(entry.top.items(), key=lambda item: item[1])[0] if entry.top else entry.token_id
            agree += ours == int(reference[i].argmax())
            total += 1
            gaps.append(abs(entry.logprob - float(reference[i, tokens[i + 1]])))
    return agree / total, sorted(gaps)


def decoded_agreement(folder: Path, tokenizer) -> tuple[float, list[float]]:
    """llmctl's greedy continuations of PROMPTS, made by its decode steps, checked by transformers: the share of
    generated tokens that are transformers' most likely next token after the same prefix, and the gaps between
    the two log-probabilities of each, smallest first."""
    from transformers import AutoModelForCausalLM

    outputs = LLM(str(folder), max_model_len=256).generate(
        PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True, logprobs=0))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    agree, gaps = 0, []
    for prompt, output in zip(PROMPTS, outputs):
        ids, made = tokenizer(prompt).input_ids, output.outputs[0]
        with torch.no_grad():
            reference = hf(torch.tensor([ids + made.token_ids])).logits[0].log_softmax(-1)
        for j, entry in enumerate(made.logprobs or []):
            position = len(ids) - 1 + j
            agree += entry.token_id == int(reference[position].argmax())
            gaps.append(abs(entry.logprob - float(reference[position, entry.token_id])))
    return agree / (len(PROMPTS) * TOKENS), sorted(gaps)


def fp8_block_checkpoint(base: Path, out: Path, block: int = 32) -> Path:
    """`base` with every projection in transformers' FineGrainedFP8 format (weight float8_e4m3fn,
    weight_scale_inv per block), quantized by transformers' own Fp8Quantize."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    shutil.copytree(base, out)
    quantize = Fp8Quantize(types.SimpleNamespace(quantization_config=FineGrainedFP8Config(
        weight_block_size=(block, block))))
    tensors = load_file(out / "model.safetensors")
    converted: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        converted.update(quantize.convert({name: tensor}) if name.endswith("proj.weight") else {name: tensor})
    save_file(converted, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [block, block],
                                     "activation_scheme": "dynamic", "fmt": "e4m3"}
    (out / "config.json").write_text(json.dumps(config))
    return out
